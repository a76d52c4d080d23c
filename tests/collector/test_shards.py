"""Sweeps sharded over replicas find what one sweep finds; a dead replica's shards move."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from gpufleet.collector import window_cache
from gpufleet.collector.detectors.window import Finding
from gpufleet.collector.incident_store import clean_json
from gpufleet.collector.leader import Leader
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.shards import SHARD_LOCK_BASE, shard_of, shard_sql
from gpufleet.collector.sweep import Sweeper
from gpufleet.collector.window_cache import load_runs
from gpufleet.config import Settings
from gpufleet.sim import Fleet
from tests.collector.test_sweep import register_runs, wait_until
from testsupport.simfeed import SimFeed


def key(fs: list[Finding]) -> list[tuple[Any, ...]]:
    return sorted(
        (f.scope_key, f.cause, f.severity, f.start, f.last_active, f.hold_s, repr(clean_json(f.evidence)))
        for f in fs
    )


def test_shard_hash_is_the_same_in_sql(conn: psycopg.Connection) -> None:
    names = [f"node-{i:05d}" for i in range(200)] + ["run-α", ""]
    got = conn.execute(f"SELECT n, {shard_sql('n', 7)} FROM unnest(%s::text[]) n", (names,)).fetchall()
    assert {n: int(s) for n, s in got} == {n: shard_of(n, 7) for n in names}
    assert len({shard_of(n, 7) for n in names}) == 7


def test_sharded_sweeps_find_what_one_sweep_finds(
    conn: psycopg.Connection, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every batch here is committed before the sweep that reads it (one thread): no re-read slack is
    # needed, and without it batches are not merged twice, as they are not minutes later in real time.
    monkeypatch.setattr(window_cache, "COMMIT_SLACK_S", 0.0)
    fleet = Fleet.from_scenario("mixed_fleet", seed=3)
    register_runs(conn, fleet)
    shards = 3
    # the runs and nodes really spread: some run's nodes hash to other shards than the run
    assert len({shard_of(r.run_id, shards) for r in fleet.plan.runs}) == shards
    assert len({shard_of(n, shards) for n in fleet.nodes}) == shards
    feed = SimFeed(conn, fleet)
    one = Sweeper(settings)
    parts = [Sweeper(settings, shard=k, shards=shards) for k in range(shards)]
    # Runs start between 0 and 90 s: sweeps from 15 s see runs reach nodes hashed to other shards (those
    # nodes' windows are read then, and the shard's persisted segments rewritten).  Two owners die: shard 1's
    # soon after (its successor's window must include what the moved nodes did before they moved) and
    # shard 0's later.
    t = fleet.t0 + 15
    kinds: set[str] = set()
    takeovers = {1: fleet.t0 + 120, 0: fleet.t0 + 1000}
    done: list[int] = []
    while t < fleet.t0 + 1500:
        feed.run_until(t)
        for k, at in takeovers.items():
            if k not in done and t > at:
                parts[k] = Sweeper(settings, shard=k, shards=shards)
                done.append(k)
        one(conn, fleet.t)
        for p in parts:
            p(conn, fleet.t)
        for k in done:
            sn = parts[k].snapshots
            if parts[k].last.get("restored") and sn is not None:
                # the takeover read from the sample tables only the tail after the last segment
                # (sweeps here are a minute of data apart) and nodes its runs reached since
                c = parts[k].cache
                tail = sum(
                    int((b.t >= sn.restored_upto).sum()) for b in [*c.gpus.values(), *c.hosts.values()]
                )
                assert (
                    sn.restored_samples > 0
                    and parts[k].last["fetched_rows"] <= tail + 0.1 * sn.restored_samples
                )
        assert key([f for p in parts for f in p.findings]) == key(one.findings), t - fleet.t0
        # each shard's window holds exactly the single sweep's samples of the nodes it reads
        runs = load_runs(conn, fleet.t - one.cache.window_s, fleet.t)
        w1 = one.cache.window(fleet.t, runs, {})
        for p in parts:
            assert p.scope is not None
            wp = p.cache.window(fleet.t, runs, {})
            assert set(wp.gpus) == {g for g in w1.gpus if p.scope.reads(g[0])}, t - fleet.t0
            assert set(wp.hosts) == {h for h in w1.hosts if p.scope.reads(h)}, t - fleet.t0
            for name in ("gpus", "hosts"):
                for g, ser in getattr(wp, name).items():
                    ref = getattr(w1, name)[g]
                    assert np.array_equal(ser.t, ref.t), (t - fleet.t0, g)
                    assert all(
                        np.array_equal(ser.get(c), ref.get(c), equal_nan=True)
                        for c in set(ref.cols) | set(ser.cols)
                    ), g
        # every finding comes from exactly one shard
        assert sum(len(p.findings) for p in parts) == len(one.findings)
        kinds |= {f.kind for f in one.findings}
        t += 60
    took_over = done == [1, 0] and all(p.snapshots is not None for p in parts)
    feed.close()
    assert took_over and kinds >= {
        "straggler",
        "throttling",
        "pcie_degraded",
        "checkpoint_stall",
        "starvation",
    }
    # a shard reads its nodes and its runs' nodes, not the fleet
    for p in parts:
        nodes = {n for n, _ in p.cache.gpus}
        assert p.scope is not None and nodes == {n for n in fleet.nodes if p.scope.reads(n)}
        assert nodes != set(fleet.nodes)
    # the incidents are each shard's, opened once: the same set the single sweep keeps
    open_ = conn.execute("SELECT scope_key FROM incidents WHERE state = 'open' ORDER BY 1").fetchall()
    assert [r[0] for r in open_] == sorted({f.scope_key for f in one.findings})


REPLICA = """
import sys, threading
from gpufleet.collector.leader import Leader
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.config import load_settings
s = load_settings(data_dir=sys.argv[2])
s = s.model_copy(update={"detect": s.detect.model_copy(update={"sweep_interval_s": 0.5, "shards": 4})})
Leader(sys.argv[1], s, CollectorMetrics(), shard_sweep=lambda k: (lambda conn, now: None),
       rollup_interval_s=0.1, balance_interval_s=0.2).start()
print("started", flush=True)
threading.Event().wait()
"""


def shard_locks(conn: psycopg.Connection) -> dict[int, int]:
    """Shard -> pid of the session holding its lock."""
    rows = conn.execute(
        "SELECT (classid::bigint << 32) | objid::bigint, pid FROM pg_locks "
        "WHERE locktype = 'advisory' AND granted AND objsubid = 1"
    ).fetchall()
    return {int(k) - SHARD_LOCK_BASE: pid for k, pid in rows if 0 <= int(k) - SHARD_LOCK_BASE < 1000}


@pytest.mark.timeout(180)
def test_a_dead_replicas_shards_move(db: str, settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(
        update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 0.5, "shards": 4})}
    )
    swept: dict[int, list[float]] = {}
    lock = threading.Lock()

    def shard_sweep(k: int) -> Callable[[psycopg.Connection, float], None]:
        def sweep(conn: psycopg.Connection, now: float) -> None:
            with lock:
                swept.setdefault(k, []).append(time.monotonic())

        return sweep

    other = subprocess.Popen(
        [sys.executable, "-c", REPLICA, db, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    b = Leader(
        db, s, CollectorMetrics(), shard_sweep=shard_sweep, rollup_interval_s=0.1, balance_interval_s=0.2
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "started"
        with psycopg.connect(db, autocommit=True) as conn:
            wait_until(lambda: len(shard_locks(conn)) == 4, 60, "the other replica holds every shard")
            b.start()
            # the newcomer gets its share: two shards each, each shard held once
            wait_until(lambda: len(b.held) == 2 and len(shard_locks(conn)) == 4, 60, "the shards are shared")
            locks = shard_locks(conn)
            theirs = {k for k, pid in locks.items() if pid != b.lock_pid}
            assert len(theirs) == 2 and not theirs & set(b.held)
            wait_until(lambda: all(swept.get(k) for k in b.held), 30, "the newcomer sweeps its shards")
            other.kill()  # SIGKILL: no goodbye, the database notices the session end
            killed = time.monotonic()
            other.wait(10)

            def moved() -> bool:
                with lock:
                    return all(any(t > killed for t in swept.get(k, [])) for k in theirs)

            took = wait_until(moved, 30, "the dead replica's shards are swept by the survivor")
            assert set(b.held) == {0, 1, 2, 3} and set(shard_locks(conn).values()) == {b.lock_pid}
            # within a balancing tick and a sweep, with room for a loaded machine
            assert took < s.detect.sweep_interval_s + 0.2 + 5.0, took
    finally:
        other.kill()
        b.stop()


def test_rollups_follow_the_shards_nodes(conn: psycopg.Connection) -> None:
    from gpufleet.collector import rollup

    nodes = [f"node-{i:03d}" for i in range(30)]
    conn.execute(
        "INSERT INTO rollup_queue (node, t_min, t_max) SELECT n, now() - interval '1 min', now() "
        "FROM unnest(%s::text[]) n",
        (nodes,),
    )
    from gpufleet.db.policies import backend_of

    # the stats tables are the collector's own only on plain PostgreSQL (continuous aggregates on TimescaleDB)
    res = rollup.run_once(conn, 300.0, backend_of(conn) != "timescaledb", shards=(3, [0, 2]))
    left = {r[0] for r in conn.execute("SELECT node FROM rollup_queue").fetchall()}
    assert left == {n for n in nodes if shard_of(n, 3) == 1} and 0 < len(left) < len(nodes)
    assert res.ranges == len(nodes) - len(left)
