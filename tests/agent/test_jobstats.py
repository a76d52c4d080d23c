"""The job_* columns: each GPU gets its processes' own cgroup figures, through the agent loop too."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import scheduler as scheduler_mod
from gpufleet.agent.jobstats import JOB_FIELDS, JobCgroups
from gpufleet.agent.runtime import Agent
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.catalog import GPU_BY_NAME
from gpufleet.config import AgentSettings
from gpufleet.sim.nvml_fake import H100_SXM, FakeHandle, FakeNvml
from tests.agent.test_runtime import decode_segments

HOSTFS = Path(__file__).resolve().parents[1] / "fixtures" / "hostfs"
SCOPE = (
    "sys/fs/cgroup/system.slice/docker-1c8fa019edd4b9d4b2856f4932c55929c5c118c808ed5faee9a135ca6e84b039.scope"
)


@pytest.fixture(autouse=True)
def no_first_read_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_mod, "FIRST_READ_TIMEOUT_S", 0.0)


def host_tree(tmp_path: Path) -> Path:
    """The real cgroup v2 container tree (pid 312), plus a second process in the same cgroup."""
    root = tmp_path / "host"
    shutil.copytree(HOSTFS / "cgroup_v2_docker", root)
    (root / "proc/313").mkdir()
    (root / "proc/313/cgroup").write_text((root / "proc/312/cgroup").read_text())
    return root


def advance(
    root: Path,
    usage_usec: int,
    periods: int,
    throttled: int,
    cpu_some: int,
    io_some: int,
    quota: str = "800000 100000",
) -> None:
    scope = root / SCOPE
    (scope / "cpu.max").write_text(quota + "\n")
    (scope / "cpu.stat").write_text(
        f"usage_usec {usage_usec}\nuser_usec 0\nsystem_usec 0\nnr_periods {periods}\n"
        f"nr_throttled {throttled}\nthrottled_usec 0\n"
    )
    (scope / "cpu.pressure").write_text(f"some avg10=0.00 avg60=0.00 avg300=0.00 total={cpu_some}\n")
    (scope / "io.pressure").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={io_some}\n"
        f"full avg10=0.00 avg60=0.00 avg300=0.00 total={io_some}\n"
    )


def test_each_gpu_gets_its_processes_cgroup_and_rates_over_the_interval(tmp_path: Path) -> None:
    root = host_tree(tmp_path)
    now = [100.0]
    job = JobCgroups(root / "proc", root / "sys", clock=lambda: now[0])
    advance(root, 1_000_000, 10, 0, 0, 0)
    rows = [{"gpu": g, "mig_instance": None} for g in range(3)] + [{"gpu": 0, "mig_instance": 1}]
    pids = {0: [312, 313], 1: [313], 2: [999]}
    job.label(rows, pids)
    # First reading: the quota is known, rates are not (NULL, never 0).
    assert rows[0]["job_cpu_quota_cores"] == pytest.approx(8.0) and rows[0]["job_cpu_cores"] is None
    assert all(rows[2][f] is None for f in JOB_FIELDS)  # PID 999 has no /proc entry
    assert "job_cpu_cores" not in rows[3]  # MIG instance rows are left alone
    now[0] += 4.0
    advance(root, 1_000_000 + 31_600_000, 50, 36, 3_000_000, 400_000)
    rows = [{"gpu": g, "mig_instance": None} for g in range(3)]
    job.label(rows, pids)
    for r in rows[:2]:  # one cgroup feeds both GPUs: the same figures on each
        assert r["job_cpu_cores"] == pytest.approx(7.9)
        assert r["job_cpu_quota_cores"] == pytest.approx(8.0)
        assert r["job_cpu_throttled_share"] == pytest.approx(36 / 40)
        assert r["job_cpu_pressure_pct"] == pytest.approx(75.0)
        assert r["job_io_pressure_pct"] == pytest.approx(10.0)
    for name in JOB_FIELDS:
        f = GPU_BY_NAME[name]
        assert f.lo is not None and f.hi is not None and f.lo <= rows[0][name] <= f.hi
    # A job that left the GPU leaves its rows empty and is forgotten.
    rows = [{"gpu": 0, "mig_instance": None}]
    job.label(rows, {})
    assert all(rows[0][f] is None for f in JOB_FIELDS)
    assert job._last == {} and job._pids == {}


class FakeWithProcesses(FakeNvml):
    def __init__(self, pids: dict[int, list[int]]) -> None:
        super().__init__([H100_SXM, H100_SXM])
        self.pids = pids

    def compute_processes(self, handle: FakeHandle) -> list[int]:
        self._enter("compute_processes", handle)
        return self.pids.get(handle.index, [])


def test_the_agent_ships_job_columns_from_the_proc_and_sys_roots(tmp_path: Path) -> None:
    root = host_tree(tmp_path)
    advance(root, 5_000_000, 100, 0, 0, 0, quota="max 100000")
    fake = FakeWithProcesses({0: [312], 1: []})
    for g in fake.gpus:
        g.load()
    mono = [1000.0]
    wall = iter(1_700_000_000.0 + i for i in range(100))
    settings = AgentSettings(
        token="t",
        interval_s=1.0,
        start_jitter_s=0,
        metrics_port=0,
        ship_interval_s=60,
        proc_root=root / "proc",
        sys_root=root / "sys",
        attribute_processes=False,
    )
    agent = Agent(
        settings,
        [NvmlSource(fake, sys_root="/nonexistent")],
        node="node-a",
        spool_dir=tmp_path / "spool",
        wall=lambda: next(wall),
        mono=lambda: mono[0],
        facts_of_node=dict,
    )
    agent.start(ship=False, serve_metrics=False)
    try:
        for k in range(3):
            agent.tick()
            mono[0] += 2.0
            advance(root, 5_000_000 + (k + 1) * 3_000_000, 100, 0, (k + 1) * 100_000, 0, quota="max 100000")
        agent.seal()
        (batch,) = decode_segments(tmp_path / "spool")
    finally:
        agent.shutdown(ship_s=0)
    g: dict[str, Any] = batch["gpu"]
    gpu0 = [i for i, x in enumerate(g["gpu"]) if x == 0]
    gpu1 = [i for i, x in enumerate(g["gpu"]) if x == 1]
    assert len(gpu0) == 3 and g["job_cpu_cores"][gpu0[0]] is None
    # 3 CPU-seconds every 2 s: 1.5 cores; 0.1 s of CPU stall every 2 s: 5 %; no quota, so no throttling share.
    assert g["job_cpu_cores"][gpu0[1]] == pytest.approx(1.5) and g["job_cpu_cores"][gpu0[2]] == pytest.approx(
        1.5
    )
    assert g["job_cpu_pressure_pct"][gpu0[2]] == pytest.approx(5.0)
    assert g["job_cpu_quota_cores"][gpu0[2]] is None and g["job_cpu_throttled_share"][gpu0[2]] is None
    assert all(g["job_cpu_cores"][i] is None for i in gpu1)  # no process on GPU 1


def test_off_by_setting(tmp_path: Path) -> None:
    settings = AgentSettings(token="t", metrics_port=0, job_cgroups=False)
    agent = Agent(
        settings,
        [NvmlSource(FakeNvml([H100_SXM]), sys_root="/nonexistent")],
        node="n",
        spool_dir=tmp_path,
        facts_of_node=dict,
    )
    assert agent.job_cgroups is None
