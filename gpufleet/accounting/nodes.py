"""How many GPUs a node has, for splitting its host energy among the runs on it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import psycopg

from gpufleet.accounting.timegrid import HOUR_US, floor_to

# The node's own report (``nodes.gpu_count``, the collector keeps the most
# whole GPUs seen), else the whole GPUs in its hourly rollups, else in its raw
# samples, over the window.
_COUNT_SQL = """
SELECT n.node, COALESCE(
  (SELECT gpu_count FROM nodes WHERE node = n.node),
  (SELECT NULLIF(count(DISTINCT gpu), 0) FROM gpu_energy_1h e
   WHERE e.node = n.node AND e.bucket >= %(hlo)s AND e.bucket < %(hi)s),
  (SELECT NULLIF(count(DISTINCT gpu), 0) FROM gpu_samples s
   WHERE s.node = n.node AND s.time >= %(lo)s AND s.time <= %(hi)s AND s.mig_instance IS NULL))
FROM unnest(%(nodes)s::text[]) AS n(node)"""


def node_gpu_counts(conn: psycopg.Connection, nodes: Iterable[str], lo: datetime, hi: datetime) -> dict[str, int]:
    """GPUs each node reports (0 when nothing is known)."""
    node_list = sorted(set(nodes))
    if not node_list:
        return {}
    rows = conn.execute(_COUNT_SQL, {"nodes": node_list, "lo": lo, "hi": hi,
                                     "hlo": floor_to(lo, HOUR_US)}).fetchall()
    return {n: int(c or 0) for n, c in rows}


def host_shares(held: Mapping[str, int], reported: Mapping[str, int]) -> dict[str, float]:
    """GPUs held ÷ GPUs the node reports; a node reporting fewer GPUs than are held
    (or none) counts as having exactly the held ones, so a share never exceeds 1."""
    return {n: h / max(reported.get(n, 0), h) for n, h in held.items() if h > 0}
