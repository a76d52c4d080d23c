"""The ledger in SQL, for readers that have only the database (the Grafana energy board's waste panels).

The API's ledger is :mod:`gpufleet.accounting.ledger`: the incidents' claims
(:func:`gpufleet.accounting.incidents.claim`) arbitrated by the one rule of :mod:`gpufleet.waste`
and priced by ``gpufleet_incident_accounting``.  A board cannot call Python, so this is the same
ledger as SQL functions (migration 0018), the twin of the Python claims and arbitration, in the way
``gpufleet.store.run_model`` keeps ``overlaps`` and ``overlaps_sql``: the state of each kind, the
order of the states and the job-wide kinds are written into the text from the Python definitions
(:data:`gpufleet.waste.STATE_OF_KIND`, :data:`gpufleet.waste.PRECEDENCE`,
:data:`gpufleet.accounting.incidents.JOB_WIDE_KINDS`), and ``tests/accounting/test_ledger_sql.py``
checks on random incidents that both give the same pieces and the same ledger.

``gpufleet_ledger_pieces(from, to, now, runs)``
    The explained pieces of the runs overlapping [from, to) (or the runs ``runs``), each clipped to
    the period and to now as ``gpufleet_accounting`` clips the run: one row per (run, state, GPU,
    stretch of one lost share), the state that comes first in the order with the largest share of
    that state among the incidents claiming lost time there.

``gpufleet_ledger(from, to, now, runs, max_gap_s, source)``
    Per run line of ``gpufleet_accounting`` and state: GPU-hours, GPU and facility kWh, CO2e (null
    when the run's carbon intensity is unknown) and total cost, in the run's currency; the lost
    states priced by ``gpufleet_incident_accounting`` over their pieces, ``productive`` the run's
    line less them (a rounding overshoot taken off the largest lost state), so the states add up to
    the run's figures exactly.
"""

from __future__ import annotations

from gpufleet.accounting.efficiency import LOST_TIME_KINDS
from gpufleet.accounting.incidents import JOB_WIDE_KINDS, WHOLLY_LOST_KINDS
from gpufleet.waste import PRECEDENCE, STATE_OF_KIND, STATES


def _lit(text: str) -> str:
    assert "'" not in text
    return f"'{text}'"


#: (kind, state, rank, job-wide, wholly lost) for each kind that puts GPU-time in the ledger.
_KINDS = ",\n    ".join(
    f"({_lit(kind)}, {_lit(state)}, {PRECEDENCE.index(state)}, {str(kind in JOB_WIDE_KINDS).lower()}, "
    f"{str(kind in WHOLLY_LOST_KINDS).lower()})"
    for kind, state in sorted(STATE_OF_KIND.items())
)

#: The states in the contract's order, with their place in the precedence (productive: none).
_STATES = ", ".join(
    f"({_lit(s)}, {i}, {PRECEDENCE.index(s) if s in PRECEDENCE else 'NULL'})" for i, s in enumerate(STATES)
)


def _num(expr: str) -> str:
    """A JSON number of ``expr`` (jsonb) as float8, else NULL (as the evidence is read: numbers only)."""
    return f"(CASE WHEN jsonb_typeof({expr}) = 'number' THEN ({expr})::text::float8 END)"


def _clip(expr: str) -> str:
    """``expr`` held to [0, 1]; NULL stays NULL (``greatest`` and ``least`` would skip it)."""
    return f"(CASE WHEN ({expr}) IS NULL THEN NULL ELSE least(greatest({expr}, 0.0), 1.0) END)"


def _throttle(ev: str) -> str:
    """throttled_share × (1 − clock_ratio), 0 without both (gpufleet.accounting.incidents._throttle_loss)."""
    ts, cr = _num(f"{ev}->'throttled_share'"), _num(f"{ev}->'clock_ratio'")
    return f"coalesce({_clip(ts)} * {_clip(f'1.0 - {cr}')}, 0.0)"


def _straggler() -> str:
    """1 − min(activity, peer) ÷ max(…), 0 without both or with both 0 (gpufleet.accounting.incidents)."""
    a, pa = _num("c.ev->'activity'"), _num("c.ev->'peer_activity'")
    gap = _clip(f"1.0 - least({a}, {pa}) / greatest({a}, {pa})")
    return f"(CASE WHEN {a} IS NOT NULL AND {pa} IS NOT NULL AND greatest({a}, {pa}) > 0 THEN {gap} ELSE 0.0 END)"


#: The lost share of an incident ``c`` on a GPU with listed entry ``l.entry`` (gpufleet.accounting.incidents
#: .loss_model and claim): what the Python reads, expression for expression.
_WEIGHT = f"""CASE
      WHEN c.wholly THEN 1.0
      WHEN c.kind IN ({", ".join(map(_lit, LOST_TIME_KINDS))}) THEN coalesce(
        {_clip(_num("c.ev->'gpu_time_lost_share'"))}, {_clip(_num("c.ev->'run_time_lost_share'"))},
        {_clip("1.0 - " + _num("c.ev->'duty_cycle'"))}, 1.0)
      WHEN c.kind = 'throttling' THEN
        CASE WHEN l.entry ? 'throttled_share' THEN {_throttle("l.entry")} ELSE {_throttle("c.ev")} END
      WHEN c.kind = 'straggler' THEN {_straggler()}
      ELSE coalesce({_clip(_num("c.ev->'gpu_time_lost_share'"))}, 0.0)
    END"""

LEDGER_PIECES_V1 = f"""
CREATE FUNCTION gpufleet_ledger_pieces(p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(),
                                       p_runs text[] DEFAULT NULL)
RETURNS TABLE (run_id text, state text, node text, gpu integer, lo timestamptz, hi timestamptz,
               weight double precision)
LANGUAGE sql STABLE AS $fn$
WITH kinds(kind, state, rank, job_wide, wholly) AS (VALUES
    {_KINDS}
),
-- the runs' accounted windows, as gpufleet_accounting's run_w has them
w AS MATERIALIZED (
  SELECT r.run_id, l.lo, greatest(l.lo, least(coalesce(r."end", p_now), p_now, coalesce(p_to, 'infinity'))) AS hi
  FROM runs r CROSS JOIN LATERAL (SELECT greatest(r.start, coalesce(p_from, r.start)) AS lo) l
  WHERE (p_runs IS NULL OR r.run_id = ANY(p_runs))
    AND (p_runs IS NOT NULL OR (r.start < coalesce(p_to, 'infinity')
                                AND (p_from IS NULL OR r."end" IS NULL OR r."end" > p_from)))
),
-- each incident's span in its run's window
c AS MATERIALIZED (
  SELECT i.id, i.kind, i.run_id, i.node, i.gpu, coalesce(i.evidence, '{{}}'::jsonb) AS ev, k.state, k.rank,
         k.job_wide, k.wholly, greatest(i.start, w.lo) AS a, least(coalesce(i."end", p_now), p_now, w.hi) AS b
  FROM incidents i JOIN w ON w.run_id = i.run_id JOIN kinds k ON k.kind = i.kind
  WHERE i.start < w.hi AND greatest(i.start, w.lo) < least(coalesce(i."end", p_now), p_now, w.hi)
),
-- the GPUs an incident names in evidence.gpus ({{"node": text, "gpu": integer, ...}})
listed AS (
  SELECT c.id, e->>'node' AS node, (e->>'gpu')::integer AS gpu, e AS entry
  FROM c CROSS JOIN LATERAL jsonb_array_elements(c.ev->'gpus') e
  WHERE jsonb_typeof(c.ev->'gpus') = 'array' AND jsonb_typeof(e) = 'object' AND jsonb_typeof(e->'node') = 'string'
    AND jsonb_typeof(e->'gpu') = 'number' AND (e->>'gpu') ~ '^-?[0-9]{{1,9}}$'
),
-- each claimed GPU of the run with its lost share: job-wide kinds every GPU; else those evidence.gpus
-- lists; else its GPU; else the run's GPUs on its node; else every GPU of the run
cw AS MATERIALIZED (
  SELECT c.run_id, a.node, a.gpu::integer AS gpu, c.a, c.b, c.state, c.rank, {_WEIGHT} AS w
  FROM c JOIN run_allocations a ON a.run_id = c.run_id
  LEFT JOIN listed l ON NOT c.job_wide AND l.id = c.id AND l.node = a.node AND l.gpu = a.gpu
  WHERE CASE WHEN c.job_wide THEN true
             WHEN jsonb_typeof(c.ev->'gpus') = 'array' THEN l.id IS NOT NULL
             WHEN c.gpu IS NOT NULL THEN a.node = c.node AND a.gpu = c.gpu
             WHEN c.node IS NOT NULL THEN a.node = c.node
             ELSE true END
),
claims AS MATERIALIZED (SELECT * FROM cw WHERE cw.w > 0),
-- each GPU's time cut at every claim's ends; each stretch goes to the first state claiming it, with
-- that state's largest share
cuts AS (
  SELECT x.run_id, x.node, x.gpu, x.t, lead(x.t) OVER (PARTITION BY x.run_id, x.node, x.gpu ORDER BY x.t) AS t1
  FROM (SELECT k.run_id, k.node, k.gpu, k.a AS t FROM claims k UNION SELECT k.run_id, k.node, k.gpu, k.b FROM claims k) x
),
best AS (
  SELECT DISTINCT ON (s.run_id, s.node, s.gpu, s.t) s.run_id, s.node, s.gpu, s.t AS t0, s.t1, k.state, k.w
  FROM cuts s JOIN claims k ON k.run_id = s.run_id AND k.node = s.node AND k.gpu = s.gpu AND k.a <= s.t AND k.b >= s.t1
  WHERE s.t1 IS NOT NULL
  ORDER BY s.run_id, s.node, s.gpu, s.t, k.rank, k.w DESC
),
-- adjacent stretches of one state and share merged
marked AS (
  SELECT b.*, CASE WHEN lag(b.t1) OVER g = b.t0 AND lag(b.state) OVER g = b.state AND lag(b.w) OVER g = b.w
                   THEN 0 ELSE 1 END AS brk
  FROM best b WINDOW g AS (PARTITION BY b.run_id, b.node, b.gpu ORDER BY b.t0)
),
grouped AS (
  SELECT m.*, sum(m.brk) OVER (PARTITION BY m.run_id, m.node, m.gpu ORDER BY m.t0) AS grp FROM marked m
)
SELECT g.run_id, g.state, g.node, g.gpu, min(g.t0), max(g.t1), g.w
FROM grouped g
GROUP BY g.run_id, g.node, g.gpu, g.grp, g.state, g.w
ORDER BY 1, 3, 4, 5
$fn$
"""


def _field(f: str) -> str:
    """``f`` of a lost state less its share of a rounding overshoot, and ``f`` of productive (``p_f``)."""
    return f"""CASE WHEN x.state = 'productive' THEN
              CASE WHEN x.resid_{f} < 0 AND x.big_{f} + x.resid_{f} >= 0 THEN 0 ELSE x.resid_{f} END
            WHEN x.resid_{f} < 0 AND x.rank_{f} = 1 AND x.{f} + x.resid_{f} >= 0 THEN x.{f} + x.resid_{f}
            ELSE x.{f} END"""


_FIELDS = ("gpu_hours", "gpu_kwh", "facility_kwh", "co2e_kg", "total_cost")

LEDGER_V1 = f"""
CREATE FUNCTION gpufleet_ledger(p_from timestamptz, p_to timestamptz, p_now timestamptz DEFAULT now(),
                                p_runs text[] DEFAULT NULL, p_max_gap_s double precision DEFAULT 60,
                                p_source text DEFAULT 'auto')
RETURNS TABLE (run_id text, site text, state text, gpu_hours numeric, gpu_kwh numeric, facility_kwh numeric,
               co2e_kg numeric, total_cost numeric, currency text)
LANGUAGE sql STABLE AS $fn$
WITH states(state, ord, rank) AS (VALUES {_STATES}),
p AS MATERIALIZED (SELECT * FROM gpufleet_ledger_pieces(p_from, p_to, p_now, p_runs)),
lost AS MATERIALIZED (
  SELECT l.* FROM (
    SELECT coalesce(array_agg(p.state || ':' || p.run_id), '{{}}') AS k, coalesce(array_agg(p.run_id), '{{}}') AS r,
           coalesce(array_agg(p.node), '{{}}') AS n, coalesce(array_agg(p.gpu), '{{}}') AS g,
           coalesce(array_agg(p.lo), '{{}}') AS lo, coalesce(array_agg(p.hi), '{{}}') AS hi,
           coalesce(array_agg(p.weight), '{{}}') AS wt
    FROM p) a
  CROSS JOIN LATERAL gpufleet_incident_accounting(a.k, a.r, a.n, a.g, a.lo, a.hi, a.wt, p_now, p_max_gap_s,
                                                   p_source) l
),
runl AS MATERIALIZED (
  SELECT a.* FROM gpufleet_accounting(p_from, p_to, p_now, p_runs, false, p_max_gap_s, p_source, 'line', NULL) a
  WHERE a.line = 'run'
),
cells AS (
  SELECT r.run_id, r.site, r.currency, r.carbon_source, s.state, s.ord,
         coalesce(l.gpu_hours, 0) AS gpu_hours, l.gpu_kwh, l.facility_kwh, l.co2e_kg, l.total_cost
  FROM runl r CROSS JOIN states s
  LEFT JOIN lost l ON s.rank IS NOT NULL AND l.run_id = s.state || ':' || r.run_id
),
x AS (
  SELECT c.run_id, c.site, c.currency, c.carbon_source, c.state, c.ord,
         {", ".join(f"coalesce(c.{f}, 0) AS {f}" for f in _FIELDS)},
         {
    ", ".join(
        f"r.{f} - sum(coalesce(c.{f}, 0)) FILTER (WHERE c.state <> 'productive') "
        f"OVER (PARTITION BY c.run_id) AS resid_{f}"
        for f in _FIELDS
    )
},
         {
    ", ".join(
        f"max(coalesce(c.{f}, 0)) FILTER (WHERE c.state <> 'productive') "
        f"OVER (PARTITION BY c.run_id) AS big_{f}"
        for f in _FIELDS
    )
},
         {
    ", ".join(
        f"row_number() OVER (PARTITION BY c.run_id, c.state = 'productive' "
        f"ORDER BY coalesce(c.{f}, 0) DESC, c.ord) AS rank_{f}"
        for f in _FIELDS
    )
}
  FROM cells c JOIN runl r ON r.run_id = c.run_id
)
SELECT x.run_id, x.site, x.state, {_field("gpu_hours")}, {_field("gpu_kwh")}, {_field("facility_kwh")},
       CASE WHEN x.carbon_source = 'none' THEN NULL ELSE {_field("co2e_kg")} END, {
    _field("total_cost")
}, x.currency
FROM x
ORDER BY x.run_id, x.ord
$fn$
"""

#: What migration 0018 runs, and its undoing.
INSTALL_LEDGER_V1: tuple[str, ...] = (LEDGER_PIECES_V1, LEDGER_V1)
DROP_LEDGER_V1: tuple[str, ...] = (
    "DROP FUNCTION IF EXISTS gpufleet_ledger(timestamptz, timestamptz, timestamptz, text[], double precision, text)",
    "DROP FUNCTION IF EXISTS gpufleet_ledger_pieces(timestamptz, timestamptz, timestamptz, text[])",
)
