"""Interval energy in SQL, by the accounting definition (contracts.md section 3).

An interval is a pair of consecutive samples of one GPU (or host).  Its energy
comes from the ``energy_mj`` counter difference when both ends have one and it
did not go backwards (a reset) nor forwards by more than any GPU can draw
over the interval (:data:`GPU_POWER_CEILING_W`: a glitch, such as a counter
read as 9e18), else from trapezoidal ``power_w`` integration when the
interval is no longer than ``max_gap_s``; otherwise it is not counted and
lowers coverage.  The energy is spread evenly over the interval,
so splitting at any set of edges (minutes, hours, carbon or price steps, run
start/end) gives each part its share.

The same SQL fragments feed the rollup worker (edges = minute grid) and the
raw accounting path (edges = a run's breakpoints), so the two agree exactly.
Buckets use ``date_bin`` against a fixed UTC origin, independent of the
session time zone.
"""

from __future__ import annotations

from gpufleet.catalog import GPU_FIELDS

ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"

#: The most power one GPU can draw, W: the catalog's upper bound of ``power_w`` (a reading above it is
#: refused at ingest).  A counter difference above this times the interval is not energy.
GPU_POWER_CEILING_W: float = next(f.hi for f in GPU_FIELDS if f.name == "power_w")  # type: ignore[assignment]
#: The same in mJ per second, as the counter counts.
_CEILING_MJ_S = int(GPU_POWER_CEILING_W * 1000)


def minute(expr: str) -> str:
    return f"date_bin(INTERVAL '1 minute', {expr}, {ORIGIN})"


def hour(expr: str) -> str:
    return f"date_bin(INTERVAL '1 hour', {expr}, {ORIGIN})"


def gpu_interval_select(samples: str, gap_param: str = "%(max_gap_s)s") -> str:
    """Intervals (key..., t0, t1, dt, j) of a relation with GPU sample columns.

    ``samples`` must expose node, gpu, time, energy_mj, power_w.  ``j`` is the
    interval energy in joules, NULL when the interval is not counted.
    """
    return f"""
SELECT node, gpu, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN e0 IS NOT NULL AND e1 IS NOT NULL AND e1 >= e0
            AND e1 - e0 <= {_CEILING_MJ_S}::float8 * extract(epoch FROM t1 - t0)::float8 THEN (e1 - e0) / 1000.0
       WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= {gap_param}
         THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8
  END AS j
FROM (
  SELECT node, gpu, lag(time) OVER w AS t0, time AS t1,
         lag(energy_mj) OVER w AS e0, energy_mj AS e1,
         lag(power_w) OVER w AS p0, power_w AS p1
  FROM {samples}
  WINDOW w AS (PARTITION BY node, gpu ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0"""


def host_interval_select(samples: str, gap_param: str = "%(max_gap_s)s") -> str:
    """Intervals (node, t0, t1, dt, j) of host power; no counter, so gaps stop it."""
    return f"""
SELECT node, t0, t1, extract(epoch FROM t1 - t0)::float8 AS dt,
  CASE WHEN p0 IS NOT NULL AND p1 IS NOT NULL AND extract(epoch FROM t1 - t0) <= {gap_param}
       THEN (p0 + p1) / 2.0 * extract(epoch FROM t1 - t0)::float8 END AS j
FROM (
  SELECT node, lag(time) OVER w AS t0, time AS t1, lag(host_power_w) OVER w AS p0, host_power_w AS p1
  FROM {samples}
  WINDOW w AS (PARTITION BY node ORDER BY time)
) pairs
WHERE t0 IS NOT NULL AND t1 > t0"""


def split_by_minute(intervals: str, keys: str) -> str:
    """Spread counted intervals over the minute buckets they overlap.

    Yields (keys..., bucket, part_j, part_s).  Most intervals lie within one
    minute and skip the per-interval series.
    """
    m0 = minute("t0")
    m1 = minute("t1 - INTERVAL '1 microsecond'")
    return f"""
SELECT {keys}, {m0} AS bucket, j AS part_j, dt AS part_s
FROM ({intervals}) i WHERE j IS NOT NULL AND {m0} = {m1}
UNION ALL
SELECT {keys}, m AS bucket,
  j * extract(epoch FROM least(t1, m + INTERVAL '1 minute') - greatest(t0, m))::float8 / dt AS part_j,
  extract(epoch FROM least(t1, m + INTERVAL '1 minute') - greatest(t0, m))::float8 AS part_s
FROM ({intervals}) i, generate_series({m0}, {m1}, INTERVAL '1 minute') AS m
WHERE j IS NOT NULL AND {m0} <> {m1}"""


def split_by_edges(intervals: str, keys: str, edges_param: str = "%(edges)s") -> str:
    """Spread counted intervals over segments [edges[k], edges[k+1]).

    ``edges`` is a sorted timestamptz array; segment index k is 1-based as in
    ``width_bucket``.  Parts outside [edges[1], edges[n]) are dropped.  Yields
    (keys..., seg, part_j, part_s) where part_s is the covered seconds.
    """
    e = f"{edges_param}::timestamptz[]"
    return f"""
SELECT {keys}, seg,
  j * extract(epoch FROM least(t1, ({e})[seg + 1]) - greatest(t0, ({e})[seg]))::float8 / dt AS part_j,
  extract(epoch FROM least(t1, ({e})[seg + 1]) - greatest(t0, ({e})[seg]))::float8 AS part_s
FROM ({intervals}) i,
  generate_series(greatest(width_bucket(t0, {e}), 1),
                  least(width_bucket(t1 - INTERVAL '1 microsecond', {e}), cardinality({e}) - 1)) AS seg
WHERE j IS NOT NULL"""
