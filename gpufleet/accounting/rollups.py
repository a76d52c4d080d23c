"""Claim energy from the hour and minute rollups, with raw samples for what they cannot answer.

Each claim is planned into pieces (``timegrid.plan_pieces``): whole hours
from ``gpu_energy_1h``/``host_energy_1h``, whole minutes from the ``_1m``
tables, and raw samples for partial minutes at unaligned edges and for
everything from where a pending rollup-queue row may still change the
rollups (``stale_from``).  A bucket's energy goes to the tariff segment of
its start (or of the piece's ``seg_at``); a subtracted piece counts negative.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime

import psycopg

from gpufleet.accounting.claims import GpuClaim, HostClaim, Key, Sums, collect
from gpufleet.accounting.raw import raw_sums
from gpufleet.accounting.timegrid import Piece, plan_pieces
from gpufleet.db import energy_sql as E

_SEGMENT = "CASE WHEN r.seg > 0 THEN r.seg ELSE width_bucket(e.bucket, %(tariff)s::timestamptz[]) END"


def _gpu_sql(table: str, n: str) -> str:
    return f"""
SELECT r.grp, {_SEGMENT}, sum(r.sign * e.energy_j), sum(r.sign * e.covered_s), 0.0::float8
FROM unnest(%(grp{n})s::int[], %(node{n})s::text[], %(gpu{n})s::smallint[], %(lo{n})s::timestamptz[],
            %(hi{n})s::timestamptz[], %(sign{n})s::int[], %(seg{n})s::int[]) AS r(grp, node, gpu, lo, hi, sign, seg)
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j, e.covered_s FROM {table} e
  WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket >= r.lo AND e.bucket < r.hi OFFSET 0) e
GROUP BY 1, 2"""


def _host_sql(table: str, n: str) -> str:
    return f"""
SELECT r.grp, {_SEGMENT}, 0.0::float8, 0.0::float8, sum(r.sign * e.energy_j * r.share)
FROM unnest(%(grp{n})s::int[], %(node{n})s::text[], %(lo{n})s::timestamptz[], %(hi{n})s::timestamptz[],
            %(share{n})s::float8[], %(sign{n})s::int[], %(seg{n})s::int[]) AS r(grp, node, lo, hi, share, sign, seg)
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j FROM {table} e
  WHERE e.node = r.node AND e.bucket >= r.lo AND e.bucket < r.hi OFFSET 0) e
GROUP BY 1, 2"""


_ROLLUP_SQL = " UNION ALL ".join([
    _gpu_sql("gpu_energy_1h", "h"), _gpu_sql("gpu_energy_1m", "m"),
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
    rows = conn.execute(_STALE_GPU_SQL, {"nodes": node_list, "cnode": [g[0] for g in gpu_list],
                                         "cgpu": [g[1] for g in gpu_list]}).fetchall()
    host_rows = conn.execute(_STALE_HOST_SQL, {"nodes": node_list}).fetchall()
    return {(n, int(g)): t for n, g, t in rows}, {n: t for n, t in host_rows}


# ------------------------------------------------------------------ the rollup path

def _hash_aggregates(conn: psycopg.Connection, on: bool) -> None:
    """The planner estimates each claim's range scan at one row and so sorts tens of thousands of
    rows to group them; hashing them takes half the time.  Local to the caller's transaction."""
    conn.execute("SELECT set_config('enable_sort', %s, true)", ("off" if on else "on",))


def rollup_sums(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[GpuClaim],
                hosts: Sequence[HostClaim], groups: dict[str, int], max_gap_s: float,
                stale_gpu: dict[tuple[str, int], datetime], stale_host: dict[str, datetime],
                into: dict[Key, Sums]) -> bool:
    """Add the energy of the claims to ``into``; returns whether stale rollups made any of it raw."""
    plans: dict[tuple[datetime, datetime, datetime | None], list[Piece]] = {}

    def plan(lo: datetime, hi: datetime, stale: datetime | None) -> list[Piece]:
        # the claims of one run share their window: plan it once
        key = (lo, hi, stale)
        if key not in plans:
            plans[key] = plan_pieces(lo, hi, tariff, stale)
        return plans[key]

    def seg(p: Piece) -> int:
        return 0 if p.seg_at is None else bisect.bisect_right(tariff, p.seg_at)  # as width_bucket

    gpu_buckets: dict[str, list[tuple[GpuClaim, Piece]]] = {"1h": [], "1m": []}
    host_buckets: dict[str, list[tuple[HostClaim, Piece]]] = {"1h": [], "1m": []}
    raw_gpus: list[GpuClaim] = []
    raw_hosts: list[HostClaim] = []
    stale_used = False
    for c in gpus:
        stale = stale_gpu.get((c.node, c.gpu))
        stale_used |= stale is not None and stale < c.hi
        for p in plan(c.lo, c.hi, stale):
            if p.kind == "raw":
                raw_gpus.append(GpuClaim(c.group, c.node, c.gpu, p.lo, p.hi))
            else:
                gpu_buckets[p.kind].append((c, p))
    for h in hosts:
        stale = stale_host.get(h.node)
        stale_used |= stale is not None and stale < h.hi
        for p in plan(h.lo, h.hi, stale):
            if p.kind == "raw":
                raw_hosts.append(HostClaim(h.group, h.node, p.lo, p.hi, h.share))
            else:
                host_buckets[p.kind].append((h, p))
    params: dict[str, object] = {"tariff": list(tariff)}
    for n, claims in (("h", gpu_buckets["1h"]), ("m", gpu_buckets["1m"])):
        params |= {f"grp{n}": [groups[c.group] for c, _ in claims], f"node{n}": [c.node for c, _ in claims],
                   f"gpu{n}": [c.gpu for c, _ in claims], f"lo{n}": [p.lo for _, p in claims],
                   f"hi{n}": [p.hi for _, p in claims], f"sign{n}": [p.sign for _, p in claims],
                   f"seg{n}": [seg(p) for _, p in claims]}
    for n, hclaims in (("hh", host_buckets["1h"]), ("hm", host_buckets["1m"])):
        params |= {f"grp{n}": [groups[c.group] for c, _ in hclaims], f"node{n}": [c.node for c, _ in hclaims],
                   f"lo{n}": [p.lo for _, p in hclaims], f"hi{n}": [p.hi for _, p in hclaims],
                   f"share{n}": [c.share for c, _ in hclaims], f"sign{n}": [p.sign for _, p in hclaims],
                   f"seg{n}": [seg(p) for _, p in hclaims]}
    _hash_aggregates(conn, True)
    try:
        collect(conn.execute(_ROLLUP_SQL, params).fetchall(), into)
    finally:
        _hash_aggregates(conn, False)
    raw_sums(conn, tariff, raw_gpus, raw_hosts, groups, max_gap_s, into)
    return stale_used
