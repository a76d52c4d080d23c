"""The agent sends the node checks as typed facts: with the first batch, and again when they change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.agent import scheduler as scheduler_mod
from gpufleet.agent.runtime import Agent
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.config import AgentSettings
from gpufleet.facts import NodeFacts, check_facts
from tests.agent.test_diagnose import PID, GpusWithProcesses, host, loaded
from tests.agent.test_runtime import decode_segments
from tests.conftest import realdata


@pytest.fixture(autouse=True)
def no_first_read_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_mod, "FIRST_READ_TIMEOUT_S", 0.0)


def test_checks_go_with_the_first_facts_and_again_only_on_change(tmp_path: Path) -> None:
    root = host(tmp_path)
    # The agent's start reads /proc/stat once; the first facts take iowait over root1 -> root2.
    fake = loaded(GpusWithProcesses({0: [PID], 1: []}, ["00000000:01:00.0", "00000000:45:00.0"]))
    fake.gpus[1].set(pcie_width=8)
    mono = [100.0]
    wall = iter(1_700_000_000.0 + i for i in range(1000))
    settings = AgentSettings(
        token="t",
        interval_s=1.0,
        start_jitter_s=0,
        metrics_port=0,
        ship_interval_s=600,
        facts_interval_s=60,
        proc_root=root / "proc",
        sys_root=root / "sys",
        attribute_processes=False,
    )
    agent = Agent(
        settings,
        [NvmlSource(fake, sys_root=root / "sys")],
        node="node-a",
        spool_dir=tmp_path / "spool",
        wall=lambda: next(wall),
        mono=lambda: mono[0],
        facts_of_node=dict,
    )
    agent.start(ship=False, serve_metrics=False)
    sent = []
    try:
        for step in range(7):
            if step == 0:
                for name in ("stat", "uptime"):
                    shutil.copy(realdata("sysstat", "root2", "proc", name), root / "proc" / name)
            if step == 4:  # an operator fixes the governor
                for gov in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"):
                    gov.write_text("performance\n")
            sent.append(agent.tick().facts)
            if step == 0:
                agent.seal()  # the first facts in a batch of their own
            mono[0] += 30.0  # a facts refresh every other tick
        agent.seal()
        batches = decode_segments(tmp_path / "spool")
    finally:
        agent.shutdown(ship_s=0)
    # Refreshes at ticks 0, 2, 4 and 6.  Tick 0: the first facts.  Tick 2: the first figures over an
    # interval (NFS over 60 s rather than since the mount; no CPU ticks on this frozen /proc/stat).
    # Tick 4: the governor fix.  Tick 6: nothing moved, nothing sent.
    assert sent == [True, False, True, False, True, False, False]
    first, last = batches
    assert last["facts"]["checks_status"] == "fail"  # the PCIe link still fails after the fix
    assert [c["status"] for c in last["facts"]["checks"] if c["check"] == "cpu_governor"] == ["ok"]
    facts = first["facts"]
    assert check_facts(facts) is facts
    nf = NodeFacts.read(facts)
    assert nf.checks is not None and nf.checks_status == "fail"
    by = {(c.check, c.subject): c for c in nf.checks}
    assert by[("pcie_link", "gpu1")].status == "fail" and by[("pcie_link", "gpu1")].value == "Gen5 x8"
    assert by[("cpu_governor", "node")].status == "fail"  # powersave until the fix
    assert by[("iowait", "node")].status == "ok" and by[("iowait", "node")].value == pytest.approx(
        0.12, abs=0.01
    )
    assert nf.gpu_processes is not None and nf.gpu_processes[0].gpu == 0
    assert nf.gpu_processes[0].numa_nodes == [0, 1] and nf.gpu_processes[0].gpu_numa_node == 1
    assert nf.job_cgroups is not None and nf.job_cgroups[0].gpus == [0]
    assert nf.nfs_mounts is not None and nf.nfs_mounts[0].mountpoint == "/mnt/nfs/test"
    assert facts["driver_version"] and facts["gpu_count"] == 2  # the NVML source's own facts still there


def test_simulated_nodes_carry_their_own_checks(tmp_path: Path) -> None:
    from gpufleet.agent.diagnose.agentfacts import NodeChecks

    checks = NodeChecks(tmp_path / "proc", tmp_path / "sys", kernel_log=None)
    assert checks.facts([], {"simulated": True}, {}) == {}
