"""Scenarios 5 and 14: a slow database, and one of two collector replicas dying.

Slow database: the fault proxy between the collector and PostgreSQL delays
every packet, so commits take many times longer.  The collector's queue is
bounded (``queue_max_rows``; set small here because each agent has one
request in flight, so a handful of agents can only fill a small queue):
beyond it ingest answers 429 with Retry-After
instead of buffering, so its memory stays flat while agents keep the
backlog in their spools, and everything lands once the database is fast
again.

Scale-out: two replicas behind a round-robin balancer; the leader is killed
-9.  Agents' requests move to the survivor, which takes over the advisory
lock and keeps sweeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

from tests.reliability.conftest import knob, node_tokens
from tests.scrape import sample_value
from testsupport.faultproxy import fault_proxy
from testsupport.fleet import Fleet
from testsupport.oracle import integrity
from testsupport.procs import CollectorProc


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"{parts.username}@127.0.0.1:{port}", parts.path, parts.query, ""))


def _commit_ms(url: str) -> float:
    """Median round trip of a one-row INSERT ... COMMIT through ``url``, ms."""
    times = []
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TEMP TABLE probe (x int)")
        for _ in range(5):
            t = time.perf_counter()
            c.execute("INSERT INTO probe VALUES (1)")
            times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[2]


def test_slow_database_bounded_memory_and_no_loss(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    n_agents = int(knob("s5_agents", 8, 50))
    slow_s = knob("s5_slow_s", 15, 120)
    latency = knob("s5_latency_s", 0.15, 0.15)
    tokens = node_tokens(fresh_db, [f"slow-{i:02d}" for i in range(n_agents)])
    with fault_proxy(urlsplit(fresh_db).port or 5432) as proxy:
        db_via = _via(fresh_db, proxy.port)
        base_ms = _commit_ms(db_via)
        col = collectors(db_via, {"ingest": {"queue_max_rows": 150, "group_max_rows": 300}, "leader": False})
        col.start().wait_up()
        fleet = Fleet(
            tokens,
            col.url,
            tmp_path / "spools",
            interval_s=0.1,
            ship_interval_s=0.5,
            retry_base_s=0.2,
            retry_max_s=2.0,
        )
        rss: list[int] = []
        try:
            fleet.start()
            time.sleep(3)
            rss_before = col.rss_bytes()
            proxy.set_mode("pass", latency_s=latency)
            slow_ms = _commit_ms(db_via)
            t0 = time.monotonic()
            while time.monotonic() - t0 < slow_s:
                rss.append(col.rss_bytes())
                time.sleep(0.5)
            retried = {
                k: sum(
                    a.metrics.value("gpufleet_agent_batches_retried_total", reason=k) for a in fleet.agents
                )
                for k in ("429", "503", "timeout", "connection")
            }
            proxy.set_mode("pass", latency_s=0.0)
            fleet.stop_sampling()
            drain_s = fleet.wait_drained(timeout=120)
            tot = fleet.totals()
            result = integrity(fresh_db, fleet.oracle)
        finally:
            fleet.close()
            col.kill()
    growth_mb = (max(rss) - rss_before) / 2**20
    figures.update(
        agents=n_agents,
        commit_ms_baseline=round(base_ms, 2),
        commit_ms_slow=round(slow_ms, 2),
        slowdown=round(slow_ms / base_ms, 1),
        rss_before_mb=round(rss_before / 2**20, 1),
        rss_growth_max_mb=round(growth_mb, 1),
        retried=retried,
        drain_s=round(drain_s, 1),
        spooled=tot.spooled,
        delivered=tot.delivered,
        **result.as_dict(),
    )
    assert slow_ms >= 10 * base_ms
    assert retried["429"] > 0, "the bounded queue never pushed back"
    assert growth_mb < 50
    assert result.ok and tot.dropped == 0 and tot.delivered == tot.spooled == result.acked_samples


def _open_incidents(db: str) -> dict[int, str]:
    """Open host_misconfig incidents: id -> node."""
    with psycopg.connect(db) as c:
        rows = c.execute(
            "SELECT id, node FROM incidents WHERE state = 'open' AND kind = 'host_misconfig'"
        ).fetchall()
    return {int(i): str(n) for i, n in rows}


def test_replica_killed_behind_balancer(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    n_agents = int(knob("s14_agents", 8, 50))
    run_s = knob("s14_run_s", 10, 120)
    tokens = node_tokens(fresh_db, [f"lb-{i:02d}" for i in range(n_agents)])
    a, b = collectors(fresh_db), collectors(fresh_db)
    a.start().wait_up()
    time.sleep(2)  # a takes the leader lock first
    b.start().wait_up()
    # Every other node runs a powersave governor: the leader opens a host_misconfig
    # incident per such node, and the survivor must update those, not open them again.
    misconfigured = sorted(tokens)[::2]
    with fault_proxy([a.port, b.port]) as lb:
        fleet = Fleet(
            tokens,
            lb.url,
            tmp_path / "spools",
            interval_s=0.1,
            ship_interval_s=0.5,
            retry_base_s=0.1,
            retry_max_s=1.0,
            facts={n: {"cpu_governor": "powersave"} for n in misconfigured},
        )
        try:
            leaders = {p.port: httpx.get(p.url + "/readyz").json()["leader"] for p in (a, b)}
            leader, survivor = (a, b) if leaders[a.port] else (b, a)
            fleet.start()
            time.sleep(run_s / 2)
            sweeps_leader = sample_value(leader.url, "gpufleet_sweep_seconds_count")
            before_kill = _open_incidents(fresh_db)
            wait_until = time.monotonic() + 30  # a slow machine: let the leader open them all first
            while len(before_kill) < len(misconfigured) and time.monotonic() < wait_until:
                time.sleep(0.5)
                before_kill = _open_incidents(fresh_db)
            leader.kill()
            t_kill = time.monotonic()
            t_take = None
            while time.monotonic() - t_kill < 30:
                if httpx.get(survivor.url + "/readyz").json()["leader"]:
                    t_take = time.monotonic() - t_kill
                    break
                time.sleep(0.2)
            sweeps_0 = sample_value(survivor.url, "gpufleet_sweep_seconds_count")
            time.sleep(run_s / 2)
            fleet.stop_sampling()
            drain_s = fleet.wait_drained(timeout=60)
            sweeps_1 = sample_value(survivor.url, "gpufleet_sweep_seconds_count")
            tot = fleet.totals()
            result = integrity(fresh_db, fleet.oracle)
            with psycopg.connect(fresh_db) as c:
                dup_incidents = c.execute(
                    "SELECT count(*) FROM (SELECT kind, node, gpu, run_id FROM incidents WHERE state = 'open' "
                    "GROUP BY 1, 2, 3, 4 HAVING count(*) > 1) d"
                ).fetchone()
                incidents = c.execute("SELECT count(*) FROM incidents").fetchone()
            after = _open_incidents(fresh_db)
        finally:
            fleet.close()
    figures.update(
        agents=n_agents,
        leader_sweeps_before_kill=sweeps_leader,
        takeover_s=None if t_take is None else round(t_take, 1),
        survivor_sweeps_after_takeover=sweeps_1 - sweeps_0,
        incidents=incidents[0] if incidents else None,
        duplicate_open_incidents=dup_incidents[0] if dup_incidents else None,
        open_before_kill=len(before_kill),
        open_after=len(after),
        drain_s=round(drain_s, 1),
        spooled=tot.spooled,
        delivered=tot.delivered,
        lb_connections=lb.connections_total,
        **result.as_dict(),
    )
    assert sweeps_leader > 0
    assert t_take is not None and t_take <= 10
    assert sweeps_1 - sweeps_0 >= 2
    assert dup_incidents == (0,)
    # The leader had opened one incident per misconfigured node; after the takeover the
    # same incidents (same ids) are the open ones, and nothing else was opened.
    assert sorted(before_kill.values()) == misconfigured, before_kill
    assert after == before_kill and incidents == (len(misconfigured),)
    assert result.ok and tot.dropped == 0 and tot.delivered == tot.spooled == result.acked_samples
