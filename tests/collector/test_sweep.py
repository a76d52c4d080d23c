"""The live sweep against the database: incremental window, incidents, metrics, leadership."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from gpufleet.collector import incident_store
from gpufleet.collector.alerting import IncidentMetrics
from gpufleet.collector.detectors import DETECTORS
from gpufleet.collector.leader import Leader
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings
from gpufleet.sim import Fleet
from gpufleet.store import runs as run_store
from testsupport.simfeed import SimFeed


def register_runs(conn: psycopg.Connection, fleet: Fleet) -> None:
    from datetime import UTC, datetime

    for r in fleet.plan.runs:
        allocs: dict[str, list[int]] = {}
        for gi in r.gpu_idx:
            gp = fleet.plan.gpus[gi]
            allocs.setdefault(gp.node, []).append(gp.gpu)
        run_store.create_run(
            conn,
            {
                "run_id": r.run_id,
                "start": datetime.fromtimestamp(r.start, UTC),
                "end": None if r.end is None else datetime.fromtimestamp(r.end, UTC),
                "allocations": [{"node": n, "gpus": g} for n, g in allocs.items()],
            },
        )


def test_live_sweep_opens_incidents_in_the_database(conn: psycopg.Connection, settings: Settings) -> None:
    fleet = Fleet.from_scenario("straggler_power_cap", seed=3)
    register_runs(conn, fleet)
    labels = [i for i in fleet.labels().incidents if i.kind in ("straggler", "throttling")]
    assert labels
    fault_start = min(i.start for i in labels)
    feed = SimFeed(conn, fleet)
    sweeper = Sweeper(settings)
    t = fleet.t0 + 60
    while t < fault_start + 300:
        feed.run_until(t)
        sweeper(conn, fleet.t)
        t += settings.detect.sweep_interval_s
    feed.close()
    assert sweeper.last["fetched_rows"] < 40 * 10 * 2  # incremental: only the last few seconds were read
    rows = conn.execute(
        "SELECT kind, node, gpu, cause, state, evidence FROM incidents ORDER BY kind"
    ).fetchall()
    expected = {(i.kind, i.node, i.gpu, i.cause) for i in labels}
    # a run's throttled GPUs are one incident listing them (evidence.gpus)
    per_gpu = {
        (k, g["node"], g["gpu"], c) if gpu is None and "gpus" in ev else (k, n, gpu, c)
        for k, n, gpu, c, s, ev in rows
        if s == "open"
        for g in (ev.get("gpus") or [None])
    }
    assert per_gpu == expected
    # once per scope: re-sweeping the same state neither duplicates nor resolves
    sweeper(conn, fleet.t)
    assert conn.execute("SELECT count(*) FROM incidents").fetchone()[0] == len(rows)  # type: ignore[index]
    metrics = {
        tuple(s.labels[k] for k in ("kind", "node", "gpu", "cause")): s.value
        for fam in IncidentMetrics(conn.info.dsn, cache_s=0).collect()
        for s in fam.samples
        if s.name == "gpufleet_incident_open"
    }
    assert set(metrics) == {(k, n, str(g), c) for k, n, g, c in expected}


def test_incident_store_resolves_after_hold_off(conn: psycopg.Connection) -> None:
    from gpufleet.collector.detectors.window import Finding

    f = Finding(
        kind="throttling",
        cause="thermal",
        severity="warning",
        start=1000.0,
        evidence={"x": 1.5},
        run_id="r1",
        node="n1",
        gpu=2,
    )
    incident_store.sweep(conn, [f], 1010.0, resolve_after_s=60)
    incident_store.sweep(conn, [], 1030.0, resolve_after_s=60)  # blink: still open
    assert conn.execute("SELECT state FROM incidents").fetchall() == [("open",)]
    incident_store.sweep(conn, [], 1080.0, resolve_after_s=60)
    assert conn.execute('SELECT state, extract(epoch FROM "end") FROM incidents').fetchall() == [
        ("resolved", 1010.0)
    ]
    incident_store.sweep(conn, [f], 1200.0, resolve_after_s=60)  # a real recurrence opens a new incident
    assert conn.execute("SELECT count(*) FROM incidents WHERE state = 'open'").fetchone() == (1,)


def test_stored_group_follows_its_gpus_node(conn: psycopg.Connection) -> None:
    from gpufleet.collector.detectors.window import Finding

    def group(node: str | None, gpus: list[tuple[str, int]]) -> Finding:
        return Finding(
            kind="throttling",
            cause="thermal",
            severity="warning",
            start=1000.0,
            evidence={"gpus": [{"node": n, "gpu": g} for n, g in gpus]},
            run_id="r1",
            node=node,
            qualifier="thermal",
        )

    incident_store.sweep(conn, [group("n1", [("n1", 0)])], 1010.0, resolve_after_s=60)
    incident_store.sweep(conn, [group(None, [("n1", 0), ("n2", 5)])], 1020.0, resolve_after_s=60)
    rows = conn.execute("SELECT scope_key, node, gpu, evidence FROM incidents").fetchall()
    assert len(rows) == 1 and rows[0][:3] == ("throttling|run|r1|thermal", None, None)
    assert [g["node"] for g in rows[0][3]["gpus"]] == ["n1", "n2"]
    # a GPU-scoped incident's node is its own and never changes
    gpu_scoped = Finding(
        kind="pcie_degraded",
        cause=None,
        severity="warning",
        start=1000.0,
        evidence={},
        run_id="r1",
        node="n3",
        gpu=1,
    )
    incident_store.sweep(conn, [gpu_scoped], 1030.0, resolve_after_s=60)
    incident_store.sweep(conn, [gpu_scoped], 1040.0, resolve_after_s=60)
    assert conn.execute("SELECT node FROM incidents WHERE kind = 'pcie_degraded'").fetchone() == ("n3",)


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``cond`` until it holds; the seconds that took.  Fails after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - t0


@pytest.mark.timeout(120)
def test_one_leader_and_fast_takeover(db: str, settings: Settings) -> None:
    """Waits are on conditions (bounded), not on fixed sleeps, so a loaded machine only makes it slower."""
    s = settings.model_copy(update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 0.5})})
    calls: dict[str, int] = {"a": 0, "b": 0}
    lock = threading.Lock()

    def sweeper(name: str):  # type: ignore[no-untyped-def]
        def sweep(conn: psycopg.Connection, now: float) -> None:
            with lock:
                calls[name] += 1

        return sweep

    a = Leader(db, s, CollectorMetrics(), sweep=sweeper("a"), rollup_interval_s=0.1)
    b = Leader(db, s, CollectorMetrics(), sweep=sweeper("b"), rollup_interval_s=0.1)
    try:
        a.start()
        wait_until(lambda: a.is_leader and calls["a"] > 0, 60, "the first replica leads and sweeps")
        b.start()
        with psycopg.connect(db, autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'gpufleet-leader' AND datname = current_database()"
                    ).fetchone()
                    == (2,)
                ),
                60,
                "the second replica contends",
            )
        seen = calls["a"]
        # two more sweeps of the leader while the other replica keeps trying
        wait_until(lambda: calls["a"] >= seen + 2, 60, "the leader keeps sweeping")
        assert a.is_leader and not b.is_leader and calls["b"] == 0
        a.stop()  # the leader goes away: its session and advisory lock with it
        took = wait_until(
            lambda: b.is_leader and calls["b"] > 0, 60, "the other replica takes over and sweeps"
        )
        # it retries every sweep interval; room for a slow first rollup pass on a loaded machine
        assert took <= 2 * s.detect.sweep_interval_s + 3.0, took
    finally:
        a.stop()
        b.stop()


def test_the_leader_exports_each_sweep_stage(db: str, settings: Settings) -> None:
    """``gpufleet_sweep_stage_seconds`` has a series for every stage of a real
    sweep and every detector, so an operator sees which one a fleet's sweep
    time goes to; a sweep that failed part-way adds nothing to them."""
    s = settings.model_copy(update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 0.2})})
    metrics = CollectorMetrics()
    sweeper = Sweeper(s)
    leader = Leader(db, s, metrics, sweep=sweeper, rollup_interval_s=0.1)
    try:
        leader.start()
        wait_until(lambda: leader.sweeps >= 2, 60, "the leader sweeps")
    finally:
        leader.stop()

    def counts() -> dict[str, float]:
        return {
            smp.labels["stage"]: smp.value
            for fam in metrics.registry.collect()
            if fam.name == "gpufleet_sweep_stage_seconds"
            for smp in fam.samples
            if smp.name.endswith("_count")
        }

    got = counts()
    assert set(got) == {"refresh", "window", "frame", *DETECTORS, "store", "snapshot"}
    assert set(got.values()) == {float(leader.sweeps)}
    assert set(sweeper.stages) == set(got) and all(v >= 0 for v in sweeper.stages.values())

    def broken(*args: object) -> None:
        raise RuntimeError("window lost")

    sweeper.cache.window = broken  # type: ignore[method-assign, assignment]
    with psycopg.connect(db, autocommit=True) as conn, pytest.raises(RuntimeError):
        sweeper(conn, time.time())
    assert sweeper.stages == {}
    leader._observe(sweeper, 0.1)
    assert counts() == got


def test_freed_memory_goes_back_after_a_load_not_after_a_steady_sweep(
    conn: psycopg.Connection, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A steady sweep's scratch is reused by the next one: handing its pages back would only
    have them faulted in again.  A load (the first sweep, a catch-up) leaves temporaries the
    steady sweeps never reuse: those go back."""
    import gpufleet.collector.sweep as sweep_mod

    released: list[float] = []
    monkeypatch.setattr(sweep_mod, "release_free_memory", lambda: released.append(fleet.t) or True)
    fleet = Fleet.from_scenario("straggler_power_cap", seed=3)
    register_runs(conn, fleet)
    feed = SimFeed(conn, fleet)
    sweeper = Sweeper(settings)
    feed.run_until(fleet.t0 + 180)
    sweeper(conn, fleet.t)
    assert len(released) == 1  # the first sweep loaded the window
    # The next refresh reads again the batches committed in the minute before the load (the
    # commit slack): here, all of them.  From then on, only what is new.
    feed.run_until(fleet.t + settings.detect.sweep_interval_s)
    sweeper(conn, fleet.t)
    released.clear()
    for _ in range(4):
        feed.run_until(fleet.t + settings.detect.sweep_interval_s)
        sweeper(conn, fleet.t)
        assert 0 < sweeper.last["fetched_rows"] < 0.1 * sweeper.cache.samples()
    assert released == []  # steady sweeps: nothing handed back
    feed.run_until(fleet.t + 120)  # the sweeps stopped for two minutes (an outage): a catch-up
    sweeper(conn, fleet.t)
    feed.close()
    assert len(released) == 1


def test_late_data_dates_a_new_incident_from_its_onset_not_the_window(
    conn: psycopg.Connection, settings: Settings
) -> None:
    """Half an hour of samples arrives at once (agents back-filling their spool): the first sweep
    sees only the last window, yet dates the starvation from where the data shows it began."""
    fleet = Fleet.from_scenario("starvation_cpu", seed=5)
    register_runs(conn, fleet)
    (label,) = [i for i in fleet.labels().incidents if i.kind == "starvation"]
    feed = SimFeed(conn, fleet)
    end = label.start + 1800
    feed.run_until(end)
    feed.close()
    Sweeper(settings)(conn, fleet.t)
    (start,) = conn.execute(
        "SELECT extract(epoch FROM start)::float8 FROM incidents WHERE kind = 'starvation'"
    ).fetchone()
    window = settings.detect.window_s
    assert fleet.t - start > 2 * window  # the window alone would have dated it from its own start
    assert abs(start - label.start) <= window
