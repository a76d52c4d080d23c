"""Sweep shards: detection and rollups split over the collector replicas.

A fleet is cut into ``detect.shards`` shards.  Runs are hashed to shards
(:func:`shard_of`) by their id; a node sits with its run, and a node in no
run is hashed by its name.  The owner of a shard

* reports the findings about its runs (a run's straggler, starvation,
  checkpoint stall: ``run_id`` set), computed over every node the run has,
  wherever those nodes hash: the run's data is whole in its shard;
* reports the findings about the nodes and GPUs that belong to no run: the
  nodes its runs run on (of the smallest run id, when a node hosts several)
  and, among the nodes in no run, those hashed to it;
* resolves only the incidents it owns by the same rule;
* rebuilds the rollups of the nodes hashed to it (by name alone: rollups
  need no run's data together).

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
    #: Nodes of the runs this shard owns (their samples are read wherever the nodes live).
    run_nodes: set[str] = field(default_factory=set)
    #: Node -> the shard of the run it runs (of the smallest run id when several): a node's own
    #: findings go with its run's, so a shard mostly reads only its runs' nodes.  Nodes in no run hash.
    node_home: dict[str, int] = field(default_factory=dict)

    def _home(self, node: str, home: dict[str, int]) -> int:
        h = home.get(node)
        return shard_of(node, self.shards) if h is None else h

    def owns_node(self, node: str) -> bool:
        return self._home(node, self.node_home) == self.shard

    def owns_run(self, run_id: str) -> bool:
        return shard_of(run_id, self.shards) == self.shard

    def reads(self, node: str) -> bool:
        """The node's samples are in this shard's window."""
        return node in self.run_nodes or self.owns_node(node)

    def update(self, runs: Iterable[RunInfo]) -> set[str]:
        """Take the runs of this sweep; returns the nodes it reads now and did not read before."""
        runs = sorted(runs, key=lambda r: r.run_id)
        old_nodes, old_home = self.run_nodes, self.node_home
        home: dict[str, int] = {}
        for r in runs:
            k = shard_of(r.run_id, self.shards)
            for n, _ in r.allocations:
                home.setdefault(n, k)
        self.node_home = home
        self.run_nodes = {n for r in runs if self.owns_run(r.run_id) for n, _ in r.allocations}
        # only nodes in a run now or before can change hands
        return {
            n
            for n in self.run_nodes | set(old_home) | set(home)
            if self.reads(n) and not (n in old_nodes or self._home(n, old_home) == self.shard)
        }

    def owns(self, run_id: str | None, node: str | None) -> bool:
        """Whether this shard answers for what is about ``run_id`` (or, in no run, ``node``)."""
        if run_id is not None:
            return self.owns_run(run_id)
        if node is not None:
            return self.owns_node(node)
        return self.shard == 0

    def owns_finding(self, f: Finding) -> bool:
        return self.owns(f.run_id, f.node)

    def owns_incident(self, i: Incident) -> bool:
        return self.owns(i.run_id, i.node)
