#!/usr/bin/env bash
# A scratch TimescaleDB 2.x server for the TimescaleDB checks, built from a
# TimescaleDB source tree (the extension is on neither PyPI nor Debian).
#
#   tools/timescale-server.sh SRC_DIR [PORT]     build, install, start (default port 5433)
#   tools/timescale-server.sh --stop [PORT]
#
# It builds SRC_DIR against the machine's PostgreSQL (pg_config; Debian
# package postgresql-server-dev-<major>), installs the extension into that
# PostgreSQL's library directory, and starts a separate cluster of its own
# under /var/tmp/gpufleet-timescale-<port> with timescaledb preloaded, so the
# machine's own server is never restarted or reconfigured. Then:
#
#   GPUFLEET_TEST_TIMESCALE_URL=postgresql://postgres@127.0.0.1:5433/postgres make test
#
# runs the TimescaleDB layout checks too, and with GPUFLEET_TEST_DATABASE_URL
# set to the same URL every database test runs on the TimescaleDB layout.
# TimescaleDB 2.28 is the last release that builds against PostgreSQL 15.
set -euo pipefail

if [[ "${1:-}" == "--stop" ]]; then
  port="${2:-5433}"
  dir="/var/tmp/gpufleet-timescale-${port}"
  bindir="$(pg_config --bindir)"
  su postgres -c "${bindir}/pg_ctl -D ${dir}/data stop -m fast"
  exit 0
fi

src="${1:?usage: tools/timescale-server.sh SRC_DIR [PORT] | --stop [PORT]}"
port="${2:-5433}"
dir="/var/tmp/gpufleet-timescale-${port}"
bindir="$(pg_config --bindir)"
[[ -f "${src}/bootstrap" ]] || { echo "${src}: not a TimescaleDB source tree (no bootstrap)" >&2; exit 2; }
command -v cmake >/dev/null || { echo "cmake is needed to build TimescaleDB" >&2; exit 2; }

if [[ ! -f "${src}/build/.gpufleet-installed" ]]; then
  (cd "${src}" && ./bootstrap -DREGRESS_CHECKS=OFF -DTAP_CHECKS=OFF -DWARNINGS_AS_ERRORS=OFF \
      -DUSE_TELEMETRY=OFF -DCMAKE_BUILD_TYPE=Release)
  make -C "${src}/build" -j"$(nproc)"
  make -C "${src}/build" install
  touch "${src}/build/.gpufleet-installed"
fi

if [[ ! -d "${dir}/data" ]]; then
  mkdir -p "${dir}"
  chown postgres "${dir}"
  su postgres -c "${bindir}/initdb -D ${dir}/data -A trust -U postgres" >/dev/null
  cat >>"${dir}/data/postgresql.conf" <<EOF
port = ${port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '${dir}'
shared_preload_libraries = 'timescaledb'
timescaledb.telemetry_level = off
max_connections = 200
EOF
fi
su postgres -c "${bindir}/pg_ctl -D ${dir}/data -l ${dir}/log -w start"
echo "GPUFLEET_TEST_TIMESCALE_URL=postgresql://postgres@127.0.0.1:${port}/postgres"
