"""Sweep shards: detection and rollups split over the collector replicas.

A fleet is cut into ``detect.shards`` shards.  Nodes are hashed to shards
(:func:`shard_of`), and so are runs, by their id.  The owner of a shard

* reports the findings about its runs (a run's straggler, starvation,
  checkpoint stall: ``run_id`` set), computed over every node the run has,
  wherever those nodes hash: the run's data is whole in its shard;
* reports the findings about its nodes and their GPUs that belong to no run;
* resolves only the incidents it owns by the same rule;
* rebuilds the rollups of its nodes.

So each finding is computed by exactly one shard, on the same samples the
unsharded sweep sees for it, and the union over shards is the unsharded
sweep's findings.  A shard is owned by holding a PostgreSQL advisory lock
(:data:`SHARD_LOCK_BASE` + shard) on the owner's lock connection: when an
owner dies its session ends and the lock with it, and another replica takes
the shard on its next balancing tick (restoring the shard's window from
its snapshot, :mod:`gpufleet.collector.window_snapshot`).

The hash is the first 32 bits of the name's MD5, modulo the shard count,
computed the same way in SQL (:func:`shard_sql`) for the rollup queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.collector.detectors.window import Finding, RunInfo
from gpufleet.collector.incidents import Incident

#: Advisory lock keys of the shards: "gpufleet" shifted, plus the shard (distinct from the leader lock).
SHARD_LOCK_BASE = 0x67707566_00000000


def shard_of(name: str, shards: int) -> int:
    """The shard of a node name or run id."""
    if shards <= 1:
        return 0
    return int.from_bytes(hashlib.md5(name.encode(), usedforsecurity=False).digest()[:4], "big") % shards


def shard_sql(column: str, shards: int) -> str:
    """SQL computing :func:`shard_of` of a text column."""
    return f"mod(('x' || substr(md5({column}), 1, 8))::bit(32)::bigint, {int(shards)})"


@dataclass
class ShardScope:
    """What the owner of one shard reads and reports."""

    shard: int
    shards: int
    #: Nodes of the runs this shard owns (their samples are read wherever the nodes hash).
    run_nodes: set[str] = field(default_factory=set)

    def owns_node(self, node: str) -> bool:
        return shard_of(node, self.shards) == self.shard

    def owns_run(self, run_id: str) -> bool:
        return shard_of(run_id, self.shards) == self.shard

    def reads(self, node: str) -> bool:
        """The node's samples are in this shard's window."""
        return node in self.run_nodes or self.owns_node(node)

    def update(self, runs: Iterable[RunInfo]) -> set[str]:
        """Take the runs of this sweep; returns the nodes newly read for them (not hashed here)."""
        nodes = {n for r in runs if self.owns_run(r.run_id) for n, _ in r.allocations}
        new = {n for n in nodes - self.run_nodes if not self.owns_node(n)}
        self.run_nodes = nodes
        return new

    def _owns(self, run_id: str | None, node: str | None) -> bool:
        if run_id is not None:
            return self.owns_run(run_id)
        if node is not None:
            return self.owns_node(node)
        return self.shard == 0

    def owns_finding(self, f: Finding) -> bool:
        return self._owns(f.run_id, f.node)

    def owns_incident(self, i: Incident) -> bool:
        return self._owns(i.run_id, i.node)
