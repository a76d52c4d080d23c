"""Long-lived agent connections are ended now and then, so a balancer spreads them again."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from gpufleet.collector.app import create_app
from gpufleet.collector.connection_age import JITTER, ConnectionAges
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from gpufleet.wire import encode
from tests.collector.test_ingest import batch
from tests.reliability.conftest import node_tokens
from testsupport.faultproxy import fault_proxy


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def scope(port: int) -> dict[str, object]:
    return {"client": ("10.0.0.7", port), "server": ("10.0.0.1", 8410)}


def test_a_connection_is_closed_once_past_its_age_then_counts_as_new() -> None:
    clock = Clock()
    ages = ConnectionAges(300.0, 30.0, clock=clock, rng=random.Random(1))
    assert not ages.should_close(scope(1))
    clock.t += 300 * (1 - JITTER) - 1
    assert not ages.should_close(scope(1))  # never before three quarters of the age
    clock.t += 300 * JITTER + 1
    assert ages.should_close(scope(1))  # always by the full age
    # the next connection from that port is a new one
    assert not ages.should_close(scope(1))
    # no address (a test client, a Unix socket) or no limit: never
    assert not ages.should_close({"client": None, "server": None})
    short = ConnectionAges(10.0, 30.0, clock=clock)
    listed = {"client": ["10.0.0.8", 1], "server": ["10.0.0.1", 8410]}  # lists, as some servers give them
    assert not short.should_close(listed)
    clock.t += 10
    assert short.should_close(listed)
    assert not ConnectionAges(0.0, 30.0, clock=clock).should_close(scope(2))


def test_limits_are_spread_so_a_fleet_does_not_reconnect_at_once() -> None:
    clock = Clock()
    ages = ConnectionAges(100.0, 30.0, clock=clock, rng=random.Random(2))
    for port in range(200):
        ages.should_close(scope(port))
    closed_at = {}
    for step in range(0, 101):
        clock.t = 1000.0 + step
        for port in range(200):
            if port not in closed_at and ages.should_close(scope(port)):
                closed_at[port] = step
    assert len(closed_at) == 200
    assert min(closed_at.values()) >= 75 and max(closed_at.values()) <= 100
    assert len(set(closed_at.values())) > 15


def test_entries_of_connections_that_went_away_are_forgotten() -> None:
    clock = Clock()
    ages = ConnectionAges(10.0, 30.0, clock=clock)
    for port in range(1000):
        ages.should_close(scope(port))
    assert len(ages) == 1000
    clock.t += 10 + 30 + 2  # past every limit and an idle timeout: none of them can be open
    ages.should_close(scope(5000))
    assert len(ages) == 1


@pytest.mark.parametrize("max_age_s", [0.0, 1.0])
def test_a_replica_added_behind_a_balancer_gets_agents(db: str, settings: Settings, max_age_s: float) -> None:
    """Agents hold their connections through a connection-level balancer (round robin over
    the replicas it can reach).  A replica added later receives batches only if connections
    end now and then: with ``max_connection_age_s`` 0 every agent stays on the first one."""
    # no group-commit linger: each batch is written at once, so the test is not paced by it
    s = settings.model_copy(
        update={
            "ingest": settings.ingest.model_copy(
                update={"max_connection_age_s": max_age_s, "group_linger_s": 0.0}
            )
        }
    )
    nodes = [f"lb-node-{i}" for i in range(6)]
    tokens = node_tokens(db, nodes)
    app_a, app_b = create_app(db, s, run_leader=False), create_app(db, s, run_leader=False)

    def answered(app: object) -> float:
        value = app.state.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
            "gpufleet_ingest_requests_total", {"code": "200"}
        )
        return value or 0.0

    with serve(app_a, **server_options(s)) as a, fault_proxy([a.port]) as lb:
        clients = [
            httpx.Client(limits=httpx.Limits(max_connections=1, keepalive_expiry=20.0), timeout=10)
            for _ in nodes
        ]
        sent = 0

        def ship(rounds: int) -> None:
            nonlocal sent
            for _ in range(rounds):
                for node, client in zip(nodes, clients, strict=True):
                    body, headers = encode(batch(f"{node}:{sent}", node=node), "msgpack", "zstd")
                    r = client.post(
                        lb.url + "/v1/ingest",
                        content=body,
                        headers={**headers, "Authorization": f"Bearer {tokens[node]}"},
                    )
                    assert r.status_code == 200, r.text
                    sent += 1
                time.sleep(0.1)

        try:
            ship(2)
            with serve(app_b, **server_options(s)) as b:
                lb.set_upstreams([a.port, b.port])  # the scale-out
                ship(int(3 * max(max_age_s, 1.0) / 0.1) + 1)
                on_b = answered(app_b)
        finally:
            for c in clients:
                c.close()
    assert answered(app_a) + on_b == sent
    aged = sum(
        app.state.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
            "gpufleet_ingest_connections_aged_total"
        )
        or 0.0
        for app in (app_a, app_b)
    )
    if max_age_s:
        assert on_b >= sent / 10  # reconnected agents are spread over both replicas
        assert aged >= len(nodes)  # every agent's first connection was ended, and counted
    else:
        assert on_b == 0 and aged == 0
