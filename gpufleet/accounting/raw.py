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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from gpufleet.accounting.claims import Batch, Key, Sums, collect
from gpufleet.accounting.sqlarrays import float_array, int_array, text_array, time_array
from gpufleet.db import energy_sql as E


@dataclass(frozen=True)
class _Table:
    """How to read one kind of samples."""

    name: str
    select: str  # sample columns, node excluded
    match: str  # the claim's rows of the table
    intervals: Callable[[str], str]
    energy: str  # the three sums: GPU joules, covered GPU-seconds, host joules


_GPU = _Table("gpu_samples", "s.gpu, s.time, s.energy_mj, s.power_w",
              "s.node = c.node AND s.gpu = c.gpu AND s.mig_instance IS NULL", E.gpu_interval_select,
              "sum(p.part_j), sum(p.part_s), 0.0::float8")
_HOST = _Table("host_samples", "s.time, s.host_power_w", "s.node = c.node", E.host_interval_select,
               "0.0::float8, 0.0::float8, sum(p.part_j * c.share)")

# Claims = ranges × members of their batch (pid), numbered k.
_CLAIMS = """
c AS (
  SELECT m.grp, m.node, m.gpu, m.share, p.lo, p.hi, row_number() OVER () AS k
  FROM unnest(%(pid)s::int[], %(lo)s::timestamptz[], %(hi)s::timestamptz[]) AS p(pid, lo, hi)
  JOIN unnest(%(mpid)s::int[], %(grp)s::int[], %(node)s::text[], %(gpu)s::smallint[], %(share)s::float8[])
    AS m(pid, grp, node, gpu, share) ON m.pid = p.pid
)"""


def _probes(t: _Table) -> str:
    """The last sample at or before lo, those inside, the first at or after hi."""
    return f"""
  (SELECT {t.select} FROM {t.name} s WHERE {t.match} AND s.time <= c.lo ORDER BY s.time DESC LIMIT 1)
  UNION ALL
  (SELECT {t.select} FROM {t.name} s WHERE {t.match} AND s.time > c.lo AND s.time < c.hi)
  UNION ALL
  (SELECT {t.select} FROM {t.name} s WHERE {t.match} AND s.time >= c.hi ORDER BY s.time LIMIT 1)"""


def _sql(t: _Table) -> str:
    """Each claim's samples made into intervals, split, summed per (group, tariff segment)."""
    edge = "(%(edges)s::timestamptz[])"
    return f"""
WITH {_CLAIMS},
smp AS (SELECT c.k::text AS node, s.* FROM c CROSS JOIN LATERAL ({_probes(t)}) s)
SELECT c.grp, width_bucket({edge}[p.seg], %(tariff)s::timestamptz[]), {t.energy}
FROM ({E.split_by_edges(t.intervals("smp"), "node")}) p JOIN c ON c.k = p.node::bigint
WHERE {edge}[p.seg] >= c.lo AND {edge}[p.seg + 1] <= c.hi
GROUP BY 1, 2"""


_SQL = {"gpu": _sql(_GPU), "host": _sql(_HOST)}


def _params(tariff: Sequence[datetime], batches: Sequence[Batch], max_gap_s: float) -> dict[str, object]:
    ranges = [(pid, lo, hi) for pid, b in enumerate(batches) for lo, hi, _, _ in b.ranges]
    members = [(pid, m) for pid, b in enumerate(batches) for m in b.members]
    # every claim end is an edge too, so each split part lies in one claim and one segment
    edges = sorted({*tariff, *(r[1] for r in ranges), *(r[2] for r in ranges)})
    return {
        "pid": int_array(r[0] for r in ranges), "lo": time_array(r[1] for r in ranges),
        "hi": time_array(r[2] for r in ranges),
        "mpid": int_array(pid for pid, _ in members), "grp": int_array(m.grp for _, m in members),
        "node": text_array(m.node for _, m in members), "gpu": int_array(m.gpu for _, m in members),
        "share": float_array(m.share for _, m in members),
        "edges": time_array(edges), "tariff": time_array(tariff), "max_gap_s": max_gap_s,
    }


def raw_sums(conn: psycopg.Connection, tariff: Sequence[datetime], gpus: Sequence[Batch],
             hosts: Sequence[Batch], max_gap_s: float, into: dict[Key, Sums]) -> None:
    """Add the raw-sample energy of the GPU and host batches to ``into`` per (group number, tariff segment)."""
    for kind, batches in (("gpu", gpus), ("host", hosts)):
        batches = [b for b in batches if b.ranges and b.members]
        if batches:
            collect(conn.execute(_SQL[kind], _params(tariff, batches, max_gap_s)).fetchall(), into)
