"""Claim energy straight from raw samples, by the accounting definition (``gpufleet.db.energy_sql``).

Each claim needs its samples from the last at or before ``lo`` to the first
at or after ``hi``, so that the intervals straddling its ends are included
(their shares inside count).  The interval select pairs consecutive samples
per (node, gpu); each claim's samples are given the claim's number as their
"node", so every claim is a sequence of its own (claims of one GPU may share
samples) and its parts join back to it by equality.  Parts are split at the
tariff edges and the claim ends, and those outside the claim are dropped.

Fetching the samples is most of the work for short claims (the partial
minutes of the rollup path): three index probes per claim (the last sample
at or before lo, those inside, the first at or after hi) read the fewest
rows; a wider range scan reads more heap rows than the probes it saves.
The probes are lateral subqueries, which the planner cannot flatten into a
table scan (it cannot see how narrow each range is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from gpufleet.accounting.claims import GpuClaim, HostClaim, Key, Sums, collect
from gpufleet.db import energy_sql as E


@dataclass(frozen=True)
class _Table:
    """How to read one kind of samples."""

    claims: str  # unnest(...) AS c(grp, node, [gpu,] lo, hi, share, k)
    select: str  # sample columns, node excluded
    match: str  # the claim's rows of the table
    intervals: Callable[[str], str]


_GPU = _Table(
    claims="unnest(%(grp)s::int[], %(node)s::text[], %(gpu)s::smallint[], %(lo)s::timestamptz[], "
           "%(hi)s::timestamptz[], %(share)s::float8[]) WITH ORDINALITY AS c(grp, node, gpu, lo, hi, share, k)",
    select="s.gpu, s.time, s.energy_mj, s.power_w",
    match="s.node = c.node AND s.gpu = c.gpu AND s.mig_instance IS NULL",
    intervals=E.gpu_interval_select,
)
_HOST = _Table(
    claims="unnest(%(grp)s::int[], %(node)s::text[], %(lo)s::timestamptz[], %(hi)s::timestamptz[], "
           "%(share)s::float8[]) WITH ORDINALITY AS c(grp, node, lo, hi, share, k)",
    select="s.time, s.host_power_w",
    match="s.node = c.node",
    intervals=E.host_interval_select,
)


def _probes(t: _Table, table: str) -> str:
    """The last sample at or before lo, those inside, the first at or after hi."""
    return f"""
  (SELECT {t.select} FROM {table} s WHERE {t.match} AND s.time <= c.lo ORDER BY s.time DESC LIMIT 1)
  UNION ALL
  (SELECT {t.select} FROM {table} s WHERE {t.match} AND s.time > c.lo AND s.time < c.hi)
  UNION ALL
  (SELECT {t.select} FROM {table} s WHERE {t.match} AND s.time >= c.hi ORDER BY s.time LIMIT 1)"""


def _sql(t: _Table, table: str, energy: str) -> str:
    """Each claim's samples made into intervals, split, summed per (group, tariff segment)."""
    edge = "(%(edges)s::timestamptz[])"
    return f"""
WITH c AS (SELECT * FROM {t.claims}),
smp AS (SELECT c.k::text AS node, s.* FROM c CROSS JOIN LATERAL ({_probes(t, table)}) s)
SELECT c.grp, width_bucket({edge}[p.seg], %(tariff)s::timestamptz[]), {energy}
FROM ({E.split_by_edges(t.intervals("smp"), "node")}) p JOIN c ON c.k = p.node::bigint
WHERE {edge}[p.seg] >= c.lo AND {edge}[p.seg + 1] <= c.hi
GROUP BY 1, 2"""


_GPU_ENERGY = "sum(p.part_j), sum(p.part_s), 0.0::float8"
_HOST_ENERGY = "0.0::float8, 0.0::float8, sum(p.part_j * c.share)"
_SQL = {"gpu": _sql(_GPU, "gpu_samples", _GPU_ENERGY), "host": _sql(_HOST, "host_samples", _HOST_ENERGY)}


def _cut_edges(tariff: Sequence[datetime], claims: Iterable[GpuClaim | HostClaim]) -> list[datetime]:
    """Tariff edges plus every claim end, so each split part lies in one claim and one segment."""
    out = set(tariff)
    for c in claims:
        out.add(c.lo)
        out.add(c.hi)
    return sorted(out)


def _params(tariff: Sequence[datetime], claims: Sequence[GpuClaim] | Sequence[HostClaim], groups: dict[str, int],
            max_gap_s: float) -> dict[str, object]:
    return {
        "grp": [groups[c.group] for c in claims], "node": [c.node for c in claims],
        "gpu": [c.gpu if isinstance(c, GpuClaim) else 0 for c in claims],
        "lo": [c.lo for c in claims], "hi": [c.hi for c in claims],
        "share": [c.share if isinstance(c, HostClaim) else 1.0 for c in claims],
        "edges": _cut_edges(tariff, claims), "tariff": list(tariff), "max_gap_s": max_gap_s,
    }


def _one_kind(conn: psycopg.Connection, kind: str, tariff: Sequence[datetime],
              claims: Sequence[GpuClaim] | Sequence[HostClaim], groups: dict[str, int], max_gap_s: float,
              into: dict[Key, Sums]) -> None:
    if not claims:
        return
    collect(conn.execute(_SQL[kind], _params(tariff, claims, groups, max_gap_s)).fetchall(), into)


def raw_sums(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[GpuClaim],
             hosts: Sequence[HostClaim], groups: dict[str, int], max_gap_s: float, into: dict[Key, Sums]) -> None:
    """Add the raw-sample energy of ``gpus`` and ``hosts`` to ``into`` per (group number, tariff segment)."""
    _one_kind(conn, "gpu", tariff, gpus, groups, max_gap_s, into)
    _one_kind(conn, "host", tariff, hosts, groups, max_gap_s, into)
