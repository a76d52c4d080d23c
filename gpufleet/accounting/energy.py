"""Energy of GPU and host time claims, split by tariff segment, from raw samples or rollups.

A *claim* (``claims.py``) is a time range [lo, hi) of one GPU (or one host,
with a share) that some group (a run, the idle GPUs, the whole fleet) is
accountable for.  Every claim of one call is split at one sorted array of
tariff edges (``edges[0]`` to ``edges[-1]`` must cover all claims); results
are summed per (group, segment) where segment ``k`` (1-based, as SQL
``width_bucket``) is [edges[k-1], edges[k]).

Two paths give the same numbers by the accounting definition
(``gpufleet.db.energy_sql``): ``raw.py`` reads samples only; ``rollups.py``
reads the hour and minute rollups and samples only for partial minutes and
data the rollup worker has not caught up with.  Only whole-GPU rows
(``mig_instance IS NULL``) count: MIG rows are slices of the same board and
its power.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

import psycopg

from gpufleet.accounting.claims import SOURCES, GpuClaim, HostClaim, Key, Source, Sums, batches
from gpufleet.accounting.raw import raw_sums
from gpufleet.accounting.rollups import rollup_sums, stale_from


@dataclass
class Measured:
    #: per (group, 1-based tariff segment)
    sums: dict[tuple[str, int], Sums]
    #: "raw", "rollup", or "mixed" (rollups where current, raw where data is pending)
    source: str


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
    groups = {g: i for i, g in enumerate(names)}
    sums: dict[Key, Sums] = {}
    used: str = source
    if source == "raw":
        raw_sums(conn, edges, batches(gpus, groups), batches(hosts, groups), max_gap_s, sums)
    else:
        stale_gpu: dict[tuple[str, int], datetime] = {}
        stale_host: dict[str, datetime] = {}
        if source == "auto":
            stale_gpu, stale_host = stale_from(conn, ((c.node, c.gpu) for c in gpus), (h.node for h in hosts))
        stale_used = rollup_sums(conn, edges, gpus, hosts, groups, max_gap_s, stale_gpu, stale_host, sums)
        used = "mixed" if stale_used else "rollup"
    return Measured({(names[g], seg): s for (g, seg), s in sums.items()}, used)


__all__ = ["SOURCES", "GpuClaim", "HostClaim", "Measured", "Source", "Sums", "measure"]
