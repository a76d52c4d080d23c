"""The simulated node behind the agent's Source protocol, node facts and the realtime driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.sources.base import Closeable, FactsSource, Source, SourceError
from gpufleet.agent.sources.facts import node_facts
from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME
from gpufleet.sim import Fleet, RealtimeDriver
from gpufleet.sim.fleet import GPU_METRICS, HOST_METRICS


class FakeWall:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_sources_implement_the_protocol_and_return_catalog_rows() -> None:
    fleet = Fleet.from_scenario("healthy")
    gpu_src, host_src = fleet.sources_for("h100-01")
    assert isinstance(gpu_src, Source) and isinstance(host_src, Source)
    assert isinstance(gpu_src, FactsSource) and not isinstance(gpu_src, Closeable)
    fleet.advance_to(fleet.t0 + 300)
    reading = gpu_src.collect()
    assert [r["gpu"] for r in reading.gpus] == list(range(8)) and reading.host is None
    for row in reading.gpus:
        assert set(row) - {"gpu"} <= set(GPU_BY_NAME)
        assert all(row[c] is not None for c in GPU_METRICS if not c.startswith("job_"))
        # The job's cgroup: CPU used and pressure are read; no quota on this node, so none and no throttling.
        assert row["job_cpu_cores"] > 0 and row["job_cpu_pressure_pct"] is not None
        assert row["job_cpu_quota_cores"] is None and row["job_cpu_throttled_share"] is None
        assert isinstance(row["energy_mj"], int) and isinstance(row["throttle_reasons"], int)
    host = host_src.collect().host
    assert host is not None and set(host) == set(HOST_METRICS) <= set(HOST_BY_NAME)
    with pytest.raises(KeyError, match="unknown node"):
        fleet.sources_for("nope")


def test_facts_have_the_real_agents_keys(tmp_path: Path) -> None:
    fleet = Fleet.from_scenario("host_misconfig")
    real = node_facts(tmp_path)
    facts = fleet.facts("h100-01")
    assert set(real) <= set(facts)
    assert {"driver_version", "cuda_driver_version", "gpu_count", "gpus"} <= set(facts)
    assert facts["cpu_governor"] == "powersave" and fleet.facts("h100-02")["cpu_quota_cores"] == 4
    gpu0 = facts["gpus"][0]
    assert gpu0["pcie_gen_max"] == 5 and gpu0["pcie_width_max"] == 16 and gpu0["uuid"].startswith("GPU-")
    assert facts["bf16_dense_peak_flops"] == 989e12


def test_sample_gap_and_driver_reload_raise_source_errors() -> None:
    fleet = Fleet.from_scenario("counters_and_gaps")
    gap_start = fleet.plan.node_gaps["h100-02"].pairs()[0][0]
    gpu_src, host_src = fleet.sources_for("h100-02")
    fleet.advance_to(gap_start + 10)
    with pytest.raises(SourceError, match="not reporting"):
        gpu_src.collect()
    with pytest.raises(SourceError, match="not reporting"):
        host_src.collect()
    reset = fleet.plan.resets[0]
    f2 = Fleet.from_scenario("counters_and_gaps")
    f2.advance_to(reset.time + 1)
    g, h = f2.sources_for("h100-01")
    with pytest.raises(SourceError, match="driver reloading"):
        g.collect()
    assert h.collect().host is not None


def test_xid_is_reported_once_by_the_next_collect_even_between_ticks() -> None:
    fleet = Fleet.from_scenario("host_misconfig")
    x = fleet.plan.xids[0]
    gp = fleet.plan.gpus[x.gpu_idx]
    src = fleet.sources_for(gp.node)[0]
    fleet.advance_to(x.time - 30)
    src.collect()
    fleet.advance_to(x.time + 7)  # several ticks pass without a collect
    rows = {r["gpu"]: r for r in src.collect().gpus}
    assert rows[gp.gpu]["xid"] == x.code
    fleet.step()
    nxt = [e for e in fleet.plan.xids if e.gpu_idx == x.gpu_idx and x.time < e.time <= fleet.t]
    rows = {r["gpu"]: r for r in src.collect().gpus}
    assert rows[gp.gpu]["xid"] == (nxt[-1].code if nxt else 0)


def test_realtime_driver_follows_an_accelerated_clock() -> None:
    wall = FakeWall()
    fleet = Fleet.from_scenario("healthy", start_time=wall.t)
    driver = RealtimeDriver(fleet, speed=10.0, wall=wall)
    src = fleet.sources_for("h100-01")[0]
    t0 = fleet.t
    wall.t += 6.0
    src.collect()  # a read catches the fleet up with the clock
    assert fleet.t == pytest.approx(t0 + 60.0)
    wall.t += 1.25
    assert driver.advance() > 0 and fleet.t == pytest.approx(t0 + 72.5)
    driver.detach()
    wall.t += 100
    src.collect()
    assert fleet.t == pytest.approx(t0 + 72.5)
    with pytest.raises(ValueError):
        RealtimeDriver(fleet, speed=0)


def test_realtime_driver_thread_stops() -> None:
    fleet = Fleet.from_scenario("healthy")
    driver = RealtimeDriver(fleet, speed=200.0)
    thread, stop = driver.start(until=fleet.t0 + 3.0)
    thread.join(timeout=10)
    assert not thread.is_alive()
    stop.set()
    assert fleet.t >= fleet.t0 + 3.0


def test_steps_must_move_forward() -> None:
    fleet = Fleet.from_scenario("healthy")
    with pytest.raises(ValueError, match="not after"):
        fleet.step(fleet.t)


def test_the_agent_builds_a_sim_source_by_name() -> None:
    from gpufleet.agent.sources.registry import build_source
    from gpufleet.config import AgentSettings
    from gpufleet.sim import sources as sim_sources

    fleet = Fleet.from_scenario("healthy")
    sim_sources.attach(fleet)
    try:
        src = build_source("sim", AgentSettings(node="h100-02"))
        assert src.name == "sim" and isinstance(src, FactsSource)
        fleet.advance_to(fleet.t0 + 200)
        reading = src.collect()
        assert len(reading.gpus) == 8 and reading.host is not None
        assert src.facts()["hostname"] == "h100-02"
        with pytest.raises(SourceError, match="not in scenario"):
            build_source("sim", AgentSettings(node="elsewhere"))
    finally:
        sim_sources.attach(None)
