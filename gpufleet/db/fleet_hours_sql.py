"""The fleet's accounting kept per closed hour, and the marks that say when an hour no longer holds.

Every fleet-wide read (the fleet board's "Energy today", ``/v1/accounting``, the finance and FOCUS
reports, the waste view) is one call of ``gpufleet_accounting`` over the whole fleet, and that call
priced every GPU's time of the period again for every reader: a day of 10,000 GPUs took 4 to 6 s, a
month ran past any statement limit.  An hour that has closed gives the same lines to every later
reader while its inputs are unchanged, so they are kept:

* ``gpufleet_fleet_parts(from, to, ..., detail)`` is the fleet query of ``gpufleet_accounting`` (V7)
  with detail ``step`` of one hour (each hour's lines, to keep) or ``line`` (the lines of a gap),
  unrounded, with what the line-level labels need (the least and greatest price, intensity and
  carbon source its energy was priced at), so hours add up to a period as the period's own query
  adds its segments, to the precision of the double-precision sums.
* The collector's leader keeps the parts of closed hours (``fleet_hours_kept``, one row an hour with
  the marks it rests on; ``fleet_hour_lines``, its lines), newest first
  (:mod:`gpufleet.accounting.fleet_hours`).
* ``gpufleet_accounting_kept(from, to, ...)`` answers a fleet-wide line-detail call: the kept hours
  that still hold, the rest (the period's partial first and last hours, hours not kept or no longer
  holding) priced live by ``gpufleet_fleet_parts`` in as few calls as there are gaps, summed per
  line and rounded and labelled by the very text of ``gpufleet_accounting``'s own last step.

An hour's lines rest on two marks of ``pricing_marks`` (:mod:`gpufleet.db.priced_store_sql`):
``h:<YYYY-MM-DDTHH>`` (UTC), moved by any change to what that hour reads, and ``h``, moved by a
change to what every hour reads.  Each input moves the hours it changes, in the changing
transaction:

* samples and rollups: the rollup worker, for the hours from each node's rebuilt range's previous
  sample to now (a GPU heard again after a silence moves the hours of the silence, whose membership
  it changes; a GPU's last sample decides when it leaves the fleet, ``gone_after_s`` later, an hour
  no mark can name without the reader's setting, so to now);
* ``runs``: inserted or deleted, the hours of its window (to now for a running run); its start
  moved, the hours between the old and the new; its end moved, the hours from the earlier of the two
  to now (the GPUs it held stay in the fleet ``gone_after_s`` past it; ending a month-long run now
  moves the hour it ends in, not the month); its site or id changed, from its start to now;
* ``run_allocations``: the hours from the run's start (or, if earlier, the GPU's last sign of life
  before it: its node's registration, its last sample, energy hour or run) to now: a run on a GPU
  that had not joined yet, or had left, puts it in the fleet from then on; marked once per statement
  from its earliest row (a backfill of thousands of allocations is one mark of each hour);
* ``nodes``: a new node, the hours from its registration; a node's site or GPU count changed, or a
  node removed, every hour (``h``: rare, and not dated); its facts changed, while it has no dated
  ones, the hours from its first run or registration;
* ``node_facts_history``: the hours from the change (from the node's first run or registration for
  its first facts, which hold back to then);
* ``site_settings``: the hours from the setting's start (every hour for one from the beginning);
  ``sites``: every hour;
* ``carbon_intensity``: the hours from the point to the region's next (to now for its last); every
  hour for a point before the region's first, which is carried back.

A change reaching more than :data:`HOUR_MARKS` hours moves ``h`` instead of marking each.  The
reader also leaves to the live query every hour ending within ``max_gap_s`` plus a minute of the
earliest range still queued for the rollup worker (the query would read raw samples there).

What the marks do not see, and so where a kept hour can differ from the live query: a node whose
GPU count is unknown shares its host's energy by the GPUs that reported in the priced call's span
(an hour, or the hours priced together) rather than in the reader's whole period.
"""

from __future__ import annotations

from gpufleet.db import energy_sql as E
from gpufleet.db import priced_store_sql as P
from gpufleet.db.accounting_fleet_sql import swapped
from gpufleet.db.accounting_members_sql import ACCOUNTING_V7

#: The most hours one change marks one by one; a change reaching further moves ``h``.
HOUR_MARKS = 1000


def hour_scope(t: str) -> str:
    """The mark of the hour holding ``t`` (an SQL expression): ``h:YYYY-MM-DDTHH``, UTC."""
    return f"'h:' || to_char({t} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24')"


#: The marks of a change over [lo, hi]: each hour's from lo's to hi's, or ``h`` for a long one.
HOUR_SCOPES_V1 = f"""
CREATE FUNCTION gpufleet_fleet_hour_scopes(p_lo timestamptz, p_hi timestamptz) RETURNS text[]
LANGUAGE sql STABLE AS $fn$
  SELECT CASE
    WHEN p_lo IS NULL OR p_hi IS NULL OR p_lo = '-infinity' OR p_hi = 'infinity' THEN ARRAY['h']
    WHEN p_hi < p_lo THEN gpufleet_fleet_hour_scopes(p_hi, p_lo)
    WHEN p_hi - p_lo > INTERVAL '{HOUR_MARKS} hours' THEN ARRAY['h']
    ELSE ARRAY(SELECT {hour_scope("h")}
               FROM generate_series(date_bin(INTERVAL '1 hour', p_lo, {E.ORIGIN}), p_hi, INTERVAL '1 hour') h)
  END
$fn$
"""


def _trigger(name: str, table: str, events: str, when: str, body: str) -> tuple[str, str]:
    return P.row_trigger(f"gpufleet_fleet_hours_mark_{name}", table, events, when, body)


_RUN_END = 'greatest(r.start, coalesce(r."end", now()))'

#: The first hour a change of allocation ``r`` (of run ``w``) reaches: the run's start, or the GPU's
#: last sign of life before it when that is earlier.
_ALLOCATION_FROM = (
    "least(w.start, coalesce(greatest(\n"
    "      (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),\n"
    "      (SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = r.gpu AND s.time < w.start\n"
    "       ORDER BY s.time DESC LIMIT 1),\n"
    "      (SELECT max(e.bucket) FROM gpu_energy_1h e WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket < w.start),\n"
    '      (SELECT max(coalesce(o."end", now())) FROM run_allocations a JOIN runs o ON o.run_id = a.run_id\n'
    "       WHERE a.node = r.node AND a.gpu = r.gpu AND o.start < w.start)), w.start))"
)

#: (name, table, events, WHEN, body)
_TRIGGERS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "runs_new",
        "runs",
        "INSERT OR DELETE",
        "",
        P.each_row(f"gpufleet_fleet_hour_scopes(r.start, {_RUN_END})"),
    ),
    (
        "runs_moved",
        "runs",
        "UPDATE",
        'OLD.start IS DISTINCT FROM NEW.start OR OLD."end" IS DISTINCT FROM NEW."end" '
        "OR OLD.site IS DISTINCT FROM NEW.site OR OLD.run_id IS DISTINCT FROM NEW.run_id",
        "  IF OLD.site IS DISTINCT FROM NEW.site OR OLD.run_id IS DISTINCT FROM NEW.run_id THEN\n"
        "    PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(least(OLD.start, NEW.start), now()));\n"
        "  ELSE\n"
        "    IF OLD.start IS DISTINCT FROM NEW.start THEN\n"
        "      PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(OLD.start, NEW.start));\n"
        "    END IF;\n"
        '    IF OLD."end" IS DISTINCT FROM NEW."end" THEN\n'
        "      PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(\n"
        '        least(coalesce(OLD."end", now()), coalesce(NEW."end", now())), now()));\n'
        "    END IF;\n"
        "  END IF;",
    ),
    (
        "run_allocations",
        "run_allocations",
        "INSERT OR UPDATE OR DELETE",
        "",
        P.each_row(
            f"(SELECT gpufleet_fleet_hour_scopes({_ALLOCATION_FROM}, now())\n     FROM runs w WHERE w.run_id = r.run_id)"
        ),
    ),
    (
        "nodes_new",
        "nodes",
        "INSERT",
        "",
        "  r := NEW;\n  PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(r.first_seen, now()));",
    ),
    (
        "nodes_changed",
        "nodes",
        "UPDATE",
        "OLD.site IS DISTINCT FROM NEW.site OR OLD.gpu_count IS DISTINCT FROM NEW.gpu_count "
        "OR OLD.node IS DISTINCT FROM NEW.node",
        "  PERFORM gpufleet_pricing_bump(ARRAY['h']);",
    ),
    (
        "nodes_facts",
        "nodes",
        "UPDATE",
        "OLD.facts IS DISTINCT FROM NEW.facts",
        "  -- the node's facts price its runs only while it has no dated ones (gpufleet_node_facts_at)\n"
        "  IF NOT EXISTS (SELECT 1 FROM node_facts_history h WHERE h.node = NEW.node) THEN\n"
        "    PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(least(NEW.first_seen,\n"
        "      (SELECT min(w.start) FROM run_allocations a JOIN runs w ON w.run_id = a.run_id WHERE a.node = NEW.node)),\n"
        "      now()));\n"
        "  END IF;",
    ),
    ("nodes_gone", "nodes", "DELETE", "", "  PERFORM gpufleet_pricing_bump(ARRAY['h']);"),
    (
        "node_facts_history",
        "node_facts_history",
        "INSERT OR UPDATE OR DELETE",
        "",
        P.each_row(
            "gpufleet_fleet_hour_scopes(CASE WHEN EXISTS (SELECT 1 FROM node_facts_history h\n"
            "      WHERE h.node = r.node AND h.valid_from < r.valid_from) THEN r.valid_from\n"
            "    ELSE least(r.valid_from, (SELECT n.first_seen FROM nodes n WHERE n.node = r.node),\n"
            "               (SELECT min(w.start) FROM run_allocations a JOIN runs w ON w.run_id = a.run_id\n"
            "                WHERE a.node = r.node)) END, now())"
        ),
    ),
    (
        "site_settings",
        "site_settings",
        "INSERT OR UPDATE OR DELETE",
        "",
        P.each_row("gpufleet_fleet_hour_scopes(r.valid_from, now())"),
    ),
    ("sites", "sites", "UPDATE OR DELETE", "", "  PERFORM gpufleet_pricing_bump(ARRAY['h']);"),
    (
        "carbon",
        "carbon_intensity",
        "INSERT OR UPDATE OR DELETE",
        "",
        P.each_row(
            "CASE WHEN NOT EXISTS (SELECT 1 FROM carbon_intensity c WHERE c.region = r.region AND c.time < r.time)\n"
            "    THEN ARRAY['h']\n"
            "    ELSE gpufleet_fleet_hour_scopes(r.time, coalesce((SELECT min(c.time) FROM carbon_intensity c\n"
            "      WHERE c.region = r.region AND c.time > r.time), greatest(r.time, now()))) END"
        ),
    ),
)

_PAIRS = [_trigger(*t) for t in _TRIGGERS]
#: (rendered file name, function text) of each trigger function, in the order of their triggers.
TRIGGER_FUNCTIONS: tuple[tuple[str, str], ...] = tuple(
    (f"gpufleet_fleet_hours_mark_{t[0]}.v1", f) for t, (f, _) in zip(_TRIGGERS, _PAIRS, strict=True)
)
TRIGGERS_V1: tuple[str, ...] = tuple(trig for _, trig in _PAIRS)
DROP_V1: tuple[str, ...] = tuple(
    s
    for name, table, *_ in _TRIGGERS
    for s in (
        f"DROP TRIGGER IF EXISTS gpufleet_fleet_hours_mark_{name} ON {table}",
        f"DROP FUNCTION IF EXISTS gpufleet_fleet_hours_mark_{name}()",
    )
)

#: Migration 0031: allocations mark per statement, not per row.  Every row's hours run to now, so a
#: statement's hours are those from its earliest row's first hour, marked once; a row whose run is
#: gone moves every hour, as it did alone.  Marked row by row, a backfilled 64-GPU run started a month
#: ago marked 720 hours 64 times, and a COPY of 512 such rows took 56.5 s (0.060 s now:
#: ``python bench/register_runs.py --runs 2,8,16,64``).
_ALLOCATION_ROWS = {
    "INSERT": "gpufleet_new",
    "DELETE": "gpufleet_old",
    "UPDATE": "(SELECT run_id, node, gpu FROM gpufleet_old UNION ALL SELECT run_id, node, gpu FROM gpufleet_new) c",
}
ALLOCATIONS_V2 = (
    """
CREATE FUNCTION gpufleet_fleet_hours_mark_allocations() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE v_run text[]; v_node text[]; v_gpu smallint[];
BEGIN
  -- each event sees only its own transition tables
"""
    + "".join(
        f"  {'IF' if i == 0 else 'ELSIF'} TG_OP = '{op}' THEN\n"
        f"    SELECT array_agg(run_id), array_agg(node), array_agg(gpu) INTO v_run, v_node, v_gpu FROM {rows};\n"
        for i, (op, rows) in enumerate(_ALLOCATION_ROWS.items())
    )
    + f"""  END IF;
  PERFORM gpufleet_pricing_bump(gpufleet_fleet_hour_scopes(
    CASE WHEN bool_and(x.lo IS NOT NULL) THEN min(x.lo) END, now()))
  FROM (SELECT (SELECT {_ALLOCATION_FROM}
    FROM runs w WHERE w.run_id = r.run_id) AS lo
    FROM unnest(v_run, v_node, v_gpu) r(run_id, node, gpu)) x
  HAVING count(*) > 0;
  RETURN NULL;
END
$fn$
"""
)
_TRANSITIONS = {
    "INSERT": "NEW TABLE AS gpufleet_new",
    "DELETE": "OLD TABLE AS gpufleet_old",
    "UPDATE": "OLD TABLE AS gpufleet_old NEW TABLE AS gpufleet_new",
}
#: Migration 0031's steps around ``ALLOCATIONS_V2``: the row trigger's drops, then the statement triggers.
ALLOCATION_TRIGGERS_V2: tuple[str, ...] = (
    "DROP TRIGGER IF EXISTS gpufleet_fleet_hours_mark_run_allocations ON run_allocations",
    "DROP FUNCTION IF EXISTS gpufleet_fleet_hours_mark_run_allocations()",
    *(
        f"CREATE TRIGGER gpufleet_fleet_hours_mark_allocations_{op.lower()} AFTER {op} ON run_allocations "
        f"REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION gpufleet_fleet_hours_mark_allocations()"
        for op, tables in _TRANSITIONS.items()
    ),
)
DROP_ALLOCATIONS_V2: tuple[str, ...] = (
    *(
        f"DROP TRIGGER IF EXISTS gpufleet_fleet_hours_mark_allocations_{op.lower()} ON run_allocations"
        for op in _TRANSITIONS
    ),
    "DROP FUNCTION IF EXISTS gpufleet_fleet_hours_mark_allocations()",
)
#: What the rollup worker bumps after rebuilding: the priced store's node days, and the fleet's hours
#: from each node's rebuilt range's previous sample to now.
BUMP_REBUILT_V2 = P.bump_rebuilt("gpufleet_fleet_hour_scopes(x.a, greatest(x.z, now()))")


# ------------------------------------------------------------------------------------ the hourly parts

_FLEET_HEAD = "ELSIF p_fleet THEN\nRETURN QUERY\n"
_V7_FLEET = ACCOUNTING_V7[ACCOUNTING_V7.index(_FLEET_HEAD) + len(_FLEET_HEAD) :]
_V7_FLEET = _V7_FLEET[: _V7_FLEET.index(";\nELSE\nRETURN QUERY\n")]

#: The accounting's last step: lines_out (each line's currency) and the rounded, labelled lines.
LAST_STEP = _V7_FLEET[_V7_FLEET.index("lines_out AS (\n") :]
#: The accounting's first steps: the period and its runs with their allocations.
FIRST_STEPS = _V7_FLEET[_V7_FLEET.index("win AS (\n") : _V7_FLEET.index("span AS MATERIALIZED (\n")]

_LABELS = (
    "el.price_lo, el.price_hi, el.g_lo, el.g_hi, el.csrc_lo, el.csrc_hi, el.line IS NOT NULL AS has_energy"
)

_PART_SWAPS: tuple[tuple[str, str], ...] = (
    (
        "         count(DISTINCT p.price) AS prices\n",
        "         count(DISTINCT p.price) AS prices, min(p.price) AS price_lo, max(p.price) AS price_hi,\n"
        "         min(p.g) AS g_lo, max(p.g) AS g_hi, min(p.carbon_source) AS csrc_lo, max(p.carbon_source) AS csrc_hi\n",
    ),
    (
        "ELSE 0.0 END) AS ccost, w.lo, rp.cur\n",
        f"ELSE 0.0 END) AS ccost, w.lo, rp.cur,\n         {_LABELS}\n",
    ),
    (
        "ELSE 0.0 END AS ccost, (SELECT f FROM win) AS lo, coalesce(el.cur, fs.cur) AS cur\n",
        f"ELSE 0.0 END AS ccost, (SELECT f FROM win) AS lo, coalesce(el.cur, fs.cur) AS cur,\n         {_LABELS}\n",
    ),
    (LAST_STEP[LAST_STEP.index("SELECT o.line, o.run_id, nullif(o.sk, '')") :], ""),
)

#: One row of kept or live parts: an hour's line, unrounded.
PART_COLUMNS: tuple[tuple[str, str], ...] = (
    ("line", "text"),
    ("run_id", "text"),
    ("sk", "text"),
    ("hour", "timestamptz"),
    ("cur", "text"),
    ("gpu_s", "double precision"),
    ("covered_s", "double precision"),
    ("gpu_kwh", "double precision"),
    ("host_kwh", "double precision"),
    ("facility_kwh", "double precision"),
    ("co2e_kg", "numeric"),
    ("co2e_unknown_kwh", "double precision"),
    ("energy_cost", "numeric"),
    ("compute_cost", "numeric"),
    ("stale", "boolean"),
    ("has_energy", "boolean"),
    ("price_lo", "double precision"),
    ("price_hi", "double precision"),
    ("g_lo", "double precision"),
    ("g_hi", "double precision"),
    ("csrc_lo", "text"),
    ("csrc_hi", "text"),
)

_PART_SELECT = """SELECT o.line, o.run_id, o.sk, o.part, o.cur, o.gpu_s::float8, o.cs::float8, o.gpu_kwh::float8,
  o.host_kwh::float8, o.fac::float8, o.co2e::numeric, o.unknown::float8, o.ecost::numeric, o.ccost::numeric,
  coalesce(o.st, false), o.has_energy, o.price_lo::float8, o.price_hi::float8, o.g_lo::float8, o.g_hi::float8,
  o.csrc_lo, o.csrc_hi
FROM lines_out o
WHERE o.part IS NOT NULL OR p_detail = 'line' AND (o.line <> 'run' OR o.has_energy OR o.cur IS NOT NULL OR o.gpu_s <> 0)"""

_PARTS_TABLE = "RETURNS TABLE (\n  " + ", ".join(f"{c} {t}" for c, t in PART_COLUMNS) + ")"

FLEET_PARTS_V1 = f"""
CREATE FUNCTION gpufleet_fleet_parts(
  p_from timestamptz, p_to timestamptz, p_now timestamptz, p_max_gap_s double precision, p_source text,
  p_gone_after_s double precision, p_detail text)
{_PARTS_TABLE}
LANGUAGE plpgsql STABLE SET jit = off AS $fn$
#variable_conflict use_column
DECLARE
  p_runs text[] := NULL;
  p_fleet boolean := true;
  p_step interval := CASE WHEN p_detail = 'step' THEN INTERVAL '1 hour' END;
BEGIN
RETURN QUERY
{swapped(_V7_FLEET, _PART_SWAPS)}{_PART_SELECT};
END
$fn$
"""

# ------------------------------------------------------------------------------------ the kept reader

#: The marks an hour rests on as they are now: every hour's, and hour ``t``'s (SQL expressions).
WHOLE_MARK = "coalesce((SELECT m.version FROM pricing_marks m WHERE m.scope = 'h'), 0)"


def hour_mark(t: str) -> str:
    return f"coalesce((SELECT m.version FROM pricing_marks m WHERE m.scope = {hour_scope(t)}), 0)"


def holds(k: str, hour: str) -> str:
    """Kept hour ``k`` (a row of ``fleet_hours_kept``) holds: both its marks are still the current ones."""
    return f"{k}.whole_mark = {WHOLE_MARK}\n    AND {k}.hour_mark = {hour_mark(hour)}"


_SUMS = """
  sum(p.gpu_s) AS gpu_s, sum(p.covered_s) AS cs, sum(p.gpu_kwh) AS gpu_kwh, sum(p.host_kwh) AS host_kwh,
  sum(p.facility_kwh) AS fac, sum(p.co2e_kg) AS co2e, sum(p.co2e_unknown_kwh) AS unknown,
  sum(p.energy_cost) AS ecost, sum(p.compute_cost) AS ccost, bool_or(p.stale) AS st,
  CASE WHEN bool_or(p.has_energy) THEN CASE WHEN min(p.csrc_lo) = max(p.csrc_hi) THEN min(p.csrc_lo) ELSE 'mixed' END
  END AS csrc,
  CASE WHEN min(p.price_lo) = max(p.price_hi) THEN min(p.price_lo) END AS one_price,
  CASE WHEN min(p.g_lo) = max(p.g_hi) THEN min(p.g_lo) END AS one_g,
  CASE WHEN bool_or(p.has_energy) THEN CASE WHEN min(p.price_lo) IS NULL THEN 0
                                             WHEN min(p.price_lo) = max(p.price_hi) THEN 1 ELSE 2 END END AS prices"""

_KEPT_QUERY = f"""WITH
{FIRST_STEPS}-- the period's whole hours, the first and last partial ones, and whether each is kept and holds
kept_span AS (
  SELECT min(k.hour) AS k0, max(k.hour) + INTERVAL '1 hour' AS k1 FROM fleet_hours_kept k
  WHERE k.max_gap_s = p_max_gap_s AND k.source = p_source AND k.gone_after_s = p_gone_after_s
),
-- whole hours only where hours are kept at all: a period of centuries is not walked an hour at a time
bounds AS (
  SELECT win.f, win.t, x.hf, greatest(x.hf, x.ht) AS ht,
         (SELECT min(q.t_min) FROM rollup_queue q) - make_interval(secs => p_max_gap_s + 60) AS queued
  FROM win CROSS JOIN kept_span ks
  CROSS JOIN LATERAL (
    SELECT least(win.t, date_bin(INTERVAL '1 hour', win.f - INTERVAL '1 microsecond', {E.ORIGIN}) + INTERVAL '1 hour') AS hf0,
           greatest(win.f, date_bin(INTERVAL '1 hour', win.t, {E.ORIGIN})) AS ht0
  ) w
  CROSS JOIN LATERAL (
    SELECT CASE WHEN ks.k0 IS NULL THEN win.t ELSE least(win.t, greatest(ks.k0, w.hf0)) END AS hf,
           CASE WHEN ks.k0 IS NULL THEN win.t ELSE least(ks.k1, w.ht0) END AS ht
  ) x
),
pieces AS (
  SELECT b.f AS a, b.hf AS b, false AS kept FROM bounds b WHERE b.f < b.hf
  UNION ALL
  SELECT h, h + INTERVAL '1 hour', EXISTS (
    SELECT 1 FROM fleet_hours_kept k
    WHERE k.max_gap_s = p_max_gap_s AND k.source = p_source AND k.gone_after_s = p_gone_after_s AND k.hour = h
      AND (b.queued IS NULL OR h + INTERVAL '1 hour' <= b.queued)
      AND {holds("k", "k.hour")})
  FROM bounds b CROSS JOIN LATERAL generate_series(b.hf, b.ht - INTERVAL '1 hour', INTERVAL '1 hour') h
  WHERE b.hf < b.ht
  UNION ALL
  SELECT greatest(b.ht, b.hf), b.t, false FROM bounds b WHERE greatest(b.ht, b.hf) < b.t
),
-- the pieces not kept, consecutive ones together: each one live call
gaps AS (
  SELECT min(x.a) AS a, max(x.b) AS b FROM (
    SELECT p.a, p.b, p.kept,
           row_number() OVER (ORDER BY p.a) - row_number() OVER (PARTITION BY p.kept ORDER BY p.a) AS grp
    FROM pieces p) x
  WHERE NOT x.kept GROUP BY x.grp
),
parts AS (
  SELECT l.line, l.run_id, l.sk, l.cur, l.gpu_s, l.covered_s, l.gpu_kwh, l.host_kwh, l.facility_kwh, l.co2e_kg,
         l.co2e_unknown_kwh, l.energy_cost, l.compute_cost, l.stale, l.has_energy, l.price_lo, l.price_hi,
         l.g_lo, l.g_hi, l.csrc_lo, l.csrc_hi
  FROM pieces p JOIN fleet_hour_lines l ON l.max_gap_s = p_max_gap_s AND l.source = p_source
    AND l.gone_after_s = p_gone_after_s AND l.hour = p.a
  WHERE p.kept
  UNION ALL
  SELECT x.line, x.run_id, x.sk, x.cur, x.gpu_s, x.covered_s, x.gpu_kwh, x.host_kwh, x.facility_kwh, x.co2e_kg,
         x.co2e_unknown_kwh, x.energy_cost, x.compute_cost, x.stale, x.has_energy, x.price_lo, x.price_hi,
         x.g_lo, x.g_hi, x.csrc_lo, x.csrc_hi
  FROM gaps g CROSS JOIN LATERAL gpufleet_fleet_parts(g.a, g.b, p_now, p_max_gap_s, p_source, p_gone_after_s, 'line') x
),
sums AS (
  SELECT p.line, p.run_id, p.sk, p.cur,{_SUMS}
  FROM parts p GROUP BY 1, 2, 3, 4
),
run_lines AS (
  SELECT 'run'::text AS line, w.run_id, w.sk, NULL::timestamptz AS part, w.lo AS part_start, w.hi AS part_end,
         coalesce(ac.n, 0)::integer AS gpu_count, coalesce(ac.shares, 0) AS gpu_equivalents,
         coalesce(s.gpu_s, 0.0) AS gpu_s, coalesce(s.cs, 0) AS cs,
         s.gpu_kwh, s.host_kwh, s.fac, s.co2e, s.unknown, s.ecost, s.csrc, s.one_price, s.one_g, s.prices,
         s.st, coalesce(s.ccost, 0.0) AS ccost, w.lo, s.cur
  FROM run_w w
  LEFT JOIN (SELECT a.run_id, count(*) AS n, sum(a.share) AS shares FROM alloc a GROUP BY a.run_id) ac
    ON ac.run_id = w.run_id
  LEFT JOIN sums s ON s.line = 'run' AND s.run_id = w.run_id
),
fleet_lines AS (
  SELECT s.line, NULL::text AS run_id, s.sk, NULL::timestamptz AS part, win.f AS part_start, win.t AS part_end,
         NULL::integer AS gpu_count, NULL::float8 AS gpu_equivalents, coalesce(s.gpu_s, 0) AS gpu_s,
         coalesce(s.cs, 0) AS cs, s.gpu_kwh, s.host_kwh, s.fac, s.co2e, s.unknown, s.ecost, s.csrc,
         s.one_price, s.one_g, s.prices, s.st,
         CASE WHEN s.line = 'total' THEN coalesce(s.ccost, 0) ELSE 0.0 END AS ccost, win.f AS lo, s.cur
  FROM sums s CROSS JOIN win WHERE s.line <> 'run'
),
{LAST_STEP}"""

KEPT_V1 = f"""
CREATE FUNCTION gpufleet_accounting_kept(
  p_from timestamptz, p_to timestamptz, p_now timestamptz, p_max_gap_s double precision, p_source text,
  p_gone_after_s double precision)
{ACCOUNTING_V7[ACCOUNTING_V7.index("RETURNS TABLE (") : ACCOUNTING_V7.index("LANGUAGE plpgsql")]}LANGUAGE plpgsql STABLE SET jit = off AS $fn$
#variable_conflict use_column
DECLARE
  p_runs text[] := NULL;
  p_fleet boolean := true;
  p_detail text := 'line';
  p_step interval := NULL;
BEGIN
RETURN QUERY
{_KEPT_QUERY};
END
$fn$
"""
