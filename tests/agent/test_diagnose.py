"""``gpufleet diagnose`` on real /proc, /sys, cgroup and mountstats contents, with the fake NVML.

The host tree is assembled from the real captures in tests/fixtures/hostfs
(provenance in its SOURCES.md) and tests/fixtures/realdata: node_exporter's
sysfs (NUMA nodes, powersave governors, a PCIe link at 8 GT/s of 16 GT/s),
procfs's process status and NFS mountstats, a real cgroup v2 container, and
sysstat's successive /proc/stat snapshots.  The GPU process of the fake NVML
is that process, in that container.  Between the two readings the test moves
the counters on (the next /proc/stat snapshot; NFS and cgroup counters as a
stall or a throttled loader would).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.agent.diagnose.checks import CHECKLIST, check_iowait, check_nfs, run_checks
from gpufleet.agent.diagnose.report import document, node_facts, table
from gpufleet.agent.diagnose.result import Check, worst
from gpufleet.agent.diagnose.run import diagnose
from gpufleet.agent.diagnose.view import NodeView
from gpufleet.agent.sources.mountstats import nfs_rates, parse_mountstats
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.agent.sources.placement import cpus_allowed, numa_nodes, pci_device, pcie_gen
from gpufleet.catalog import THROTTLE_HW_SLOWDOWN, THROTTLE_SW_POWER_CAP
from gpufleet.cli import app
from gpufleet.detectconfig import DetectorConfig
from gpufleet.facts import NodeFacts, check_facts
from gpufleet.sim.nvml_fake import H100_SXM, FakeHandle, FakeNvml
from tests.conftest import realdata

HOSTFS = Path(__file__).resolve().parents[1] / "fixtures" / "hostfs"
#: The host tree is all these tests read: not this machine's kernel log or DCGM.
HERMETIC: dict[str, Any] = {"kernel_log": None, "dcgm_level": 0}
PID = 26231
SCOPE = (
    "sys/fs/cgroup/system.slice/docker-1c8fa019edd4b9d4b2856f4932c55929c5c118c808ed5faee9a135ca6e84b039.scope"
)


def fixture(*parts: str) -> Path:
    path = HOSTFS.joinpath(*parts)
    assert path.exists(), f"fixture missing: {path} (see tests/fixtures/hostfs/SOURCES.md)"
    return path


def host(tmp_path: Path) -> Path:
    """One host tree from the real captures (see the module docstring)."""
    root = tmp_path / "host"
    shutil.copytree(fixture("node_exporter"), root, symlinks=True)
    shutil.copytree(fixture("procfs", "proc"), root / "proc", dirs_exist_ok=True)
    shutil.copytree(fixture("cgroup_v2_docker", "sys"), root / "sys", dirs_exist_ok=True)
    (root / "proc" / str(PID) / "cgroup").write_text(
        fixture("cgroup_v2_docker", "proc/312/cgroup").read_text()
    )
    for name in ("stat", "uptime"):
        shutil.copy(realdata("sysstat", "root1", "proc", name), root / "proc" / name)
    return root


class GpusWithProcesses(FakeNvml):
    """The fake NVML plus the process listing (as ``nvmlDeviceGetComputeRunningProcesses``)."""

    def __init__(self, pids: dict[int, list[int]], bus_ids: list[str]) -> None:
        super().__init__([H100_SXM] * len(bus_ids))
        self.pids = pids
        self.bus_ids = bus_ids

    def compute_processes(self, handle: FakeHandle) -> list[int]:
        self._enter("compute_processes", handle)
        return self.pids.get(handle.index, [])

    def pci_bus_id(self, handle: FakeHandle) -> str:
        self._enter("pci_bus_id", handle)
        return self.bus_ids[handle.index]

    def numa_node(self, handle: FakeHandle) -> int:
        self._enter("numa_node", handle)
        return 1 if handle.index == 0 else 0


def loaded(fake: FakeNvml) -> FakeNvml:
    for g in fake.gpus:
        g.load()
    return fake


def next_reading(root: Path, *, retrans: int = 0, throttled: bool = False) -> Any:
    """The counters a few seconds later: the next /proc/stat snapshot, NFS and cgroup counters moved on."""

    def sleep(_s: float) -> None:
        for name in ("stat", "uptime"):
            shutil.copy(realdata("sysstat", "root2", "proc", name), root / "proc" / name)
        ms = root / "proc" / str(PID) / "mountstats"
        text = ms.read_text()
        # 500 more READs in the interval, each waiting 80 ms in the backlog; some retransmitted.
        text = text.replace(
            "READ: 1298 1298 0 207680 1210292152 6 79386 79407",
            f"READ: 1798 {1798 + retrans} 0 287680 1734580152 40006 99386 139407",
        )
        ms.write_text(text)
        scope = root / SCOPE
        if throttled:
            (scope / "cpu.max").write_text("200000 100000\n")
            (scope / "cpu.stat").write_text(
                "usage_usec 26776130245\nuser_usec 0\nsystem_usec 0\nnr_periods 21\n"
                "nr_throttled 20\nthrottled_usec 900000\n"
            )

    return sleep


def by(checks: list[Check], name: str, subject: str | None = None) -> Check:
    hits = [c for c in checks if c.check == name and (subject is None or c.subject == subject)]
    assert len(hits) == 1, (name, subject, hits)
    return hits[0]


def test_placement_readers_on_real_sysfs_and_procfs() -> None:
    sys_root = fixture("node_exporter", "sys")
    assert numa_nodes(sys_root) == {0: [0, 1], 1: [2, 3], 2: []}
    nvme = pci_device(sys_root, "00000000:01:00.0")  # NVML's spelling finds sysfs's 0000:01:00.0
    assert nvme is not None and (nvme.link_gen, nvme.link_width, nvme.max_link_gen, nvme.max_link_width) == (
        3,
        4,
        4,
        4,
    )
    assert nvme.numa_node is None  # -1: the platform does not say
    nic = pci_device(sys_root, "0000:45:00.0")
    assert nic is not None and nic.numa_node == 0 and nic.link_gen == nic.max_link_gen == 2
    assert pci_device(sys_root, "0000:99:00.0") is None
    assert pcie_gen("16.0 GT/s PCIe") == 4 and pcie_gen("Unknown") is None and pcie_gen(None) is None
    assert cpus_allowed(fixture("procfs", "proc"), PID) == list(range(8))


def test_mountstats_of_real_nfs_mounts() -> None:
    mounts = parse_mountstats(fixture("node_exporter", "proc/10/mountstats").read_text())
    assert [(m.mountpoint, m.fstype, m.proto) for m in mounts] == [
        ("/mnt/nfs/test", "nfs4", "tcp"),
        ("/mnt/nfs/test-dupe", "nfs4", "tcp"),
        ("/mnt/nfs/test-dupe", "nfs", "udp"),
    ]
    first = mounts[0]
    assert first.age_s == 13968 and first.sends == 6428 and first.backlog_u == 0
    assert first.ops["READ"].ops == 1298 and first.ops["READ"].rtt_ms == 79386
    # A queue time printed as an unsigned negative number is unknown, not 18 exa-milliseconds.
    access = mounts[1].ops["ACCESS"]
    assert access.queue_ms is None and access.ops == 2927395007
    since = nfs_rates(None, first, None)
    assert since.since_mount and since.ops == 1298 and since.retrans == 0
    assert since.rtt_ms == pytest.approx(79386 / 1298) and since.interval_s == 13968
    udp = mounts[2]
    # udp's xprt line has no connection fields: sends and bklog_u sit earlier (6428 and 0; 24 is max_slots).
    assert udp.sends == 6428 and udp.backlog_u == 0


def test_diagnose_on_the_real_host_tree(tmp_path: Path) -> None:
    root = host(tmp_path)
    fake = loaded(GpusWithProcesses({0: [PID], 1: []}, ["00000000:01:00.0", "00000000:45:00.0"]))
    fake.gpus[0].set(pcie_gen=3, throttle_reasons=THROTTLE_HW_SLOWDOWN)
    source = NvmlSource(fake, sys_root=root / "sys")
    view, checks = diagnose(
        source, root / "proc", root / "sys", 2.0, sleep=next_reading(root, retrans=3), **HERMETIC
    )
    assert view.interval_s is not None and view.interval_s >= 0
    pcie = by(checks, "pcie_link", "gpu0")
    assert (pcie.status, pcie.value) == ("fail", "Gen3 x16")
    assert pcie.decision == "link trained at Gen3 x16 of Gen5 x16: reseat or quarantine"
    assert by(checks, "pcie_link", "gpu1").status == "ok"
    clocks = by(checks, "clocks_event_reasons", "gpu0")
    assert clocks.status == "fail" and "HW slowdown" in clocks.finding and clocks.value == "0x8"
    gov = by(checks, "cpu_governor")
    assert (gov.status, gov.value) == ("fail", "powersave")
    assert gov.decision.startswith("set the governor to performance")
    # GPU 0 sits on NUMA node 1 (CPUs 2-3); its process may run on 0-7: it can reach the GPU's node.
    numa = by(checks, "numa_affinity", "gpu0")
    assert numa.status == "ok" and numa.evidence["processes"][str(PID)]["numa_nodes"] == [0, 1]
    quota = by(checks, "cpu_quota")
    assert quota.status == "ok" and quota.subject.startswith("cgroup /system.slice/docker-")
    iow = by(checks, "iowait")
    # sysstat's root1 -> root2 snapshots: 29 of 24,841 jiffies in iowait (mpstat prints 0.12).
    assert iow.status == "ok" and iow.value == pytest.approx(100 * 29 / 24841, abs=0.01)
    nfs = by(checks, "nfs", "/mnt/nfs/test")
    assert nfs.status == "fail" and nfs.evidence["retrans"] == 3 and nfs.evidence["ops"] == 500
    assert nfs.evidence["queue_ms"] == pytest.approx(80.0) and not nfs.evidence["since_mount"]
    assert "not answering in time" in nfs.decision
    # The fake board's links are all up and its PCIe carries under a MB/s: nothing says collectives left NVLink.
    assert by(checks, "nvlink", "gpu0").status == "ok"
    assert worst(checks) == "fail"
    text = table(checks, width=120)
    assert text.splitlines()[0].split() == ["STATUS", "CHECK", "SUBJECT", "VALUE", "FINDING"]
    statuses = [line.split()[0] for line in text.splitlines()[1:] if not line.startswith(" ")]
    order = ["fail", "warn", "unknown", "ok", "skipped"]
    assert statuses == sorted(statuses, key=order.index) and statuses[0] == "fail"  # worst first


def test_backlog_alone_and_quiet_mounts(tmp_path: Path) -> None:
    root = host(tmp_path)
    fake = loaded(GpusWithProcesses({0: [PID]}, ["00000000:01:00.0"]))
    _, checks = diagnose(
        NvmlSource(fake, sys_root=root / "sys"),
        root / "proc",
        root / "sys",
        1.0,
        sleep=next_reading(root),
        **HERMETIC,
    )
    nfs = by(checks, "nfs", "/mnt/nfs/test")
    assert nfs.status == "fail" and "backlog" in nfs.finding and "nconnect" in nfs.decision
    # Read once (the agent's first facts): counted since the mount, so a warning at most.
    view = NodeView(
        nfs=[
            nfs_rates(None, m, None)
            for m in parse_mountstats(fixture("node_exporter", "proc/10/mountstats").read_text())
        ]
    )
    assert {c.status for c in check_nfs(view, DetectorConfig())} == {"ok"}


def test_a_throttled_job_below_one_core_per_gpu_fails(tmp_path: Path) -> None:
    root = host(tmp_path)
    fake = loaded(
        GpusWithProcesses(
            {0: [PID], 1: [PID], 2: [PID]}, ["00000000:01:00.0", "00000000:45:00.0", "00000000:46:00.0"]
        )
    )
    _, checks = diagnose(
        NvmlSource(fake, sys_root=root / "sys"),
        root / "proc",
        root / "sys",
        1.0,
        sleep=next_reading(root, throttled=True),
        **HERMETIC,
    )
    quota = by(checks, "cpu_quota")
    assert quota.status == "fail" and quota.value == pytest.approx(2.0)
    # 16 of the 20 CFS periods since the first reading (4 of 1 then, 20 of 21 now) were throttled.
    assert quota.evidence["gpus"] == [0, 1, 2] and quota.evidence["cpu_throttled_share"] == pytest.approx(0.8)
    assert "at least 3 cores" in quota.decision


def test_processes_confined_to_another_numa_node_fail(tmp_path: Path) -> None:
    root = host(tmp_path)
    status = root / "proc" / str(PID) / "status"
    status.write_text(status.read_text().replace("Cpus_allowed_list:\t0-7", "Cpus_allowed_list:\t0-1"))
    fake = loaded(GpusWithProcesses({0: [PID]}, ["00000000:01:00.0"]))
    view, checks = diagnose(
        NvmlSource(fake, sys_root=root / "sys"),
        root / "proc",
        root / "sys",
        0.0,
        sleep=next_reading(root),
        **HERMETIC,
    )
    numa = by(checks, "numa_affinity", "gpu0")
    assert numa.status == "fail" and numa.value == "node 0"
    assert "numactl --cpunodebind=1" in numa.decision
    facts = node_facts(checks, view)
    assert facts["gpu_processes"] == [
        {"gpu": 0, "pids": 1, "gpu_numa_node": 1, "cpus_allowed": "0-1", "numa_nodes": [0]}
    ]
    assert check_facts(facts) is facts
    parsed = NodeFacts.read(facts)
    assert parsed.checks is not None and parsed.checks_status == "fail"
    assert parsed.gpu_processes is not None and parsed.gpu_processes[0].numa_nodes == [0]


def test_sysfs_link_when_the_gpu_source_has_none(tmp_path: Path) -> None:
    root = host(tmp_path)

    class NoLink(NvmlSource):
        def collect(self) -> Any:
            reading = super().collect()
            for r in reading.gpus:
                for k in ("pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"):
                    r[k] = None
            return reading

    fake = loaded(GpusWithProcesses({}, ["00000000:01:00.0"]))
    _, checks = diagnose(
        NoLink(fake, sys_root=root / "sys"),
        root / "proc",
        root / "sys",
        0.0,
        sleep=next_reading(root),
        **HERMETIC,
    )
    pcie = by(checks, "pcie_link", "gpu0")
    assert (pcie.status, pcie.value, pcie.evidence["source"]) == ("fail", "Gen3 x4", "sysfs")


def test_power_cap_below_board_power_warns_and_idle_downshift_is_not_a_fault() -> None:
    from gpufleet.agent.diagnose.view import GpuView

    capped = GpuView(
        0,
        "NVIDIA H100 80GB HBM3",
        row={
            "throttle_reasons": THROTTLE_SW_POWER_CAP,
            "power_limit_w": 450.0,
            "util_pct": 100,
            "pcie_gen": 5,
            "pcie_gen_max": 5,
            "pcie_width": 16,
            "pcie_width_max": 16,
        },
    )
    at_limit = GpuView(
        1, "NVIDIA H100 80GB HBM3", row={"throttle_reasons": THROTTLE_SW_POWER_CAP, "power_limit_w": 700.0}
    )
    idle = GpuView(
        2,
        "NVIDIA H100 80GB HBM3",
        row={
            "util_pct": 0,
            "pcie_gen": 1,
            "pcie_gen_max": 5,
            "pcie_width": 16,
            "pcie_width_max": 16,
            "throttle_reasons": 1,
        },
    )
    narrow = GpuView(
        3, None, row={"util_pct": 0, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 8, "pcie_width_max": 16}
    )
    checks = run_checks(NodeView(gpus=[capped, at_limit, idle, narrow]))
    assert by(checks, "clocks_event_reasons", "gpu0").status == "warn"
    assert by(checks, "clocks_event_reasons", "gpu1").status == "ok"
    assert by(checks, "pcie_link", "gpu2").status == "warn"  # idle GPUs lower the generation to save power
    assert by(checks, "pcie_link", "gpu3").status == "fail"  # a narrower link is never power saving


def test_iowait_thresholds() -> None:
    cfg = DetectorConfig()
    assert check_iowait(NodeView(cpu={"cpu_iowait_pct": 22.0}, interval_s=2.0), cfg).status == "fail"
    assert check_iowait(NodeView(cpu={"cpu_iowait_pct": 9.0}, interval_s=2.0), cfg).status == "warn"
    assert check_iowait(NodeView(), cfg).status == "unknown"


def test_the_command_prints_a_table_or_json_and_exits_1_on_a_failed_check(tmp_path: Path) -> None:
    root = host(tmp_path)
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "diagnose",
            "--fake-nvml",
            "2",
            "--proc-root",
            str(root / "proc"),
            "--sys-root",
            str(root / "sys"),
            "--sample",
            "0",
            "--json",
            "--kernel-log",
            "none",
            "--dcgm-diag",
            "0",
        ],
    )
    assert res.exit_code == 1, res.output  # powersave governor
    doc = json.loads(res.stdout)
    assert doc["status"] == "fail" and doc["gpu_source"] == "nvml"
    # Every item is listed; the fake GPUs run no process and the tree has no /proc/self: nothing to judge there.
    assert [c["check"] for c in doc["checks"]] == sorted(
        (c["check"] for c in doc["checks"]), key=CHECKLIST.index
    )
    assert {c["check"] for c in doc["checks"]} == set(CHECKLIST)
    status = {c["check"]: c["status"] for c in doc["checks"]}
    assert status["cpu_quota"] == status["numa_affinity"] == status["dataloader_workers"] == "skipped"
    assert status["dcgm_diag"] == status["kernel_xid"] == status["small_files"] == "skipped"
    for c in doc["checks"]:
        assert set(c) == {"check", "subject", "status", "finding", "value", "unit", "decision", "evidence"}
    res = runner.invoke(
        app,
        [
            "diagnose",
            "--source",
            "none",
            "--proc-root",
            str(root / "proc"),
            "--sys-root",
            str(root / "sys"),
            "--sample",
            "0",
        ],
    )
    assert res.exit_code == 1 and "gpufleet diagnose on" in res.stdout and "powersave" in res.stdout
    res = runner.invoke(app, ["diagnose", "--source", "bogus"])
    assert res.exit_code == 2


def test_json_document_shape() -> None:
    view = NodeView(interval_s=2.0)
    checks = [Check("iowait", "node", "ok", "1 %", 1.0, "%")]
    doc = document(checks, view, "n1", "2026-12-01T10:00:00Z")
    assert doc == {
        "host": "n1",
        "time": "2026-12-01T10:00:00Z",
        "interval_s": 2.0,
        "gpu_source": None,
        "status": "ok",
        "counts": {"ok": 1},
        "checks": [checks[0].to_dict()],
    }


def test_nvlink_against_pcie_and_governors_short_of_performance() -> None:
    from gpufleet.agent.diagnose.checks import check_governor, check_nvlink
    from gpufleet.agent.diagnose.view import GpuView

    on_pcie = GpuView(
        0,
        row={
            "util_pct": 97,
            "nvlink_tx_bytes_s": 2e8,
            "nvlink_rx_bytes_s": 2e8,
            "pcie_tx_bytes_s": 9e9,
            "pcie_rx_bytes_s": 9e9,
        },
    )
    on_nvlink = GpuView(
        1,
        row={
            "util_pct": 97,
            "nvlink_tx_bytes_s": 150e9,
            "nvlink_rx_bytes_s": 150e9,
            "pcie_tx_bytes_s": 2e9,
            "pcie_rx_bytes_s": 2e9,
        },
    )
    idle = GpuView(2, row={"util_pct": 0, "nvlink_tx_bytes_s": 0.0, "pcie_tx_bytes_s": 1e6})
    # Busy, but PCIe is quiet too (a one-GPU job): no sign of collectives on PCIe.
    alone = GpuView(
        3,
        row={
            "util_pct": 97,
            "nvlink_tx_bytes_s": 0.0,
            "nvlink_rx_bytes_s": 0.0,
            "pcie_tx_bytes_s": 4e5,
            "pcie_rx_bytes_s": 3e5,
        },
    )
    down = GpuView(
        4,
        row={
            "util_pct": 97,
            "nvlink_links_up": 16,
            "nvlink_links_max": 18,
            "nvlink_tx_bytes_s": 150e9,
            "nvlink_rx_bytes_s": 150e9,
        },
    )
    no_nvlink = GpuView(5, row={"util_pct": 97, "nvlink_links_up": 0, "nvlink_links_max": 0})
    c = check_nvlink(on_pcie)
    assert c.status == "warn" and c.value == pytest.approx(0.4) and "NCCL_P2P_DISABLE" in c.decision
    assert check_nvlink(on_nvlink).status == "ok" and check_nvlink(idle).status == "ok"
    assert check_nvlink(alone).status == "ok"
    d = check_nvlink(down)
    assert d.status == "fail" and d.finding == "2 of 18 NVLink links down"
    assert check_nvlink(no_nvlink).finding == "this board has no NVLink"
    cfg = DetectorConfig()
    assert check_governor(NodeView(governors={"ondemand": 4, "performance": 60}), cfg).status == "warn"
    assert check_governor(NodeView(governors={"performance": 64}), cfg).status == "ok"
    assert (
        check_governor(NodeView(governors={"powersave": 2, "performance": 62}), cfg).finding
        == "2 of 64 CPUs run powersave"
    )
