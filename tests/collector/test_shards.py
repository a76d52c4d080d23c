"""Sweeps sharded over replicas find what one sweep finds; a dead replica's shards move."""

from __future__ import annotations

from typing import Any

import psycopg

from gpufleet.agent.simulator import Fleet
from gpufleet.collector.detectors.window import Finding
from gpufleet.collector.incident_store import clean_json
from gpufleet.collector.shards import ShardScope, shard_of, shard_sql
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings
from gpufleet.testing.simfeed import SimFeed
from tests.collector.test_sweep import register_runs


def key(fs: list[Finding]) -> list[tuple[Any, ...]]:
    return sorted((f.scope_key, f.cause, f.severity, f.start, f.last_active, f.hold_s, repr(clean_json(f.evidence)))
                  for f in fs)


def test_shard_hash_is_the_same_in_sql(conn: psycopg.Connection) -> None:
    names = [f"node-{i:05d}" for i in range(200)] + ["run-α", ""]
    got = conn.execute(f"SELECT n, {shard_sql('n', 7)} FROM unnest(%s::text[]) n", (names,)).fetchall()
    assert {n: int(s) for n, s in got} == {n: shard_of(n, 7) for n in names}
    assert len({shard_of(n, 7) for n in names}) == 7


def test_sharded_sweeps_find_what_one_sweep_finds(conn: psycopg.Connection, settings: Settings) -> None:
    fleet = Fleet.from_scenario("mixed_fleet", seed=3)
    register_runs(conn, fleet)
    shards = 3
    # the runs and nodes really spread: some run's nodes hash to other shards than the run
    scopes = [ShardScope(k, shards) for k in range(shards)]
    assert len({shard_of(r.run_id, shards) for r in fleet.plan.runs}) == shards
    assert len({shard_of(n, shards) for n in fleet.nodes}) == shards
    feed = SimFeed(conn, fleet)
    one = Sweeper(settings)
    parts = [Sweeper(settings, shard=k, shards=shards) for k in range(shards)]
    t = fleet.t0 + 60
    kinds: set[str] = set()
    took_over = False
    while t < fleet.t0 + 1500:
        feed.run_until(t)
        if not took_over and t > fleet.t0 + 1000:
            # shard 1's owner dies; its successor restores the shard's window
            parts[1] = Sweeper(settings, shard=1, shards=shards)
            took_over = True
        one(conn, fleet.t)
        for p in parts:
            p(conn, fleet.t)
        if t > fleet.t0 + 1000 and parts[1].last.get("restored"):
            assert parts[1].last["fetched_rows"] < 0.25 * sum(len(b) for b in parts[1].cache.gpus.values())
        assert key([f for p in parts for f in p.findings]) == key(one.findings), t - fleet.t0
        # every finding comes from exactly one shard
        assert sum(len(p.findings) for p in parts) == len(one.findings)
        kinds |= {f.kind for f in one.findings}
        t += 60
    feed.close()
    assert took_over and kinds >= {"straggler", "throttling", "pcie_degraded", "checkpoint_stall", "starvation"}
    # a shard reads its nodes and its runs' nodes, not the fleet
    for k, p in enumerate(parts):
        nodes = {n for n, _ in p.cache.gpus}
        assert nodes == {n for n in fleet.nodes if scopes[k].owns_node(n)} | p.scope.run_nodes  # type: ignore[union-attr]
        assert nodes != set(fleet.nodes)
    # the incidents are each shard's, opened once: the same set the single sweep keeps
    open_ = conn.execute("SELECT scope_key FROM incidents WHERE state = 'open' ORDER BY 1").fetchall()
    assert [r[0] for r in open_] == sorted({f.scope_key for f in one.findings})
