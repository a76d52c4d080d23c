"""Energy of GPU and host time claims, split by tariff segment, from raw samples or rollups.

A *claim* is a time range [lo, hi) of one GPU (or one host, with a share)
that some group (a run, the idle GPUs, the whole fleet) is accountable for.
Every claim of one call is split at one sorted array of tariff edges
(``edges[0]`` to ``edges[-1]`` must cover all claims); results are summed per
(group, segment) where segment ``k`` (1-based, as SQL ``width_bucket``) is
[edges[k-1], edges[k]).

Two paths give the same numbers by the accounting definition
(``gpufleet.db.energy_sql``):

- raw: each claim's samples, from the last at or before ``lo`` to the first
  at or after ``hi`` (so intervals straddling the claim's ends are included),
  made into intervals by ``gpu_interval_select`` and spread over the tariff
  edges and claim ends with ``split_by_edges``;
- rollup: whole hours from ``gpu_energy_1h``, whole minutes from
  ``gpu_energy_1m`` and the raw path for the rest (partial minutes at
  unaligned edges, and everything a pending rollup-queue row may change).

Only whole-GPU rows (``mig_instance IS NULL``) count: MIG rows are slices of
the same board and its power.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Literal

import psycopg

from gpufleet.accounting.timegrid import Piece, plan_pieces
from gpufleet.db import energy_sql as E

Source = Literal["auto", "rollup", "raw"]
SOURCES: tuple[Source, ...] = ("auto", "rollup", "raw")


@dataclass(frozen=True)
class GpuClaim:
    group: str
    node: str
    gpu: int
    lo: datetime
    hi: datetime


@dataclass(frozen=True)
class HostClaim:
    """Host energy of ``node`` over [lo, hi), times ``share`` (GPUs held ÷ GPUs the node reports)."""

    group: str
    node: str
    lo: datetime
    hi: datetime
    share: float


@dataclass
class Sums:
    """Energy of a (group, segment): GPU joules, covered GPU-seconds, share-weighted host joules."""

    gpu_j: float = 0.0
    gpu_covered_s: float = 0.0
    host_j: float = 0.0

    def add(self, other: Sums) -> None:
        self.gpu_j += other.gpu_j
        self.gpu_covered_s += other.gpu_covered_s
        self.host_j += other.host_j


Key = tuple[str, int]  # (group, 1-based tariff segment)


@dataclass
class Measured:
    sums: dict[Key, Sums]
    #: "raw", "rollup", or "mixed" (rollups where current, raw where data is pending)
    source: str


# ------------------------------------------------------------------ raw

# The samples a claim needs: the last at or before lo, those inside, the first at
# or after hi (so that intervals straddling the claim's ends are included).
# Three index probes in a lateral subquery, which the planner cannot flatten
# into a table scan: it cannot see how narrow [lo, hi] is.
_GPU_PROBES = """
  (SELECT s.gpu, s.time, s.energy_mj, s.power_w FROM gpu_samples s
   WHERE s.node = c.node AND s.gpu = c.gpu AND s.mig_instance IS NULL AND s.time <= c.lo
   ORDER BY s.time DESC LIMIT 1)
  UNION ALL
  (SELECT s.gpu, s.time, s.energy_mj, s.power_w FROM gpu_samples s
   WHERE s.node = c.node AND s.gpu = c.gpu AND s.mig_instance IS NULL AND s.time > c.lo AND s.time < c.hi)
  UNION ALL
  (SELECT s.gpu, s.time, s.energy_mj, s.power_w FROM gpu_samples s
   WHERE s.node = c.node AND s.gpu = c.gpu AND s.mig_instance IS NULL AND s.time >= c.hi
   ORDER BY s.time LIMIT 1)"""

_HOST_PROBES = """
  (SELECT s.time, s.host_power_w FROM host_samples s
   WHERE s.node = c.node AND s.time <= c.lo ORDER BY s.time DESC LIMIT 1)
  UNION ALL
  (SELECT s.time, s.host_power_w FROM host_samples s
   WHERE s.node = c.node AND s.time > c.lo AND s.time < c.hi)
  UNION ALL
  (SELECT s.time, s.host_power_w FROM host_samples s
   WHERE s.node = c.node AND s.time >= c.hi ORDER BY s.time LIMIT 1)"""

# The interval select pairs consecutive samples per (node, gpu); each claim's
# samples are given the claim's number as their "node", so that every claim is
# a sequence of its own (claims of one GPU may share samples) and its parts
# join back to it by equality.  Parts outside the claim's [lo, hi) (the shares
# of the straddling intervals) are dropped.
_GPU_RAW_SQL = f"""
WITH c AS (
  SELECT * FROM unnest(%(grp)s::int[], %(node)s::text[], %(gpu)s::smallint[], %(lo)s::timestamptz[],
                       %(hi)s::timestamptz[]) WITH ORDINALITY AS c(grp, node, gpu, lo, hi, k)
), smp AS (
  SELECT c.k::text AS node, s.* FROM c CROSS JOIN LATERAL ({_GPU_PROBES}) s
), parts AS ({E.split_by_edges(E.gpu_interval_select("smp"), "node")})
SELECT c.grp, width_bucket((%(edges)s::timestamptz[])[p.seg], %(tariff)s::timestamptz[]) AS tseg,
       sum(p.part_j), sum(p.part_s), 0.0::float8
FROM parts p JOIN c ON c.k = p.node::bigint
WHERE (%(edges)s::timestamptz[])[p.seg] >= c.lo AND (%(edges)s::timestamptz[])[p.seg + 1] <= c.hi
GROUP BY 1, 2"""

_HOST_RAW_SQL = f"""
WITH c AS (
  SELECT * FROM unnest(%(grp)s::int[], %(node)s::text[], %(lo)s::timestamptz[], %(hi)s::timestamptz[],
                       %(share)s::float8[]) WITH ORDINALITY AS c(grp, node, lo, hi, share, k)
), smp AS (
  SELECT c.k::text AS node, s.* FROM c CROSS JOIN LATERAL ({_HOST_PROBES}) s
), parts AS ({E.split_by_edges(E.host_interval_select("smp"), "node")})
SELECT c.grp, width_bucket((%(edges)s::timestamptz[])[p.seg], %(tariff)s::timestamptz[]) AS tseg,
       0.0::float8, 0.0::float8, sum(p.part_j * c.share)
FROM parts p JOIN c ON c.k = p.node::bigint
WHERE (%(edges)s::timestamptz[])[p.seg] >= c.lo AND (%(edges)s::timestamptz[])[p.seg + 1] <= c.hi
GROUP BY 1, 2"""


def _cut_edges(tariff: Sequence[datetime], ranges: Iterable[tuple[datetime, datetime]]) -> list[datetime]:
    """Tariff edges plus every claim end, so each split part lies in one claim and one segment."""
    out = set(tariff)
    for lo, hi in ranges:
        out.add(lo)
        out.add(hi)
    return sorted(out)


def _collect(rows: Iterable[tuple[int, int, float, float, float]], names: Sequence[str],
             into: dict[Key, Sums]) -> None:
    for grp, seg, gpu_j, gpu_s, host_j in rows:
        into.setdefault((names[grp], int(seg)), Sums()).add(Sums(gpu_j or 0.0, gpu_s or 0.0, host_j or 0.0))


def _raw(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[GpuClaim],
         hosts: Sequence[HostClaim], names: Sequence[str], index: Mapping[str, int], max_gap_s: float,
         into: dict[Key, Sums]) -> None:
    if gpus:
        params = {"grp": [index[c.group] for c in gpus], "node": [c.node for c in gpus],
                  "gpu": [c.gpu for c in gpus], "lo": [c.lo for c in gpus], "hi": [c.hi for c in gpus],
                  "edges": _cut_edges(tariff, ((c.lo, c.hi) for c in gpus)), "tariff": list(tariff),
                  "max_gap_s": max_gap_s}
        _collect(conn.execute(_GPU_RAW_SQL, params).fetchall(), names, into)
    if hosts:
        params = {"grp": [index[c.group] for c in hosts], "node": [c.node for c in hosts],
                  "lo": [c.lo for c in hosts], "hi": [c.hi for c in hosts], "share": [c.share for c in hosts],
                  "edges": _cut_edges(tariff, ((c.lo, c.hi) for c in hosts)), "tariff": list(tariff),
                  "max_gap_s": max_gap_s}
        _collect(conn.execute(_HOST_RAW_SQL, params).fetchall(), names, into)


# ------------------------------------------------------------------ rollups

_SEGMENT = "CASE WHEN r.seg > 0 THEN r.seg ELSE width_bucket(e.bucket, %(tariff)s::timestamptz[]) END"


def _gpu_rollup_sql(table: str, n: str) -> str:
    return f"""
SELECT r.grp, {_SEGMENT}, sum(r.sign * e.energy_j), sum(r.sign * e.covered_s), 0.0::float8
FROM unnest(%(grp{n})s::int[], %(node{n})s::text[], %(gpu{n})s::smallint[], %(lo{n})s::timestamptz[],
            %(hi{n})s::timestamptz[], %(sign{n})s::int[], %(seg{n})s::int[]) AS r(grp, node, gpu, lo, hi, sign, seg)
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j, e.covered_s FROM {table} e
  WHERE e.node = r.node AND e.gpu = r.gpu AND e.bucket >= r.lo AND e.bucket < r.hi OFFSET 0) e
GROUP BY 1, 2"""


def _host_rollup_sql(table: str, n: str) -> str:
    return f"""
SELECT r.grp, {_SEGMENT}, 0.0::float8, 0.0::float8, sum(r.sign * e.energy_j * r.share)
FROM unnest(%(grp{n})s::int[], %(node{n})s::text[], %(lo{n})s::timestamptz[], %(hi{n})s::timestamptz[],
            %(share{n})s::float8[], %(sign{n})s::int[], %(seg{n})s::int[]) AS r(grp, node, lo, hi, share, sign, seg)
CROSS JOIN LATERAL (SELECT e.bucket, e.energy_j FROM {table} e
  WHERE e.node = r.node AND e.bucket >= r.lo AND e.bucket < r.hi OFFSET 0) e
GROUP BY 1, 2"""


_ROLLUP_SQL = " UNION ALL ".join([
    _gpu_rollup_sql("gpu_energy_1h", "h"), _gpu_rollup_sql("gpu_energy_1m", "m"),
    _host_rollup_sql("host_energy_1h", "hh"), _host_rollup_sql("host_energy_1m", "hm"),
])


def _rollup(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[GpuClaim],
            hosts: Sequence[HostClaim], names: Sequence[str], index: Mapping[str, int], max_gap_s: float,
            stale_gpu: Mapping[tuple[str, int], datetime], stale_host: Mapping[str, datetime],
            into: dict[Key, Sums]) -> bool:
    """Answer from rollups where they are current; returns whether any raw work was for stale data."""
    buckets: dict[str, list[tuple[GpuClaim, Piece]]] = {"1h": [], "1m": []}
    host_buckets: dict[str, list[tuple[HostClaim, Piece]]] = {"1h": [], "1m": []}
    raw_gpus: list[GpuClaim] = []
    raw_hosts: list[HostClaim] = []
    stale_used = False
    plans: dict[tuple[datetime, datetime, datetime | None], list[Piece]] = {}

    def plan(lo: datetime, hi: datetime, stale: datetime | None) -> list[Piece]:
        # claims of one run share their window: plan it once
        key = (lo, hi, stale)
        if key not in plans:
            plans[key] = plan_pieces(lo, hi, tariff, stale)
        return plans[key]

    for c in gpus:
        stale = stale_gpu.get((c.node, c.gpu))
        stale_used |= stale is not None and stale < c.hi
        for p in plan(c.lo, c.hi, stale):
            if p.kind == "raw":
                raw_gpus.append(GpuClaim(c.group, c.node, c.gpu, p.lo, p.hi))
            else:
                buckets[p.kind].append((c, p))
    for h in hosts:
        stale = stale_host.get(h.node)
        stale_used |= stale is not None and stale < h.hi
        for p in plan(h.lo, h.hi, stale):
            if p.kind == "raw":
                raw_hosts.append(HostClaim(h.group, h.node, p.lo, p.hi, h.share))
            else:
                host_buckets[p.kind].append((h, p))

    def seg(p: Piece) -> int:
        return 0 if p.seg_at is None else bisect.bisect_right(tariff, p.seg_at)  # as width_bucket

    params: dict[str, object] = {"tariff": list(tariff)}
    for n, claims in (("h", buckets["1h"]), ("m", buckets["1m"])):
        params |= {f"grp{n}": [index[c.group] for c, _ in claims], f"node{n}": [c.node for c, _ in claims],
                   f"gpu{n}": [c.gpu for c, _ in claims], f"lo{n}": [p.lo for _, p in claims],
                   f"hi{n}": [p.hi for _, p in claims], f"sign{n}": [p.sign for _, p in claims],
                   f"seg{n}": [seg(p) for _, p in claims]}
    for n, hclaims in (("hh", host_buckets["1h"]), ("hm", host_buckets["1m"])):
        params |= {f"grp{n}": [index[c.group] for c, _ in hclaims], f"node{n}": [c.node for c, _ in hclaims],
                   f"lo{n}": [p.lo for _, p in hclaims], f"hi{n}": [p.hi for _, p in hclaims],
                   f"share{n}": [c.share for c, _ in hclaims], f"sign{n}": [p.sign for _, p in hclaims],
                   f"seg{n}": [seg(p) for _, p in hclaims]}
    _collect(conn.execute(_ROLLUP_SQL, params).fetchall(), names, into)
    _raw(conn, tariff, raw_gpus, raw_hosts, names, index, max_gap_s, into)
    return stale_used


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


# ------------------------------------------------------------------ entry point

def measure(conn: psycopg.Connection, tariff_edges: Sequence[datetime], gpus: Sequence[GpuClaim],
            hosts: Sequence[HostClaim], *, max_gap_s: float, source: Source = "auto") -> Measured:
    """Sum claim energy per (group, tariff segment) by ``source``.

    ``auto`` uses rollups wherever no pending rollup-queue row can still
    change them and raw samples elsewhere; ``rollup`` trusts the rollups
    everywhere (call after ``collector.rollup.drain``); ``raw`` never reads
    them.  Rollups are built with ``settings.accounting.max_gap_s``; a
    different ``max_gap_s`` changes only the raw parts.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    edges = list(tariff_edges)
    if len(edges) < 2 or any(b <= a for a, b in pairwise(edges)):
        raise ValueError("tariff edges must be at least two strictly increasing times")
    spans: list[tuple[datetime, datetime]] = [(c.lo, c.hi) for c in gpus] + [(h.lo, h.hi) for h in hosts]
    for lo, hi in spans:
        if lo < edges[0] or hi > edges[-1] or hi < lo:
            raise ValueError(f"claim [{lo}, {hi}) lies outside the tariff edges")
    gpus = [c for c in gpus if c.lo < c.hi]
    hosts = [h for h in hosts if h.lo < h.hi and h.share > 0]
    names = sorted({c.group for c in gpus} | {h.group for h in hosts})
    index = {g: i for i, g in enumerate(names)}
    sums: dict[Key, Sums] = defaultdict(Sums)
    if source == "raw":
        _raw(conn, edges, gpus, hosts, names, index, max_gap_s, sums)
        return Measured(dict(sums), "raw")
    stale_gpu: dict[tuple[str, int], datetime] = {}
    stale_host: dict[str, datetime] = {}
    if source == "auto":
        stale_gpu, stale_host = stale_from(conn, ((c.node, c.gpu) for c in gpus), (h.node for h in hosts))
    stale_used = _rollup(conn, edges, gpus, hosts, names, index, max_gap_s, stale_gpu, stale_host, sums)
    return Measured(dict(sums), "mixed" if stale_used else "rollup")


__all__ = ["SOURCES", "GpuClaim", "HostClaim", "Measured", "Piece", "Source", "Sums", "measure", "stale_from"]
