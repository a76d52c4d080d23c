#!/bin/sh
# Runs once, when the database volume is first initialised: a read-only role for
# Grafana's data source, its password from the grafana_db_password secret. Its
# sessions are read-only and run without JIT compilation, as `gpufleet db reader`
# sets a role up (gpufleet/db/reader.py says why).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v pw="$(cat /run/secrets/grafana_db_password)" <<'SQL'
CREATE ROLE grafana_ro LOGIN PASSWORD :'pw';
GRANT pg_read_all_data TO grafana_ro;
ALTER ROLE grafana_ro SET default_transaction_read_only = on;
ALTER ROLE grafana_ro SET jit = off;
SQL
