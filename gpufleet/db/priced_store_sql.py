"""Priced pieces kept, and the marks that say when they no longer hold (migration 0023).

Every reader of incident costs, ``lost_to_incidents`` and the ledger prices the same closed pieces of
GPU-time again (``gpufleet_incident_accounting``: most of the time of a run's accounting with its
ledger).  ``priced_pieces`` keeps each priced key's lines under a digest of what was priced
(:mod:`gpufleet.accounting.priced_store`), with the **marks** of every input the answer read, as they
were in the snapshot it was computed in:

``r:<run>``              the run's window and site, its allocations (triggers on ``runs``, ``run_allocations``)
``i:<run>``              the run's incidents (``incidents``, migration 0026): what its claims are made of
``p:<run>``              the run's progress reports (``run_progress``, migration 0028): what the power-cap
                         advisor's points of it are made of
``f:<node>``             the node's site, GPU count and dated facts (``nodes``, ``node_facts_history``)
``s:<site>``             the site's dated settings and currency (``site_settings``, ``sites``)
``e:<node>:<day>``       the node's samples and energy rollups that UTC day (the rollup worker, which
                         rewrites every bucket a sample changes, from its previous sample to its next)
``c:<region>:<day>``     the carbon intensity in force that day; ``c:<region>:head`` / ``:tail`` for a
                         span ending by the region's first point (carried back to it) or starting after
                         its last (carried forward)
``e:<node>``, ``c:<region>``  the whole node or region, moved instead of its days by a change reaching
                         more than :data:`DAY_MARKS` days (a carbon point years before the next, a sample
                         after a node's years of silence), which would otherwise write a mark per day:
                         every line of it is then read live again, and the marks stay few

A change to an input moves its mark to the changing transaction's id (``pricing_marks``), in that
transaction; a kept line is read only while every mark it recorded is still the current one, so an
input that changes between the computation and its storing can never leave a stale answer behind.
What a late sample changes before the rollup worker has run is read live (the accounting answers it
from raw samples then): the reader checks the rollup queue as ``gpufleet_claim_energy`` does.
"""

from __future__ import annotations

from gpufleet.db import energy_sql as E

#: Moves the marks ``p_scopes`` to this transaction.
BUMP_V1 = """
CREATE FUNCTION gpufleet_pricing_bump(p_scopes text[]) RETURNS void
LANGUAGE sql VOLATILE AS $fn$
  INSERT INTO pricing_marks (scope, version)
  SELECT DISTINCT s, pg_current_xact_id()::text::bigint FROM unnest(p_scopes) s WHERE s IS NOT NULL
  ON CONFLICT (scope) DO UPDATE SET version = EXCLUDED.version
$fn$
"""

#: Migration 0031: a mark already moved by this transaction is left as it is.  A bulk change whose row
#: triggers mark the same scopes again and again (a COPY of a backfilled run's allocations) wrote a
#: new version of the same row each time, and each write walked the chain the transaction had left,
#: so a statement's cost grew with the square of its rows.
BUMP_V2 = BUMP_V1.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
    "DO UPDATE SET version = EXCLUDED.version\n",
    "DO UPDATE SET version = EXCLUDED.version\n  WHERE pricing_marks.version IS DISTINCT FROM EXCLUDED.version\n",
)


#: The most days one change marks one by one; a change reaching further marks its whole scope.
DAY_MARKS = 400


def _long(lo: str, hi: str) -> str:
    return f"({hi}) - ({lo}) > INTERVAL '{DAY_MARKS} days'"


def _day_scope(whole: str, lo: str, hi: str, d: str) -> str:
    """The mark of day ``d`` of a change over [lo, hi] of scope ``whole``: the whole scope's for a long change."""
    return f"CASE WHEN {_long(lo, hi)} THEN {whole} ELSE {whole} || ':' || to_char({d} AT TIME ZONE 'UTC', 'YYYY-MM-DD') END"


def _day_series(lo: str, hi: str) -> str:
    """The UTC days from the day of ``lo`` to the day of ``hi``; only the first for a long change."""
    return (
        f"generate_series(date_bin(INTERVAL '1 day', {lo}, {E.ORIGIN}), "
        f"CASE WHEN {_long(lo, hi)} THEN {lo} ELSE {hi} END, INTERVAL '1 day')"
    )


def _day_scopes(whole: str, lo: str, hi: str) -> str:
    """The marks of a change of scope ``whole`` over [lo, hi]: one per UTC day, or the whole scope's."""
    return f"ARRAY(SELECT {_day_scope(whole, lo, hi, 'd')} FROM {_day_series(lo, hi)} d)"


#: (A colon before a word is written ``':' || 'word'``: the migration's text would read it as a parameter.)
#: Row triggers: (table, events, WHEN clause or '', scopes of a row ``r`` (OLD or NEW)).
_ROW_TRIGGERS: tuple[tuple[str, str, str, str], ...] = (
    (
        "runs",
        "UPDATE",
        'OLD.start IS DISTINCT FROM NEW.start OR OLD."end" IS DISTINCT FROM NEW."end" '
        "OR OLD.site IS DISTINCT FROM NEW.site OR OLD.run_id IS DISTINCT FROM NEW.run_id",
        "ARRAY['r:' || r.run_id]",
    ),
    ("runs", "DELETE", "", "ARRAY['r:' || r.run_id]"),
    ("run_allocations", "INSERT OR UPDATE OR DELETE", "", "ARRAY['r:' || r.run_id]"),
    (
        "nodes",
        "UPDATE",
        "OLD.site IS DISTINCT FROM NEW.site OR OLD.gpu_count IS DISTINCT FROM NEW.gpu_count "
        "OR OLD.facts IS DISTINCT FROM NEW.facts OR OLD.node IS DISTINCT FROM NEW.node",
        "ARRAY['f:' || r.node]",
    ),
    ("nodes", "DELETE", "", "ARRAY['f:' || r.node]"),
    ("node_facts_history", "INSERT OR UPDATE OR DELETE", "", "ARRAY['f:' || r.node]"),
    ("site_settings", "INSERT OR UPDATE OR DELETE", "", "ARRAY['s:' || r.site]"),
    ("sites", "UPDATE OR DELETE", "", "ARRAY['s:' || r.site]"),
)


def row_trigger(fn: str, table: str, events: str, when: str, body: str) -> tuple[str, str]:
    """A row trigger ``fn`` on ``table`` (its function, then the trigger) that bumps marks: ``body`` is
    the function's statements, ``r`` a record variable for them."""
    func = f"""
CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
{body}
  RETURN NULL;
END
$fn$
"""
    cond = f" WHEN ({when})" if when else ""
    return func, f"CREATE TRIGGER {fn} AFTER {events} ON {table} FOR EACH ROW{cond} EXECUTE FUNCTION {fn}()"


def each_row(scopes: str) -> str:
    """A trigger body bumping ``scopes`` (an expression of ``r``) for OLD, then NEW, each that exists."""
    return (
        f"  IF TG_OP <> 'INSERT' THEN r := OLD; PERFORM gpufleet_pricing_bump({scopes}); END IF;\n"
        f"  IF TG_OP <> 'DELETE' THEN r := NEW; PERFORM gpufleet_pricing_bump({scopes}); END IF;"
    )


def _row_trigger(i: int, table: str, events: str, when: str, scopes: str) -> tuple[str, str]:
    return row_trigger(f"gpufleet_pricing_mark_{table}_{i}", table, events, when, each_row(scopes))


#: A carbon point at ``t`` sets the intensity from ``t`` to the region's next point (or for ever), and
#: before the first point the first is carried back: the days in between, and ``tail`` / ``head``.
CARBON_V1 = f"""
CREATE FUNCTION gpufleet_pricing_mark_carbon() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE r record; nxt timestamptz;
BEGIN
  FOR r IN SELECT x.region, x.time FROM (SELECT OLD.region, OLD.time WHERE TG_OP <> 'INSERT'
                                         UNION ALL SELECT NEW.region, NEW.time WHERE TG_OP <> 'DELETE') x(region, time)
  LOOP
    nxt := (SELECT min(ci.time) FROM carbon_intensity ci WHERE ci.region = r.region AND ci.time > r.time);
    PERFORM gpufleet_pricing_bump({_day_scopes("'c:' || r.region", "r.time", "coalesce(nxt, r.time)")}
      || CASE WHEN nxt IS NULL THEN ARRAY['c:' || r.region || ':' || 'tail'] ELSE '{{}}'::text[] END
      || CASE WHEN NOT EXISTS (SELECT 1 FROM carbon_intensity ci WHERE ci.region = r.region AND ci.time < r.time)
              THEN ARRAY['c:' || r.region || ':' || 'head'] ELSE '{{}}'::text[] END);
  END LOOP;
  RETURN NULL;
END
$fn$
"""
CARBON_TRIGGER_V1 = (
    "CREATE TRIGGER gpufleet_pricing_mark_carbon AFTER INSERT OR UPDATE OR DELETE ON carbon_intensity "
    "FOR EACH ROW EXECUTE FUNCTION gpufleet_pricing_mark_carbon()"
)

_ROWS = [_row_trigger(i, *t) for i, t in enumerate(_ROW_TRIGGERS)]

#: What migration 0023 runs after creating the tables, and its undoing before dropping them.
INSTALL_V1: tuple[str, ...] = (BUMP_V1, *(s for pair in _ROWS for s in pair), CARBON_V1, CARBON_TRIGGER_V1)
DROP_V1: tuple[str, ...] = (
    "DROP TRIGGER IF EXISTS gpufleet_pricing_mark_carbon ON carbon_intensity",
    "DROP FUNCTION IF EXISTS gpufleet_pricing_mark_carbon()",
    *(
        s
        for i, (table, *_rest) in enumerate(_ROW_TRIGGERS)
        for s in (
            f"DROP TRIGGER IF EXISTS gpufleet_pricing_mark_{table}_{i} ON {table}",
            f"DROP FUNCTION IF EXISTS gpufleet_pricing_mark_{table}_{i}()",
        )
    ),
    "DROP FUNCTION IF EXISTS gpufleet_pricing_bump(text[])",
)

#: Migration 0026: a run's incidents, what its claims are made of (``i:<run>``, moved by any change an
#: incident's claim reads: its kind, run, GPUs, span or evidence; not by the sweep's ``last_seen``).
_INCIDENT_TRIGGERS: tuple[tuple[str, str, str, str], ...] = (
    ("incidents", "INSERT OR DELETE", "", "ARRAY['i:' || r.run_id]"),
    (
        "incidents",
        "UPDATE",
        "OLD.kind IS DISTINCT FROM NEW.kind OR OLD.run_id IS DISTINCT FROM NEW.run_id "
        "OR OLD.node IS DISTINCT FROM NEW.node OR OLD.gpu IS DISTINCT FROM NEW.gpu "
        'OR OLD.start IS DISTINCT FROM NEW.start OR OLD."end" IS DISTINCT FROM NEW."end" '
        "OR OLD.evidence IS DISTINCT FROM NEW.evidence",
        "ARRAY['i:' || r.run_id]",
    ),
)
_INCIDENT_ROWS = [_row_trigger(len(_ROW_TRIGGERS) + i, *t) for i, t in enumerate(_INCIDENT_TRIGGERS)]
#: What migration 0026 runs after creating ``kept_claims``: each function, then its trigger.
INSTALL_V2: tuple[str, ...] = tuple(s for pair in _INCIDENT_ROWS for s in pair)
DROP_V2: tuple[str, ...] = tuple(
    s
    for i, (table, *_rest) in enumerate(_INCIDENT_TRIGGERS, start=len(_ROW_TRIGGERS))
    for s in (
        f"DROP TRIGGER IF EXISTS gpufleet_pricing_mark_{table}_{i} ON {table}",
        f"DROP FUNCTION IF EXISTS gpufleet_pricing_mark_{table}_{i}()",
    )
)

#: Migration 0028: a run's progress reports, what the power-cap advisor's points of it are made of
#: (``p:<run>``, :mod:`gpufleet.advisor.kept_points`).
_PROGRESS_TRIGGERS: tuple[tuple[str, str, str, str], ...] = (
    ("run_progress", "INSERT OR UPDATE OR DELETE", "", "ARRAY['p:' || r.run_id]"),
)
_PROGRESS_FIRST = len(_ROW_TRIGGERS) + len(_INCIDENT_TRIGGERS)
_PROGRESS_ROWS = [_row_trigger(_PROGRESS_FIRST + i, *t) for i, t in enumerate(_PROGRESS_TRIGGERS)]
#: What migration 0028 runs after creating ``kept_power_points``: each function, then its trigger.
INSTALL_V3: tuple[str, ...] = tuple(s for pair in _PROGRESS_ROWS for s in pair)
DROP_V3: tuple[str, ...] = tuple(
    s
    for i, (table, *_rest) in enumerate(_PROGRESS_TRIGGERS, start=_PROGRESS_FIRST)
    for s in (
        f"DROP TRIGGER IF EXISTS gpufleet_pricing_mark_{table}_{i} ON {table}",
        f"DROP FUNCTION IF EXISTS gpufleet_pricing_mark_{table}_{i}()",
    )
)


#: The rollup worker's part, in its transaction: the days each rebuilt range reaches, from the sample
#: before its first changed bucket to the sample after its last (``_rollup_gpu`` / ``_rollup_host``); it
#: runs with the fleet's hours added (:data:`gpufleet.db.fleet_hours_sql.BUMP_REBUILT_V2`).
def bump_rebuilt(more: str = "") -> str:
    """The statement: the node days, and ``more`` scopes (an expression over the same node ranges
    ``x``: node, a, z) appended, from one grouping of the rebuilt ranges."""
    extra = f"\n  || ARRAY(SELECT DISTINCT s FROM x CROSS JOIN LATERAL unnest({more}) s)" if more else ""
    return f"""
WITH x AS MATERIALIZED (
  SELECT node, min(a) AS a, max(z) AS z FROM _rollup_gpu GROUP BY node
  UNION ALL SELECT node, min(a), max(z) FROM _rollup_host GROUP BY node
)
SELECT gpufleet_pricing_bump(ARRAY(
  SELECT DISTINCT {_day_scope("'e:' || x.node", "x.a", "x.z", "d")}
  FROM x CROSS JOIN LATERAL {_day_series("x.a", "x.z")} d){extra})
WHERE EXISTS (SELECT 1 FROM x)"""


#: The columns of a kept line: ``gpufleet_accounting``'s result table, in its order.
LINE_COLUMNS: tuple[str, ...] = (
    "line",
    "run_id",
    "site",
    "part_start",
    "part_end",
    "gpu_count",
    "gpu_equivalents",
    "gpu_s",
    "covered_s",
    "gpu_hours",
    "covered_hours",
    "coverage",
    "gpu_kwh",
    "host_kwh",
    "it_kwh",
    "facility_kwh",
    "pue",
    "co2e_kg",
    "co2e_unknown_kwh",
    "carbon_source",
    "g_co2e_per_kwh",
    "price_source",
    "price_per_kwh",
    "currency",
    "minor_units",
    "energy_cost",
    "compute_cost",
    "total_cost",
    "stale",
)

#: The earliest time a kept line may begin at: retention (``storage`` in ``gpufleet_meta``, the shorter of
#: the raw samples' and the rollups') deletes what the accounting reads of older spans, and a day's margin
#: keeps the samples before a span's first one.  Older lines are read live and not kept.
HORIZON = (
    "coalesce((SELECT now() - make_interval(days => least((m.value ->> 'retention_days')::int, "
    "(m.value ->> 'rollup_retention_days')::int)) + INTERVAL '1 day' FROM gpufleet_meta m "
    "WHERE m.key = 'storage'), '-infinity'::timestamptz)"
)

#: Kept lines of the digests %(digests)s still valid: every recorded mark current, and no queued
#: range of their nodes that the accounting would now answer from raw samples inside their span
#: (``gpufleet_claim_energy``'s cut: the minute of the sample before the queued range).
#: Lines of many keys rest on the same marks (a run's keys on its run, nodes and days, often all of them
#: on the same list): each distinct (scope, version) is compared with its mark once, not once per line
#: that recorded it.
LOOKUP_SQL = f"""
WITH c AS MATERIALIZED (
  SELECT * FROM priced_pieces WHERE digest = ANY(%(digests)s) AND lo >= {HORIZON}
), moved AS MATERIALIZED (
  SELECT u.scope, u.version
  FROM (SELECT DISTINCT x.scope, x.version FROM (SELECT DISTINCT scopes, versions FROM c) a
        CROSS JOIN LATERAL unnest(a.scopes, a.versions) x(scope, version)) u
  LEFT JOIN pricing_marks m ON m.scope = u.scope WHERE coalesce(m.version, 0) <> u.version
)
SELECT c.digest, c.line_no, {", ".join("c." + col for col in LINE_COLUMNS)}
FROM c
WHERE NOT EXISTS (SELECT 1 FROM unnest(c.scopes, c.versions) u(scope, version)
                  JOIN moved ON moved.scope = u.scope AND moved.version = u.version)
  AND NOT EXISTS (
    SELECT 1 FROM (SELECT q.node, min(q.t_min) AS t FROM rollup_queue q WHERE q.node = ANY(c.nodes) GROUP BY q.node) q
    WHERE {
    E.minute(
        "coalesce((SELECT s.time FROM host_samples s WHERE s.node = q.node AND s.time < q.t "
        "ORDER BY s.time DESC LIMIT 1), q.t)"
    )
} < c.hi
       OR EXISTS (SELECT 1 FROM unnest(c.nodes, c.gpus) g(node, gpu) WHERE g.node = q.node AND g.gpu IS NOT NULL
                    AND {
    E.minute(
        "coalesce((SELECT s.time FROM gpu_samples s WHERE s.node = g.node AND s.gpu = g.gpu "
        "AND s.mig_instance IS NULL AND s.time < q.t ORDER BY s.time DESC LIMIT 1), q.t)"
    )
}
                        < c.hi))
ORDER BY c.digest, c.line_no"""

#: Each key's run's site, and the carbon regions in force there over [lo, hi] with each region's first
#: and last point (none: the site has no region then).
CONTEXT_SQL = """
SELECT x.i, r.site, p.carbon_region,
       (SELECT min(ci.time) FROM carbon_intensity ci WHERE ci.region = p.carbon_region),
       (SELECT max(ci.time) FROM carbon_intensity ci WHERE ci.region = p.carbon_region)
FROM unnest(%(runs)s::text[], %(los)s::timestamptz[], %(his)s::timestamptz[]) WITH ORDINALITY x(run_id, lo, hi, i)
JOIN runs r ON r.run_id = x.run_id
LEFT JOIN LATERAL (SELECT DISTINCT sp.carbon_region FROM gpufleet_site_periods(r.site, x.lo, x.hi) sp
                   WHERE sp.carbon_region IS NOT NULL) p ON true"""

MARKS_SQL = "SELECT scope, version FROM pricing_marks WHERE scope = ANY(%(scopes)s)"

DELETE_SQL = "DELETE FROM priced_pieces WHERE digest = ANY(%(digests)s)"
INSERT_COLUMNS: tuple[str, ...] = (
    "digest",
    "line_no",
    "scopes",
    "versions",
    "nodes",
    "gpus",
    "lo",
    "hi",
    *LINE_COLUMNS,
)

#: Stores one line (``INSERT_COLUMNS``; the line's ``lo`` again last) unless retention reaches it.
INSERT_SQL = (
    f"INSERT INTO priced_pieces ({', '.join(INSERT_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(INSERT_COLUMNS))} WHERE %s >= {HORIZON} "
    f"ON CONFLICT (digest, line_no) DO UPDATE SET "
    f"{', '.join(f'{c} = EXCLUDED.{c}' for c in INSERT_COLUMNS[2:])}, stored_at = now()"
)

#: A run's claims kept (``gpufleet.accounting.kept_claims``), of the keys %(keys)s, while the marks they
#: recorded are current: the incident count, the priced keys' names and their digests of pieces (end
#: to end, in the names' order).
CLAIMS_LOOKUP_SQL = """
SELECT k.digest, k.incidents, k.keys, k.pieces FROM kept_claims k
WHERE k.digest = ANY(%(keys)s)
  AND NOT EXISTS (SELECT 1 FROM unnest(k.scopes, k.versions) u(scope, version)
                  LEFT JOIN pricing_marks m ON m.scope = u.scope WHERE coalesce(m.version, 0) <> u.version)"""

CLAIMS_COLUMNS: tuple[str, ...] = (
    "digest",
    "run_id",
    "lo",
    "hi",
    "scopes",
    "versions",
    "incidents",
    "keys",
    "pieces",
)

#: Stores one run's claims (``CLAIMS_COLUMNS``; ``lo`` again last) unless retention reaches its window.
CLAIMS_INSERT_SQL = (
    f"INSERT INTO kept_claims ({', '.join(CLAIMS_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(CLAIMS_COLUMNS))} WHERE %s >= {HORIZON} "
    f"ON CONFLICT (digest) DO UPDATE SET "
    f"{', '.join(f'{c} = EXCLUDED.{c}' for c in CLAIMS_COLUMNS[1:])}, stored_at = now()"
)

#: An ended run's power-cap points kept (:mod:`gpufleet.advisor.kept_points`), of the keys %(keys)s,
#: while the marks they recorded are current.
POINTS_LOOKUP_SQL = f"""
SELECT k.digest, k.points, k.excluded FROM kept_power_points k
WHERE k.digest = ANY(%(keys)s) AND k.lo >= {HORIZON}
  AND NOT EXISTS (SELECT 1 FROM unnest(k.scopes, k.versions) u(scope, version)
                  LEFT JOIN pricing_marks m ON m.scope = u.scope WHERE coalesce(m.version, 0) <> u.version)"""

POINTS_COLUMNS: tuple[str, ...] = ("digest", "run_id", "lo", "hi", "scopes", "versions", "points", "excluded")

#: Stores one run's points (``POINTS_COLUMNS``; ``lo`` again last) unless retention reaches its window.
POINTS_INSERT_SQL = (
    f"INSERT INTO kept_power_points ({', '.join(POINTS_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(POINTS_COLUMNS))} WHERE %s >= {HORIZON} "
    f"ON CONFLICT (digest) DO UPDATE SET "
    f"{', '.join(f'{c} = EXCLUDED.{c}' for c in POINTS_COLUMNS[1:])}, stored_at = now()"
)
