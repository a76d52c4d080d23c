"""The rollup worker: keeps per-minute and per-hour energy and node activity
(and, on plain PostgreSQL, per-minute stats) current as samples arrive.

Ingest records each batch's (node, time range) in ``rollup_queue`` inside
the batch's own transaction.  This worker claims queued ranges, recomputes the
buckets they touch from raw samples and deletes the claimed rows, all in one
transaction, so a crash at any point leaves either the old rollups plus the
queue rows or the new rollups without them.  Late and out-of-order data is
therefore handled: whichever buckets a new sample changes are recomputed.

A new sample changes the intervals to its previous and next samples, so the
recomputed minutes run from the minute of the previous sample to the minute
of the next one; those minutes in turn need the samples just outside them.

An interval longer than the gap rule (``max_gap_s``) is counted only from the
energy counter, which bridges gaps of any length; it is stored as one row of
``gpu_energy_spans`` and never spread over the minutes it covers, so a few
samples days apart write a few rows, not one per GPU per minute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import psycopg

from gpufleet.collector.shards import shard_sql
from gpufleet.db import activity_sql, sql_files, stats_sql
from gpufleet.db import energy_sql as E
from gpufleet.db.rollup_ranges import rebuild_scope

log = logging.getLogger(__name__)

CLAIM_SQL = """
DELETE FROM rollup_queue WHERE id IN (
  SELECT id FROM rollup_queue ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) RETURNING node, t_min, t_max"""

CLAIM_SHARDS_SQL = """
DELETE FROM rollup_queue WHERE id IN (
  SELECT id FROM rollup_queue WHERE {shard} = ANY(%(mine)s) ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) RETURNING node, t_min, t_max"""

# One row per (node, gpu): the minute buckets to rebuild [b0, b1) and the
# samples needed to rebuild them, [a, z].
GPU_RANGES_SQL = f"""
INSERT INTO _rollup_gpu (node, gpu, b0, b1, a, z)
SELECT r.node, g.gpu, x.b0, x.b1,
  COALESCE((SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = g.gpu
            AND s.mig_instance IS NULL AND s.time <= x.b0 ORDER BY s.time DESC LIMIT 1), x.b0),
  COALESCE((SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = g.gpu
            AND s.mig_instance IS NULL AND s.time >= x.b1 ORDER BY s.time LIMIT 1), x.b1)
FROM unnest(%(nodes)s::text[], %(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS r(node, lo, hi)
CROSS JOIN LATERAL (
  SELECT DISTINCT s.gpu FROM gpu_samples s
  WHERE s.node = r.node AND s.time >= r.lo AND s.time <= r.hi AND s.mig_instance IS NULL
) g
CROSS JOIN LATERAL (
  SELECT
    {E.minute("COALESCE((SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = g.gpu AND s.mig_instance IS NULL AND s.time < r.lo ORDER BY s.time DESC LIMIT 1), r.lo)")} AS b0,
    {E.minute("COALESCE((SELECT s.time FROM gpu_samples s WHERE s.node = r.node AND s.gpu = g.gpu AND s.mig_instance IS NULL AND s.time > r.hi ORDER BY s.time LIMIT 1), r.hi)")}
      + INTERVAL '1 minute' AS b1
) x"""

GPU_SAMPLES_FOR_RANGES = """(
  SELECT s.node, s.gpu, s.time, s.energy_mj, s.power_w
  FROM _rollup_gpu rr JOIN gpu_samples s
    ON s.node = rr.node AND s.gpu = rr.gpu AND s.time >= rr.a AND s.time <= rr.z
  WHERE s.mig_instance IS NULL
) smp"""

# Spans (counter intervals longer than max_gap_s) overlapping the rebuilt buckets are replaced;
# the ones removed are remembered so that an interval reaching outside [b0, b1) keeps the form
# it was stored in (see GPU_INTERVALS_SQL).
GPU_DELETE_SPANS_SQL = """
WITH d AS (DELETE FROM gpu_energy_spans e USING _rollup_gpu rr
           WHERE e.node = rr.node AND e.gpu = rr.gpu AND e.t1 > rr.b0 AND e.t0 < rr.b1
           RETURNING e.node, e.gpu, e.t0)
INSERT INTO _rollup_span_old SELECT * FROM d"""

# Every interval of the range's samples, computed once into _rollup_iv.  A counted interval longer
# than max_gap_s (the counter bridging a gap) becomes one gpu_energy_spans row instead of one row per
# minute it covers; the others are spread over minutes as before.  An interval that reaches outside
# [b0, b1) is a span only if it was one: rows written before spans existed stay minute rows, since
# its minutes outside the range are not rewritten here.
GPU_INTERVALS_SQL = f"""
INSERT INTO _rollup_iv (node, gpu, t0, t1, dt, j, span)
SELECT i.node, i.gpu, i.t0, i.t1, i.dt, i.j,
  (i.j IS NOT NULL AND i.dt > %(max_gap_s)s
   AND ((i.t0 >= rr.b0 AND i.t1 <= rr.b1)
        OR EXISTS (SELECT 1 FROM _rollup_span_old o WHERE o.node = i.node AND o.gpu = i.gpu AND o.t0 = i.t0)))
FROM ({E.gpu_interval_select(GPU_SAMPLES_FOR_RANGES)}) i
JOIN _rollup_gpu rr ON rr.node = i.node AND rr.gpu = i.gpu"""

GPU_REBUILD_SPANS_SQL = """
INSERT INTO gpu_energy_spans (node, gpu, t0, t1, energy_j)
SELECT iv.node, iv.gpu, iv.t0, iv.t1, iv.j
FROM _rollup_iv iv JOIN _rollup_gpu rr ON rr.node = iv.node AND rr.gpu = iv.gpu
WHERE iv.span AND iv.t1 > rr.b0 AND iv.t0 < rr.b1"""

GPU_REBUILD_1M_SQL = f"""
WITH parts AS ({E.split_by_minute("SELECT node, gpu, t0, t1, dt, j FROM _rollup_iv WHERE NOT span", "node, gpu")})
INSERT INTO gpu_energy_1m (bucket, node, gpu, energy_j, covered_s)
SELECT p.bucket, p.node, p.gpu, sum(p.part_j), sum(p.part_s)
FROM parts p JOIN _rollup_gpu rr ON rr.node = p.node AND rr.gpu = p.gpu
WHERE p.bucket >= rr.b0 AND p.bucket < rr.b1
GROUP BY p.bucket, p.node, p.gpu"""

GPU_DELETE_1M_SQL = """
DELETE FROM gpu_energy_1m e USING _rollup_gpu rr
WHERE e.node = rr.node AND e.gpu = rr.gpu AND e.bucket >= rr.b0 AND e.bucket < rr.b1"""

GPU_DELETE_1H_SQL = f"""
DELETE FROM gpu_energy_1h e USING _rollup_gpu rr
WHERE e.node = rr.node AND e.gpu = rr.gpu AND e.bucket >= {E.hour("rr.b0")} AND e.bucket < {E.hour("rr.b1 - INTERVAL '1 microsecond'")} + INTERVAL '1 hour'"""

GPU_REBUILD_1H_SQL = f"""
INSERT INTO gpu_energy_1h (bucket, node, gpu, energy_j, covered_s)
SELECT {E.hour("m.bucket")}, m.node, m.gpu, sum(m.energy_j), sum(m.covered_s)
FROM gpu_energy_1m m JOIN _rollup_gpu rr ON m.node = rr.node AND m.gpu = rr.gpu
WHERE m.bucket >= {E.hour("rr.b0")} AND m.bucket < {E.hour("rr.b1 - INTERVAL '1 microsecond'")} + INTERVAL '1 hour'
GROUP BY 1, m.node, m.gpu"""

HOST_RANGES_SQL = f"""
INSERT INTO _rollup_host (node, b0, b1, a, z)
SELECT r.node, x.b0, x.b1,
  COALESCE((SELECT s.time FROM host_samples s WHERE s.node = r.node AND s.time <= x.b0 ORDER BY s.time DESC LIMIT 1), x.b0),
  COALESCE((SELECT s.time FROM host_samples s WHERE s.node = r.node AND s.time >= x.b1 ORDER BY s.time LIMIT 1), x.b1)
FROM unnest(%(nodes)s::text[], %(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS r(node, lo, hi)
CROSS JOIN LATERAL (
  SELECT
    {E.minute("COALESCE((SELECT s.time FROM host_samples s WHERE s.node = r.node AND s.time < r.lo ORDER BY s.time DESC LIMIT 1), r.lo)")} AS b0,
    {E.minute("COALESCE((SELECT s.time FROM host_samples s WHERE s.node = r.node AND s.time > r.hi ORDER BY s.time LIMIT 1), r.hi)")}
      + INTERVAL '1 minute' AS b1
) x
WHERE EXISTS (SELECT 1 FROM host_samples s WHERE s.node = r.node AND s.time >= r.lo AND s.time <= r.hi)"""

HOST_SAMPLES_FOR_RANGES = """(
  SELECT s.node, s.time, s.host_power_w
  FROM _rollup_host rr JOIN host_samples s ON s.node = rr.node AND s.time >= rr.a AND s.time <= rr.z
) smp"""

HOST_REBUILD_1M_SQL = f"""
WITH parts AS ({E.split_by_minute(E.host_interval_select(HOST_SAMPLES_FOR_RANGES), "node")})
INSERT INTO host_energy_1m (bucket, node, energy_j, covered_s)
SELECT p.bucket, p.node, sum(p.part_j), sum(p.part_s)
FROM parts p JOIN _rollup_host rr ON rr.node = p.node
WHERE p.bucket >= rr.b0 AND p.bucket < rr.b1
GROUP BY p.bucket, p.node"""

HOST_DELETE_1M_SQL = """
DELETE FROM host_energy_1m e USING _rollup_host rr
WHERE e.node = rr.node AND e.bucket >= rr.b0 AND e.bucket < rr.b1"""

HOST_DELETE_1H_SQL = f"""
DELETE FROM host_energy_1h e USING _rollup_host rr
WHERE e.node = rr.node AND e.bucket >= {E.hour("rr.b0")} AND e.bucket < {E.hour("rr.b1 - INTERVAL '1 microsecond'")} + INTERVAL '1 hour'"""

HOST_REBUILD_1H_SQL = f"""
INSERT INTO host_energy_1h (bucket, node, energy_j, covered_s)
SELECT {E.hour("m.bucket")}, m.node, sum(m.energy_j), sum(m.covered_s)
FROM host_energy_1m m JOIN _rollup_host rr ON m.node = rr.node
WHERE m.bucket >= {E.hour("rr.b0")} AND m.bucket < {E.hour("rr.b1 - INTERVAL '1 microsecond'")} + INTERVAL '1 hour'
GROUP BY 1, m.node"""

TEMP_TABLES_SQL = """
CREATE TEMP TABLE IF NOT EXISTS _rollup_gpu (node text, gpu smallint, b0 timestamptz, b1 timestamptz,
  a timestamptz, z timestamptz) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _rollup_host (node text, b0 timestamptz, b1 timestamptz,
  a timestamptz, z timestamptz) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _rollup_span_old (node text, gpu smallint, t0 timestamptz) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _rollup_iv (node text, gpu smallint, t0 timestamptz, t1 timestamptz, dt float8,
  j float8, span bool) ON COMMIT DELETE ROWS"""


def _stats_sql(kind: str) -> tuple[str, str]:
    """Plain-PostgreSQL refresh of gpu_stats_1m / host_stats_1m for the ranges."""
    table = f"{kind}_stats_1m"
    delete, where = rebuild_scope(table, "minute", f"{kind}_samples.time")
    select = (stats_sql.gpu_stats_select if kind == "gpu" else stats_sql.host_stats_select)(
        E.minute("time"), where
    )
    return delete, f"INSERT INTO {table} {select}"


@dataclass
class RollupResult:
    ranges: int = 0
    gpu_buckets: int = 0
    #: Counter intervals longer than the gap rule written as one row each.
    gpu_spans: int = 0
    host_buckets: int = 0
    #: node_activity_1m and _1h rows written.
    node_minutes: int = 0


def merge_ranges(rows: list[tuple[str, datetime, datetime]]) -> dict[str, tuple[datetime, datetime]]:
    """One [lo, hi] per node covering all its claimed ranges."""
    out: dict[str, tuple[datetime, datetime]] = {}
    for node, lo, hi in rows:
        if lo is None or hi is None:
            continue
        if node in out:
            a, b = out[node]
            out[node] = (min(a, lo), max(b, hi))
        else:
            out[node] = (lo, hi)
    return out


def rebuild(
    conn: psycopg.Connection,
    ranges: dict[str, tuple[datetime, datetime]],
    max_gap_s: float,
    plain_stats: bool,
) -> RollupResult:
    """Recompute every rollup touched by ``ranges`` (within the caller's transaction)."""
    res = RollupResult(ranges=len(ranges))
    if not ranges:
        return res
    nodes = sorted(ranges)
    params = {
        "nodes": nodes,
        "lo": [ranges[n][0] for n in nodes],
        "hi": [ranges[n][1] for n in nodes],
        "max_gap_s": max_gap_s,
    }
    for stmt in TEMP_TABLES_SQL.split(";"):
        conn.execute(stmt)
    conn.execute("TRUNCATE _rollup_gpu, _rollup_host, _rollup_span_old, _rollup_iv")
    conn.execute(GPU_RANGES_SQL, params)
    conn.execute(GPU_DELETE_1M_SQL)
    conn.execute(GPU_DELETE_SPANS_SQL)
    conn.execute(GPU_INTERVALS_SQL, params)
    res.gpu_spans = conn.execute(GPU_REBUILD_SPANS_SQL).rowcount
    res.gpu_buckets = conn.execute(GPU_REBUILD_1M_SQL).rowcount
    conn.execute(GPU_DELETE_1H_SQL)
    conn.execute(GPU_REBUILD_1H_SQL)
    conn.execute(HOST_RANGES_SQL, params)
    conn.execute(HOST_DELETE_1M_SQL)
    res.host_buckets = conn.execute(HOST_REBUILD_1M_SQL, params).rowcount
    conn.execute(HOST_DELETE_1H_SQL)
    conn.execute(HOST_REBUILD_1H_SQL)
    # priced pieces and kept fleet hours that read these samples no longer hold
    # (gpufleet.accounting.priced_store, gpufleet.accounting.fleet_hours)
    conn.execute(sql_files.text("rollup_pricing_marks.v2"))
    if plain_stats:
        for kind in ("gpu", "host"):
            delete, insert = _stats_sql(kind)
            conn.execute(delete, params)
            conn.execute(insert, params)
    for delete, insert in (activity_sql.rebuild_minutes_sql(), activity_sql.rebuild_hours_sql()):
        conn.execute(delete, params)
        res.node_minutes += conn.execute(insert, params).rowcount
    return res


def run_once(
    conn: psycopg.Connection,
    max_gap_s: float,
    plain_stats: bool,
    limit: int = 20_000,
    shards: tuple[int, list[int]] | None = None,
) -> RollupResult:
    """Claim up to ``limit`` queued ranges and rebuild them, in one transaction.

    ``shards``: (shard count, the shards held): only the ranges of nodes
    hashed to those shards (a sharded replica rebuilds its own nodes)."""
    with conn.transaction():
        if shards is None:
            rows = conn.execute(CLAIM_SQL, {"limit": limit}).fetchall()
        else:
            rows = conn.execute(
                CLAIM_SHARDS_SQL.format(shard=shard_sql("node", shards[0])),
                {"limit": limit, "mine": shards[1]},
            ).fetchall()
        return rebuild(conn, merge_ranges(rows), max_gap_s, plain_stats)


def drain(conn: psycopg.Connection, max_gap_s: float, plain_stats: bool) -> int:
    """Run until the queue is empty (replay, tests, benchmarks). Returns ranges done."""
    done = 0
    while True:
        r = run_once(conn, max_gap_s, plain_stats)
        if r.ranges == 0:
            return done
        done += r.ranges
