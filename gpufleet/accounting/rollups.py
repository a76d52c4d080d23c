"""Claim energy from the hour and minute rollups, with raw samples for what they cannot answer.

Each batch's window is planned into pieces (``timegrid.plan_pieces``):
whole hours from ``gpu_energy_1h``/``host_energy_1h``, whole minutes from
the ``_1m`` tables, and raw samples for partial minutes at unaligned edges
and for everything from where a pending rollup-queue row may still change
the rollups (``stale_from``).  Counter intervals longer than the gap rule are
not in the minute rows but in ``gpu_energy_spans``; their share inside the
hour and minute pieces is added as the buckets would have held it.  A bucket's energy goes to the tariff segment
of its start (or of the piece's ``seg_at``); a subtracted piece counts
negative.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from gpufleet.accounting.claims import Batch, GpuClaim, HostClaim, Key, Member, Sums, collect
from gpufleet.accounting.raw import raw_sums
from gpufleet.accounting.sqlarrays import float_array, int_array, text_array, time_array
from gpufleet.accounting.timegrid import Piece, plan_pieces
from gpufleet.db import energy_sql as E

_SEGMENT = "CASE WHEN p.seg > 0 THEN p.seg ELSE width_bucket(e.bucket, %(tariff)s::timestamptz[]) END"


def _ranges(n: str) -> str:
    return (f"unnest(%(pid{n})s::int[], %(lo{n})s::timestamptz[], %(hi{n})s::timestamptz[], %(sign{n})s::int[], "
            f"%(seg{n})s::int[]) AS p(pid, lo, hi, sign, seg)")


def _gpu_sql(table: str, n: str) -> str:
    return f"""
SELECT m.grp, {_SEGMENT}, sum(p.sign * e.energy_j), sum(p.sign * e.covered_s), 0.0::float8
FROM {_ranges(n)}
JOIN unnest(%(gmpid)s::int[], %(ggrp)s::int[], %(gnode)s::text[], %(ggpu)s::smallint[])
  AS m(pid, grp, node, gpu) ON m.pid = p.pid
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j, e.covered_s FROM {table} e
  WHERE e.node = m.node AND e.gpu = m.gpu AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
GROUP BY 1, 2"""


def _host_sql(table: str, n: str) -> str:
    return f"""
SELECT m.grp, {_SEGMENT}, 0.0::float8, 0.0::float8, sum(p.sign * e.energy_j * m.share)
FROM {_ranges(n)}
JOIN unnest(%(hmpid)s::int[], %(hgrp)s::int[], %(hnode)s::text[], %(hshare)s::float8[])
  AS m(pid, grp, node, share) ON m.pid = p.pid
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j FROM {table} e
  WHERE e.node = m.node AND e.bucket >= p.lo AND e.bucket < p.hi OFFSET 0) e
GROUP BY 1, 2"""


_TARIFF = "%(tariff)s::timestamptz[]"


def _span_sql(n: str) -> str:
    """The share of each long counter interval (``gpu_energy_spans``) inside the rollup pieces: what
    its minute buckets would have held, split at the tariff edges inside a piece (they lie on its
    bucket boundaries, where each bucket would go to the segment of its start)."""
    return f"""
SELECT m.grp, x.seg, sum(p.sign * sp.energy_j * x.part_s / sp.dt), sum(p.sign * x.part_s), 0.0::float8
FROM {_ranges(n)}
JOIN unnest(%(gmpid)s::int[], %(ggrp)s::int[], %(gnode)s::text[], %(ggpu)s::smallint[])
  AS m(pid, grp, node, gpu) ON m.pid = p.pid
CROSS JOIN LATERAL (SELECT greatest(e.t0, p.lo) AS a, least(e.t1, p.hi) AS b, e.energy_j,
                           extract(epoch FROM e.t1 - e.t0)::float8 AS dt
  FROM gpu_energy_spans e WHERE e.node = m.node AND e.gpu = m.gpu AND e.t0 < p.hi AND e.t1 > p.lo OFFSET 0) sp
CROSS JOIN LATERAL (
  SELECT k AS seg, extract(epoch FROM least(sp.b, COALESCE(({_TARIFF})[k + 1], 'infinity'::timestamptz))
                                     - greatest(sp.a, COALESCE(({_TARIFF})[k], '-infinity'::timestamptz)))::float8
    AS part_s
  FROM generate_series(width_bucket(sp.a, {_TARIFF}), width_bucket(sp.b - INTERVAL '1 microsecond', {_TARIFF})) AS k
  WHERE p.seg <= 0
  UNION ALL
  SELECT p.seg, extract(epoch FROM sp.b - sp.a)::float8 WHERE p.seg > 0
) x
GROUP BY 1, 2"""


_ROLLUP_SQL = " UNION ALL ".join([
    _gpu_sql("gpu_energy_1h", "gh"), _gpu_sql("gpu_energy_1m", "gm"),
    _span_sql("gh"), _span_sql("gm"),
    _host_sql("host_energy_1h", "hh"), _host_sql("host_energy_1m", "hm"),
])

# ------------------------------------------------------------------ freshness

_PREV_GPU_SAMPLE = """COALESCE((SELECT s.time FROM gpu_samples s WHERE s.node = c.node AND s.gpu = c.gpu
  AND s.mig_instance IS NULL AND s.time < q.t ORDER BY s.time DESC LIMIT 1), q.t)"""
_PREV_HOST_SAMPLE = """COALESCE((SELECT s.time FROM host_samples s WHERE s.node = q.node AND s.time < q.t
  ORDER BY s.time DESC LIMIT 1), q.t)"""
_QUEUED = "SELECT node, min(t_min) AS t FROM rollup_queue WHERE node = ANY(%(nodes)s::text[]) GROUP BY node"

_STALE_GPU_SQL = f"""
WITH q AS ({_QUEUED})
SELECT c.node, c.gpu, {E.minute(_PREV_GPU_SAMPLE)}
FROM unnest(%(cnode)s::text[], %(cgpu)s::smallint[]) AS c(node, gpu) JOIN q ON q.node = c.node"""

_STALE_HOST_SQL = f"WITH q AS ({_QUEUED}) SELECT q.node, {E.minute(_PREV_HOST_SAMPLE)} FROM q"


def stale_from(conn: psycopg.Connection, gpus: Iterable[tuple[str, int]], nodes: Iterable[str]
               ) -> tuple[dict[tuple[str, int], datetime], dict[str, datetime]]:
    """Where rollups may still change, per GPU and per host: from the minute of the sample
    before a node's earliest pending queue range (the rollup worker rebuilds from there)."""
    gpu_list = sorted(set(gpus))
    node_list = sorted({n for n, _ in gpu_list} | set(nodes))
    if not node_list:
        return {}, {}
    queued = conn.execute("SELECT 1 FROM rollup_queue WHERE node = ANY(%s::text[]) LIMIT 1",
                          (text_array(node_list),)).fetchone()
    if queued is None:
        return {}, {}
    rows = conn.execute(_STALE_GPU_SQL, {"nodes": text_array(node_list), "cnode": text_array(g[0] for g in gpu_list),
                                         "cgpu": int_array(g[1] for g in gpu_list)}).fetchall()
    host_rows = conn.execute(_STALE_HOST_SQL, {"nodes": text_array(node_list)}).fetchall()
    return {(n, int(g)): t for n, g, t in rows}, {n: t for n, t in host_rows}


# ------------------------------------------------------------------ the rollup path

def _hash_aggregates(conn: psycopg.Connection, on: bool) -> None:
    """The planner estimates each claim's range scan at one row and so sorts tens of thousands of
    rows to group them; hashing them takes half the time.  Local to the caller's transaction."""
    conn.execute("SELECT set_config('enable_sort', %s, true)", ("off" if on else "on",))


def _plan(claims: Iterable[GpuClaim | HostClaim], groups: dict[str, int], tariff: Sequence[datetime],
          stale: Mapping[Any, datetime]) -> tuple[dict[str, list[Batch]], bool]:
    """Batches of claims with one window and staleness, their pieces sorted by kind."""
    by_key: dict[tuple[datetime, datetime, datetime | None], list[Member]] = {}
    stale_used = False
    for c in claims:
        s = stale.get((c.node, c.gpu) if isinstance(c, GpuClaim) else c.node)
        stale_used |= s is not None and s < c.hi
        member = (Member(groups[c.group], c.node, c.gpu) if isinstance(c, GpuClaim)
                  else Member(groups[c.group], c.node, 0, c.share))
        by_key.setdefault((c.lo, c.hi, s), []).append(member)

    def seg(p: Piece) -> int:
        return 0 if p.seg_at is None else bisect.bisect_right(tariff, p.seg_at)  # as width_bucket

    out: dict[str, list[Batch]] = {"1h": [], "1m": [], "raw": []}
    for (lo, hi, s), members in by_key.items():
        pieces = plan_pieces(lo, hi, tariff, s)  # the claims of one run share their window: planned once
        for kind in out:
            ranges = [(p.lo, p.hi, p.sign, seg(p)) for p in pieces if p.kind == kind]
            out[kind].append(Batch(ranges, members))
    return out, stale_used


def _bucket_params(n: str, batches: list[Batch]) -> dict[str, str]:
    ranges = [(pid, r) for pid, b in enumerate(batches) for r in b.ranges]
    return {f"pid{n}": int_array(pid for pid, _ in ranges), f"lo{n}": time_array(r[0] for _, r in ranges),
            f"hi{n}": time_array(r[1] for _, r in ranges), f"sign{n}": int_array(r[2] for _, r in ranges),
            f"seg{n}": int_array(r[3] for _, r in ranges)}


def _member_params(prefix: str, batches: list[Batch]) -> dict[str, str]:
    members = [(pid, m) for pid, b in enumerate(batches) for m in b.members]
    return {f"{prefix}mpid": int_array(pid for pid, _ in members), f"{prefix}grp": int_array(m.grp for _, m in members),
            f"{prefix}node": text_array(m.node for _, m in members), f"{prefix}gpu": int_array(m.gpu for _, m in members),
            f"{prefix}share": float_array(m.share for _, m in members)}


def rollup_sums(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[GpuClaim],
                hosts: Sequence[HostClaim], groups: dict[str, int], max_gap_s: float,
                stale_gpu: dict[tuple[str, int], datetime], stale_host: dict[str, datetime],
                into: dict[Key, Sums]) -> bool:
    """Add the energy of the claims to ``into``; returns whether stale rollups made any of it raw."""
    gpu_plan, gpu_stale = _plan(gpus, groups, tariff, stale_gpu)
    host_plan, host_stale = _plan(hosts, groups, tariff, stale_host)
    # The members of a window are the same for its hours and its minutes (same batch order).
    params: dict[str, object] = {"tariff": time_array(tariff),
                                 **_member_params("g", gpu_plan["1h"]), **_member_params("h", host_plan["1h"]),
                                 **_bucket_params("gh", gpu_plan["1h"]), **_bucket_params("gm", gpu_plan["1m"]),
                                 **_bucket_params("hh", host_plan["1h"]), **_bucket_params("hm", host_plan["1m"])}
    _hash_aggregates(conn, True)
    try:
        collect(conn.execute(_ROLLUP_SQL, params).fetchall(), into)
    finally:
        _hash_aggregates(conn, False)
    raw_sums(conn, tariff, gpu_plan["raw"], host_plan["raw"], max_gap_s, into)
    return gpu_stale or host_stale
