"""Reads off the primary, against a real hot standby (tests/db/replication.py).

The API's GET routes and the web view's pages read from ``database.read_url``
while its view is fresh enough; writes and token checks stay on the primary; a
standby that falls behind past ``database.max_read_lag_s``, stops answering or
is asked for the present (``Cache-Control: no-cache``) sends the read to the
primary; every dashboard query and the accounting run on a standby (they write
nothing); the lag is exported.  Replay is paused on the standby
(``pg_wal_replay_pause``) to make it fall behind on purpose.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings, load_settings
from gpufleet.db import migrate
from gpufleet.db.read_routing import (
    LagProbe,
    ReadRouter,
    StandbyLag,
    StandbyLagMetrics,
    StandbyUnavailable,
    lsn,
)
from gpufleet.serverthread import ServerThread, serve
from tests.system_tools import unavailable
from testsupport import replication


@pytest.fixture(scope="module", autouse=True)
def _servers() -> None:
    why = replication.available()
    if why is not None:
        unavailable(why, "postgresql-15")


MAX_LAG_S = 1.5


@pytest.fixture(scope="module")
def pair() -> Iterator[replication.Pair]:
    with replication.primary_and_standby() as p:
        with psycopg.connect(p.primary.url(), autocommit=True) as c:
            c.execute("CREATE DATABASE gpufleet")
        migrate.upgrade(p.primary.url("gpufleet"), load_settings(database_url=p.primary.url("gpufleet")))
        p.wait_replayed("gpufleet")
        yield p


def settings_for(pair: replication.Pair, **db: Any) -> Settings:
    return load_settings(
        database_url=pair.primary.url("gpufleet"),
        database={
            "read_url": pair.standby.url("gpufleet"),
            "max_read_lag_s": MAX_LAG_S,
            "lag_check_s": 0.1,
            **db,
        },
    )


def until(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tokens(pair: replication.Pair) -> dict[str, str]:
    with psycopg.connect(pair.primary.url("gpufleet"), autocommit=True) as c:
        out = {role: create_token(c, f"replica-{role}", role) for role in ("admin", "sre", "finance")}
    pair.wait_replayed("gpufleet")
    return out


#: The router of each API served by the ``api`` fixture.
ROUTERS: dict[int, ReadRouter] = {}


@pytest.fixture
def api(pair: replication.Pair, tokens: dict[str, str]) -> Iterator[ServerThread]:
    app = create_app(pair.primary.url("gpufleet"), settings_for(pair))
    router = app.state.api.pool.router
    with serve(app) as srv:
        ROUTERS[srv.port] = router
        until(lambda: router.choose()[0] == "standby", what="the standby's first lag check")
        yield srv


def client(srv: ServerThread, token: str) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def router_of(srv: ServerThread) -> Any:
    return ROUTERS[srv.port]


def replay(pair: replication.Pair, on: bool) -> None:
    with psycopg.connect(pair.standby.url("gpufleet"), autocommit=True) as c:
        c.execute("SELECT pg_wal_replay_resume()" if on else "SELECT pg_wal_replay_pause()")


def new_run(c: httpx.Client, run_id: str) -> None:
    start = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    r = c.post("/v1/runs", json={"run_id": run_id, "start": start})
    assert r.status_code == 201, r.text  # a standby would refuse the write: it went to the primary


def test_lsn_positions_compare_as_wal_bytes() -> None:
    assert lsn("0/0") == 0
    assert lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert lsn("1/0") > lsn("0/FFFFFFFF")


def test_reads_go_to_the_standby_and_writes_to_the_primary(
    pair: replication.Pair, tokens: dict[str, str], api: ServerThread
) -> None:
    router = router_of(api)
    with client(api, tokens["admin"]) as admin, client(api, tokens["sre"]) as sre:
        new_run(admin, "replica-run-1")
        pair.wait_replayed("gpufleet")
        before = router.reads["standby"]
        assert admin.get("/v1/runs/replica-run-1").status_code == 200
        assert router.reads["standby"] == before + 1
        page = sre.get("/runs")  # a web page reads through the same router
        assert page.status_code == 200 and "replica-run-1" in page.text
        assert router.reads["standby"] == before + 2


def test_a_standby_behind_serves_within_the_bound_and_the_primary_past_it(
    pair: replication.Pair, tokens: dict[str, str], api: ServerThread
) -> None:
    router = router_of(api)
    replay(pair, on=False)
    try:
        with client(api, tokens["admin"]) as admin:
            new_run(admin, "replica-run-2")
            # Within the bound the standby serves, and it has not replayed the run yet ...
            assert admin.get("/v1/runs/replica-run-2").status_code == 404
            # ... unless the client asks for the present, which only the primary has.
            fresh = admin.get("/v1/runs/replica-run-2", headers={"Cache-Control": "no-cache"})
            assert fresh.status_code == 200
            until(lambda: (router.lag.seconds() or 0) > MAX_LAG_S, what="the paused standby to fall behind")
            lag = router.lag.reading.lag_s
            metrics = {m.name: m for m in StandbyLagMetrics(router.lag, router).collect()}
            assert metrics["gpufleet_db_standby_lag_seconds"].samples[0].value == pytest.approx(lag)
            assert metrics["gpufleet_db_standby_up"].samples[0].value == 1.0
            fell = router.fallbacks.get("lag", 0)
            assert admin.get("/v1/runs/replica-run-2").status_code == 200  # past the bound: the primary
            assert router.fallbacks["lag"] == fell + 1
    finally:
        replay(pair, on=True)
    until(lambda: router.choose()[0] == "standby", what="the standby to catch up")
    with client(api, tokens["admin"]) as admin:
        before = router.reads["standby"]
        assert admin.get("/v1/runs/replica-run-2").status_code == 200
        assert router.reads["standby"] == before + 1


def test_token_checks_stay_on_the_primary(pair: replication.Pair, api: ServerThread) -> None:
    replay(pair, on=False)
    try:
        with psycopg.connect(pair.primary.url("gpufleet"), autocommit=True) as c:
            token = create_token(c, "replica-new-sre", "sre")
        # The standby has not replayed the token; it works at once all the same.
        with client(api, token) as sre:
            assert sre.get("/v1/runs").status_code == 200
    finally:
        replay(pair, on=True)


def test_accounting_and_every_dashboard_query_run_on_the_standby(
    pair: replication.Pair, tokens: dict[str, str], api: ServerThread
) -> None:
    from gpufleet.dashboards.dryrun import run_dashboard
    from gpufleet.dashboards.loader import load_all
    from gpufleet.dashboards.macros import TimeRange

    router = router_of(api)
    pair.wait_replayed("gpufleet")
    now = datetime.now(UTC)
    with client(api, tokens["finance"]) as fin:
        before = router.reads["standby"]
        got = fin.get("/v1/runs/replica-run-1/accounting")
        assert got.status_code == 200, got.text
        period = {"from": (now - timedelta(days=1)).isoformat(), "to": now.isoformat()}
        assert fin.get("/v1/accounting", params=period).status_code == 200
        assert fin.get("/v1/reports/finance.csv", params=period).status_code == 200
        assert router.reads["standby"] == before + 3
    # Grafana's data source on the standby: every variable, panel and annotation query runs there.
    with psycopg.connect(pair.standby.url("gpufleet"), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]  # type: ignore[index]
        for board in load_all().values():
            for rng in (TimeRange(now - timedelta(hours=6), now), TimeRange(now - timedelta(days=30), now)):
                failed = [(q.where, q.error) for q in run_dashboard(conn, board, rng) if q.error]
                assert not failed, failed


def test_lag_is_measured_by_wal_position(pair: replication.Pair) -> None:
    probe = LagProbe(pair.primary.url("gpufleet"), pair.standby.url("gpufleet"))
    try:
        pair.wait_replayed("gpufleet")
        assert probe.measure() < 1.0
        replay(pair, on=False)
        try:
            with psycopg.connect(pair.primary.url("gpufleet"), autocommit=True) as c:
                c.execute("CREATE TABLE IF NOT EXISTS replica_probe (x int)")
                c.execute("INSERT INTO replica_probe VALUES (1)")
            time.sleep(0.3)
            assert probe.measure() < 1.0  # the write came after the last position it was dated by
            time.sleep(1.2)
            assert probe.measure() >= 1.2  # ... and it is still behind it
        finally:
            replay(pair, on=True)
        until(lambda: probe.measure() < 0.5, what="caught up")
    finally:
        probe.close()


def test_a_standby_gone_sends_reads_to_the_primary(
    pair: replication.Pair, tokens: dict[str, str], api: ServerThread
) -> None:
    router = router_of(api)
    pair.standby.stop("fast")
    try:
        until(lambda: router.lag.reading.lag_s is None, what="the lag check to notice")
        assert "does not answer" in str(router.lag.reading.reason)
        with client(api, tokens["admin"]) as admin:
            assert admin.get("/v1/runs/replica-run-1").status_code == 200
        assert router.fallbacks["unavailable"] >= 1
        metrics = {m.name: m for m in StandbyLagMetrics(router.lag, router).collect()}
        assert metrics["gpufleet_db_standby_up"].samples[0].value == 0.0
        assert "gpufleet_db_standby_lag_seconds" not in metrics
    finally:
        pair.standby.start()
    until(lambda: router.choose()[0] == "standby", what="the standby back")


def test_the_collector_exports_the_standby_lag(pair: replication.Pair) -> None:
    from gpufleet.collector.app import create_app as collector_app

    settings = settings_for(pair)
    with serve(collector_app(pair.primary.url("gpufleet"), settings, run_leader=False)) as srv:

        def lag() -> float | None:
            for line in httpx.get(f"{srv.url}/metrics", timeout=10).text.splitlines():
                if line.startswith("gpufleet_db_standby_lag_seconds "):
                    return float(line.split()[1])
            return None

        until(lambda: lag() is not None, what="the lag on /metrics")
        assert 0 <= (lag() or 0) < 2
        assert "gpufleet_db_standby_up 1.0" in httpx.get(f"{srv.url}/metrics", timeout=10).text


def write_samples(url: str, node: str, t0: float, seconds: int, tag: str) -> int:
    """``seconds`` of one node's 2 GPUs at 1 Hz, stored as the collector stores a batch."""
    import numpy as np

    from gpufleet.collector.batch_store import write_batches
    from gpufleet.wire import Batch, Column

    t = np.repeat(np.arange(t0, t0 + seconds, 1.0), 2)
    cols = {
        "time": Column(t),
        "gpu": Column(np.tile(np.arange(2, dtype=np.int64), seconds)),
        "util_pct": Column(np.full(len(t), 90.0)),
        "power_w": Column(np.full(len(t), 500.0)),
    }
    with psycopg.connect(url, autocommit=True) as c, c.transaction():
        write_batches(c, [Batch(f"{tag}:{node}", node, gpu=cols, n_gpu=len(t))])
    return len(t)


def test_a_sweeps_cold_load_reads_the_standby_and_its_refresh_the_primary(pair: replication.Pair) -> None:
    from gpufleet.collector.sweep import Sweeper

    url = pair.primary.url("gpufleet")
    now = time.time()
    older = write_samples(url, "sweep-n1", now - 120, 60, "older")
    pair.wait_replayed("gpufleet")
    replay(pair, on=False)
    try:
        newer = write_samples(url, "sweep-n1", now - 60, 30, "newer")  # committed, not replayed
        with psycopg.connect(url, autocommit=True) as conn:
            sweeper = Sweeper(settings_for(pair))
            assert sweeper.history is not None
            sweeper(conn, now)
            # The window came from the standby, which has only the older samples ...
            assert sweeper.history.reads == {"standby": 1, "primary": 0}
            assert sweeper.cache.samples() == older
            # ... and the next sweep's refresh, on the primary, brings what it lacked.
            sweeper(conn, now + 1)
            assert sweeper.cache.samples() == older + newer
            # A standby further behind than the refresh's slack allows is not read.
            sweeper.history.max_lag_s = 0.5
            time.sleep(1.0)
            late = Sweeper(settings_for(pair), snapshots=False)  # no persisted window: a cold load
            late.history = sweeper.history
            late(conn, now + 2)
            assert sweeper.history.reads == {"standby": 1, "primary": 1}
            assert late.cache.samples() == older + newer
    finally:
        replay(pair, on=True)


def test_a_promoted_standby_no_longer_serves_reads(pair: replication.Pair) -> None:
    """Last: it ends the pair's replication."""
    lag = StandbyLag(LagProbe(pair.primary.url("gpufleet"), pair.standby.url("gpufleet")), check_s=0.1)
    try:
        assert lag.check().lag_s is not None
        pair.standby.run("pg_ctl", "-D", str(pair.standby.data), "-w", "promote")
        reading = lag.check()
        assert reading.lag_s is None and "not in recovery" in str(reading.reason)
        with pytest.raises(StandbyUnavailable):
            lag.probe.measure()
    finally:
        lag.stop()
