"""finance-grade accounting: dated site settings, declared GPU sharing, accounting in SQL

* ``site_settings``: PUE, energy price, GPU-hour price (per GPU model where
  given), carbon region and carbon constant as step series per site, each
  value holding from ``valid_from`` until the next one (``-infinity``: from
  the beginning).  A change takes effect from a time, so accounting of the
  past never moves unless a change is dated back on purpose.  The values of
  ``sites`` become the ``-infinity`` points and leave that table (it keeps
  the site and its currency); time-of-use prices (``site_prices``) become
  points of the ``price_per_kwh`` series.
* ``run_allocations`` gains declared sharing: ``sharing`` (``exclusive``,
  ``time_slice``, ``mps``, ``mig``), ``share`` of the GPU (1 for exclusive;
  a MIG instance's compute slices over the GPU's), and for MIG the
  ``mig_profile`` and ``mig_instance``.  The one-run-per-GPU triggers of
  0003 now allow runs to overlap on a GPU only when every one of them
  declares sharing of one kind, the shares at no instant add up to more
  than the whole GPU and no MIG instance is held twice; the refusal still
  names the other run, the node and the GPU.
* Accounting as SQL functions (``gpufleet.db.accounting_sql``), read by the
  API and the Grafana energy board alike.

Everything here touches ordinary tables and functions, identical on plain
PostgreSQL and TimescaleDB.

It runs after 0008 (the last of 0005, 0009, 0006, 0008): the accounting
reads ``gpu_energy_spans`` (0009), and allocations of inferred runs (0005)
take the default sharing (``exclusive``, share 1).

Revision ID: 0004
Revises: 0008
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

from gpufleet.db import sql_files

revision: str = "0004"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: pg_advisory_xact_lock key serializing allocation checks (as 0003).
ALLOCATION_LOCK = 0x67707566616C6C6F

SETTINGS_TABLE = """
CREATE TABLE site_settings (
  site text NOT NULL REFERENCES sites (site) ON DELETE CASCADE,
  setting text NOT NULL,
  gpu_model text NOT NULL DEFAULT '',
  valid_from timestamptz NOT NULL,
  num double precision,
  txt text,
  set_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT site_settings_pkey PRIMARY KEY (site, setting, gpu_model, valid_from),
  CONSTRAINT site_settings_setting CHECK (setting IN ('pue', 'price_per_kwh', 'gpu_hour_price', 'carbon_region',
                                                     'carbon_g_per_kwh')),
  CONSTRAINT site_settings_model_price CHECK (gpu_model = '' OR setting = 'gpu_hour_price'),
  CONSTRAINT site_settings_values CHECK (
    CASE setting
      WHEN 'pue' THEN num IS NOT NULL AND num >= 1 AND num <= 5 AND txt IS NULL
      WHEN 'price_per_kwh' THEN num IS NOT NULL AND num >= 0 AND txt IS NULL
      WHEN 'gpu_hour_price' THEN (num IS NOT NULL OR gpu_model <> '') AND (num IS NULL OR num >= 0) AND txt IS NULL
      WHEN 'carbon_g_per_kwh' THEN (num IS NULL OR (num >= 0 AND num <= 5000)) AND txt IS NULL
      WHEN 'carbon_region' THEN num IS NULL
    END)
)"""

MOVE_SITES = """
INSERT INTO site_settings (site, setting, valid_from, num, txt)
SELECT s.site, v.setting, '-infinity', v.num, v.txt FROM sites s CROSS JOIN LATERAL (VALUES
  ('pue', s.pue, NULL::text), ('price_per_kwh', s.price_per_kwh, NULL), ('gpu_hour_price', s.gpu_hour_price, NULL),
  ('carbon_region', NULL::float8, s.carbon_region), ('carbon_g_per_kwh', s.carbon_g_per_kwh, NULL)) v(setting, num, txt);
INSERT INTO site_settings (site, setting, valid_from, num)
SELECT site, 'price_per_kwh', time, price_per_kwh FROM site_prices
ON CONFLICT (site, setting, gpu_model, valid_from) DO UPDATE SET num = EXCLUDED.num
"""

ALLOCATION_COLUMNS = """
ALTER TABLE run_allocations
  ADD COLUMN sharing text NOT NULL DEFAULT 'exclusive',
  ADD COLUMN share double precision NOT NULL DEFAULT 1,
  ADD COLUMN mig_profile text,
  ADD COLUMN mig_instance smallint,
  ADD CONSTRAINT run_allocations_sharing CHECK (sharing IN ('exclusive', 'time_slice', 'mps', 'mig')),
  ADD CONSTRAINT run_allocations_share CHECK (share > 0 AND share <= 1 AND (sharing <> 'exclusive' OR share = 1)),
  ADD CONSTRAINT run_allocations_mig CHECK ((sharing = 'mig') = (mig_profile IS NOT NULL AND mig_instance IS NOT NULL))
"""

_TS = """to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""
_WINDOW = "CASE WHEN {e} IS NULL THEN '(still running)' ELSE 'to ' || " + _TS.format("{e}") + " END"

CONFLICT_FUNCTIONS = f"""
CREATE FUNCTION gpufleet_allocation_conflict(p_run text, p_node text, p_gpu integer, p_start timestamptz,
                                             p_end timestamptz, p_sharing text, p_share double precision,
                                             p_mig_instance integer) RETURNS text
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  o record;
  t timestamptz;
  total double precision;
BEGIN
  FOR o IN
    SELECT r.run_id, r.start, r."end", a.sharing, a.share, a.mig_instance
    FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
    WHERE a.node = p_node AND a.gpu = p_gpu AND a.run_id <> p_run
      AND tstzrange(r.start, r."end", '[)') && tstzrange(p_start, p_end, '[)')
    ORDER BY r.start, r.run_id
  LOOP
    IF p_sharing = 'exclusive' OR o.sharing = 'exclusive' THEN
      RETURN format('GPU %s:%s is held by run %s from %s %s; run %s from %s %s would overlap it',
                    p_node, p_gpu, quote_literal(o.run_id), {_TS.format("o.start")}, {_WINDOW.format(e='o."end"')},
                    quote_literal(p_run), {_TS.format("p_start")},
                    CASE WHEN p_end IS NULL THEN '(open-ended)' ELSE 'to ' || {_TS.format("p_end")} END)
        || CASE WHEN p_sharing <> 'exclusive' THEN format(' (run %s holds it exclusively)', quote_literal(o.run_id))
                WHEN o.sharing <> 'exclusive' THEN format(' (it is shared by %s: declare sharing to join)', o.sharing)
                ELSE '' END;
    END IF;
    IF (p_sharing = 'mig') <> (o.sharing = 'mig') THEN
      RETURN format('GPU %s:%s is held by run %s as %s from %s; run %s cannot hold it as %s at the same time '
                    '(MIG instances and whole-GPU sharing do not mix)', p_node, p_gpu, quote_literal(o.run_id),
                    o.sharing, {_TS.format("o.start")}, quote_literal(p_run), p_sharing);
    END IF;
    IF p_sharing = 'mig' AND o.mig_instance = p_mig_instance THEN
      RETURN format('MIG instance %s of GPU %s:%s is held by run %s from %s %s; run %s would overlap it',
                    p_mig_instance, p_node, p_gpu, quote_literal(o.run_id), {_TS.format("o.start")},
                    {_WINDOW.format(e='o."end"')}, quote_literal(p_run));
    END IF;
  END LOOP;
  -- the shares held at once are largest at the start of one of the overlapping windows
  FOR t IN
    SELECT greatest(r.start, p_start) FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
    WHERE a.node = p_node AND a.gpu = p_gpu AND a.run_id <> p_run
      AND tstzrange(r.start, r."end", '[)') && tstzrange(p_start, p_end, '[)')
    UNION SELECT p_start
  LOOP
    SELECT p_share + coalesce(sum(a.share), 0) INTO total
    FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
    WHERE a.node = p_node AND a.gpu = p_gpu AND a.run_id <> p_run
      AND r.start <= t AND (r."end" IS NULL OR r."end" > t);
    IF total > 1.000000001 THEN
      RETURN format('GPU %s:%s would be shared beyond the whole GPU at %s: run %s asks for share %s while runs %s '
                    'hold %s', p_node, p_gpu, {_TS.format("t")}, quote_literal(p_run), round(p_share::numeric, 4),
                    (SELECT string_agg(quote_literal(a.run_id), ', ' ORDER BY a.run_id)
                     FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
                     WHERE a.node = p_node AND a.gpu = p_gpu AND a.run_id <> p_run
                       AND r.start <= t AND (r."end" IS NULL OR r."end" > t)),
                    round((total - p_share)::numeric, 4));
    END IF;
  END LOOP;
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION gpufleet_check_allocation() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  r record;
  msg text;
BEGIN
  PERFORM pg_advisory_xact_lock({ALLOCATION_LOCK});
  SELECT start, "end" INTO r FROM runs WHERE run_id = NEW.run_id;
  msg := gpufleet_allocation_conflict(NEW.run_id, NEW.node, NEW.gpu, r.start, r."end", NEW.sharing, NEW.share,
                                      NEW.mig_instance);
  IF msg IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'exclusion_violation', MESSAGE = msg;
  END IF;
  RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION gpufleet_check_run_window() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  a record;
  msg text;
BEGIN
  PERFORM pg_advisory_xact_lock({ALLOCATION_LOCK});
  FOR a IN SELECT node, gpu, sharing, share, mig_instance FROM run_allocations WHERE run_id = NEW.run_id
           ORDER BY node, gpu LOOP
    msg := gpufleet_allocation_conflict(NEW.run_id, a.node, a.gpu, NEW.start, NEW."end", a.sharing, a.share,
                                        a.mig_instance);
    IF msg IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'exclusion_violation', MESSAGE = msg;
    END IF;
  END LOOP;
  RETURN NULL;
END
$fn$;
"""

#: The accounting's type and functions (gpufleet/db/sql, rendered from ``gpufleet.db.accounting_sql``), in order.
_ACCOUNTING = (
    "gpufleet_claim.v1",
    "gpufleet_minor_units.v1",
    "gpufleet_claim_energy.v1",
    "gpufleet_site_periods.v1",
    "gpufleet_energy_rates.v1",
    "gpufleet_gpu_hour_prices.v1",
    "gpufleet_accounting.v1",
)


def _statements(sql: str) -> list[str]:
    """Split on CREATE statements (function bodies contain ';')."""
    out: list[str] = []
    cur: list[str] = []
    for line in sql.strip().splitlines():
        if line.startswith("CREATE ") and cur:
            out.append("\n".join(cur).strip().rstrip(";"))
            cur = []
        cur.append(line)
    if cur:
        out.append("\n".join(cur).strip().rstrip(";"))
    return out


def upgrade() -> None:
    op.execute(SETTINGS_TABLE)
    for stmt in MOVE_SITES.strip().split(";\n"):
        op.execute(stmt)
    op.execute("DROP TABLE site_prices")
    op.execute(
        "ALTER TABLE sites DROP CONSTRAINT sites_pue_ge_1, DROP CONSTRAINT sites_prices_nonneg, "
        "DROP COLUMN pue, DROP COLUMN price_per_kwh, DROP COLUMN gpu_hour_price, DROP COLUMN carbon_region, "
        "DROP COLUMN carbon_g_per_kwh"
    )
    op.execute(ALLOCATION_COLUMNS)
    op.execute("DROP FUNCTION gpufleet_allocation_conflict(text, text, integer, timestamptz, timestamptz)")
    for stmt in _statements(CONFLICT_FUNCTIONS):
        op.execute(stmt)
    for name in _ACCOUNTING:
        op.execute(sql_files.text(name))


def _revision_0003() -> object:
    path = Path(__file__).with_name("0003_one_run_per_gpu.py")
    spec = importlib.util.spec_from_file_location("gpufleet_migration_0003", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    for stmt in sql_files.statements("0004_finance_accounting.downgrade"):
        op.execute(stmt)
    op.execute(
        "DROP FUNCTION gpufleet_allocation_conflict(text, text, integer, timestamptz, timestamptz, text, "
        "double precision, integer)"
    )
    old = _revision_0003()
    for stmt in old._statements(old.FUNCTIONS):  # type: ignore[attr-defined]
        if stmt.startswith("CREATE FUNCTION"):
            op.execute(stmt.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(
        "ALTER TABLE run_allocations DROP CONSTRAINT run_allocations_mig, DROP CONSTRAINT run_allocations_share, "
        "DROP CONSTRAINT run_allocations_sharing, DROP COLUMN mig_instance, DROP COLUMN mig_profile, "
        "DROP COLUMN share, DROP COLUMN sharing"
    )
    op.execute(
        "ALTER TABLE sites ADD COLUMN pue double precision NOT NULL DEFAULT 1.0, "
        "ADD COLUMN price_per_kwh double precision NOT NULL DEFAULT 0, "
        "ADD COLUMN gpu_hour_price double precision NOT NULL DEFAULT 0, ADD COLUMN carbon_region text, "
        "ADD COLUMN carbon_g_per_kwh double precision, "
        "ADD CONSTRAINT sites_pue_ge_1 CHECK (pue >= 1.0), "
        "ADD CONSTRAINT sites_prices_nonneg CHECK (price_per_kwh >= 0 AND gpu_hour_price >= 0)"
    )
    # the values in force now (the dated history has no place in the old layout)
    op.execute("""
UPDATE sites s SET
  pue = coalesce((SELECT num FROM site_settings x WHERE x.site = s.site AND x.setting = 'pue' AND x.gpu_model = ''
                  AND x.valid_from <= now() ORDER BY x.valid_from DESC LIMIT 1), 1.0),
  price_per_kwh = coalesce((SELECT num FROM site_settings x WHERE x.site = s.site AND x.setting = 'price_per_kwh'
                            AND x.valid_from = '-infinity'), 0),
  gpu_hour_price = coalesce((SELECT num FROM site_settings x WHERE x.site = s.site AND x.setting = 'gpu_hour_price'
                             AND x.gpu_model = '' AND x.valid_from <= now() ORDER BY x.valid_from DESC LIMIT 1), 0),
  carbon_region = (SELECT txt FROM site_settings x WHERE x.site = s.site AND x.setting = 'carbon_region'
                   AND x.valid_from <= now() ORDER BY x.valid_from DESC LIMIT 1),
  carbon_g_per_kwh = (SELECT num FROM site_settings x WHERE x.site = s.site AND x.setting = 'carbon_g_per_kwh'
                      AND x.valid_from <= now() ORDER BY x.valid_from DESC LIMIT 1)""")
    op.execute("""
CREATE TABLE site_prices (
  site text NOT NULL REFERENCES sites (site) ON DELETE CASCADE,
  time timestamptz NOT NULL,
  price_per_kwh double precision NOT NULL,
  CONSTRAINT site_prices_pkey PRIMARY KEY (site, time),
  CONSTRAINT site_prices_nonneg CHECK (price_per_kwh >= 0)
)""")
    op.execute(
        "INSERT INTO site_prices (site, time, price_per_kwh) SELECT site, valid_from, num FROM site_settings "
        "WHERE setting = 'price_per_kwh' AND valid_from > '-infinity'"
    )
    op.execute("DROP TABLE site_settings")
