#!/usr/bin/env bash
# Debian packages some tests drive for real: promtool and the Prometheus server (prometheus: remote write
# into the collector, tests/collector/test_remote_write_prometheus.py), VictoriaMetrics (victoria-metrics:
# the third side of bench/vs_prometheus.py), PostgreSQL 15's server binaries (a primary and its hot
# standby of the tests' own, tests/db/test_read_replica.py), Alertmanager,
# Chromium, kubectl (kustomize of the manifests) and systemd-analyze (unit files).  Installed only when missing,
# and only where apt-get can run as root; `make test` then requires them (tests/system_tools.py), a bare
# pytest elsewhere skips those tests naming the package.
set -u
need=()
{ command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; } || need+=(prometheus)
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)
[ -x /usr/lib/postgresql/15/bin/pg_basebackup ] || need+=(postgresql-15)
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: not installing ${need[*]} (needs root and apt-get); tests using them will say so" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
  apt-get update -qq >/dev/null 2>&1
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
    echo "note: could not install ${need[*]}; tests using them will say so" >&2
}
exit 0
