"""The whole checklist: memory, kernel log, network, data-loader workers, small files, DCGM's diagnostic.

Golden inputs are real captures (tests/fixtures/realdata/SOURCES.md): meminfo
and vmstat of three kernels, dmesg and /dev/kmsg text from H100 nodes (XID
119, XID 13 storms), the hung tasks of node-problem-detector's kernel-log
corpus, an H100 node's InfiniBand HCAs, ``dcgmi diag -j`` documents.  Where
a capture has no fault, the test moves the counters on as the fault would
(symbol errors, swap traffic), or derives a failing document from the real
one, and says so.  A fake ``dcgmi`` or ``dmesg`` on PATH prints the captures
as the tools would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.agent.diagnose.checks import CHECKLIST, run_checks
from gpufleet.agent.diagnose.dataset import DatasetSample, check_dataset, fs_type_of, sample_dataset
from gpufleet.agent.diagnose.dcgm_diag import (
    DiagResult,
    DiagSchedule,
    check_dcgm_diag,
    parse_diag_json,
    read_result,
    run_diag,
    write_result,
)
from gpufleet.agent.diagnose.kernel_log import (
    CommandLog,
    DevKmsg,
    FileLog,
    FirstReadable,
    KernelLine,
    KernelLogUnavailable,
    check_hung_tasks,
    check_nfs_servers,
    check_xids,
    parse_dmesg_line,
    read_findings,
    scan,
)
from gpufleet.agent.diagnose.loaders import ProcCpu, TreeSample, check_loaders, loader_view, sample_tree
from gpufleet.agent.diagnose.memory import (
    check_hugepages,
    check_memory_available,
    check_swap,
    memory_view,
    read_memory,
)
from gpufleet.agent.diagnose.network import check_ib_ports, check_nics
from gpufleet.agent.diagnose.result import Check
from gpufleet.agent.diagnose.view import GpuInput, GpuView, NodeSampler, NodeView
from gpufleet.cli import app
from gpufleet.facts import NodeFacts, check_facts
from tests.conftest import realdata

GIB = 1024**3


def by(checks: list[Check], name: str, subject: str | None = None) -> Check:
    hits = [c for c in checks if c.check == name and (subject is None or c.subject == subject)]
    assert len(hits) == 1, (name, subject, [(c.check, c.subject) for c in checks])
    return hits[0]


# --------------------------------------------------------------------------- every item listed


def test_every_item_is_listed_on_an_empty_view() -> None:
    checks = run_checks(
        NodeView(gpu_error="nvml: nvmlInit: NVML Shared Library Not Found", gpu_source="nvml")
    )
    assert {c.check for c in checks} == set(CHECKLIST)
    assert [c.check for c in checks] == sorted((c.check for c in checks), key=CHECKLIST.index)
    gpu_items = ("pcie_link", "clocks_event_reasons", "nvlink", "numa_affinity", "dataloader_workers")
    for name in gpu_items:
        c = by(checks, name)
        assert c.status == "skipped" and "NVML Shared Library Not Found" in c.finding
    assert by(checks, "gpu_source").status == "unknown"
    assert by(checks, "small_files").status == "skipped" and "--dataset" in by(checks, "small_files").finding


def test_skipped_items_are_valid_node_facts() -> None:
    from gpufleet.agent.diagnose.report import node_facts

    view = NodeView(gpu_error="no GPU source (--source none)")
    facts = node_facts(run_checks(view), view)
    assert check_facts(facts) is facts
    read = NodeFacts.read(facts)
    assert read.checks is not None and {c.status for c in read.checks} >= {"skipped"}


# --------------------------------------------------------------------------- memory


def proc_with(tmp_path: Path, meminfo: Path, vmstat: Path | None = None, psi: Path | None = None) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    shutil.copy(meminfo, proc / "meminfo")
    if vmstat is not None:
        shutil.copy(vmstat, proc / "vmstat")
    if psi is not None:
        (proc / "pressure").mkdir(exist_ok=True)
        shutil.copy(psi, proc / "pressure" / "memory")
    return proc


def test_memavailable_as_the_kernel_gives_it(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, realdata("sysstat", "root1", "proc", "meminfo"))
    view = NodeView(memory=memory_view(None, read_memory(proc), None))
    c = check_memory_available(view)
    # MemAvailable 4389516 kB of MemTotal 8144960 kB: 53.9 %.
    assert c.status == "ok" and c.value == pytest.approx(100 * 4389516 / 8144960, abs=0.01)
    assert "MemAvailable" in c.finding and not c.evidence["estimated"]
    assert check_hugepages(view).status == "ok" and check_swap(view).status == "unknown"


def test_old_kernel_without_memavailable_is_estimated(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, realdata("procfs", "proc", "meminfo"))
    c = check_memory_available(NodeView(memory=memory_view(None, read_memory(proc), None)))
    # MemFree 440324 + Buffers 1020128 + Cached 12007640 + SReclaimable 1738124 - Shmem 1308 kB of 15666184 kB.
    est = 440324 + 1020128 + 12007640 + 1738124 - 1308
    assert c.evidence["estimated"] and c.evidence["mem_available_bytes"] == est * 1024
    assert c.status == "ok" and "estimated" in c.finding


def test_swap_traffic_between_two_readings(tmp_path: Path) -> None:
    proc = proc_with(
        tmp_path,
        realdata("node_exporter", "proc", "meminfo"),
        realdata("node_exporter", "proc", "vmstat"),
        realdata("node_exporter", "proc", "pressure", "memory"),
    )
    first = read_memory(proc)
    assert first.swapped_pages == 1476 + 35045
    quiet = NodeView(memory=memory_view(first, read_memory(proc), 2.0), interval_s=2.0)
    swap = check_swap(quiet)
    # SwapTotal 4194300 kB, SwapFree 3155360 kB: about 1 GiB swapped out, and idle now.
    assert swap.status == "ok" and swap.evidence["swap_used_bytes"] == (4194300 - 3155360) * 1024
    text = (
        (proc / "vmstat")
        .read_text()
        .replace("pswpin 1476", "pswpin 2476")
        .replace("pswpout 35045", "pswpout 35445")
    )
    (proc / "vmstat").write_text(text)  # 1400 pages in 2 s: thrashing
    busy = NodeView(memory=memory_view(first, read_memory(proc), 2.0), interval_s=2.0)
    assert (check_swap(busy).status, check_swap(busy).value) == ("fail", 700.0)
    (proc / "pressure" / "memory").write_text(
        "some avg10=0 avg60=0 avg300=0 total=900000\nfull avg10=0 avg60=0 avg300=0 total=400000\n"
    )
    stalled = NodeView(memory=memory_view(first, read_memory(proc), 2.0), interval_s=2.0)
    # 0.4 s of 2 s with every task waiting: 20 % full stall.
    assert stalled.memory is not None and stalled.memory.psi_full == pytest.approx(0.2)
    assert check_memory_available(stalled).status == "fail"


def test_idle_huge_pages_warn(tmp_path: Path) -> None:
    text = realdata("sysstat", "root1", "proc", "meminfo").read_text()
    text = text.replace("HugePages_Total:       0", "HugePages_Total:    1024").replace(
        "HugePages_Free:        0", "HugePages_Free:      900"
    )
    (tmp_path / "meminfo").write_text(text)
    c = check_hugepages(
        NodeView(memory=memory_view(None, read_memory(proc_with(tmp_path, tmp_path / "meminfo")), None))
    )
    # 900 free of 1024 pages of 2 MiB: 1.76 GiB idle of 7.8 GiB.
    assert c.status == "warn" and c.value == pytest.approx(900 * 2 / 1024, abs=0.01)


def test_memory_not_readable_is_skipped(tmp_path: Path) -> None:
    view = NodeView(memory=memory_view(None, read_memory(tmp_path), None))
    assert {check_memory_available(view).status, check_hugepages(view).status, check_swap(view).status} == {
        "skipped"
    }


# --------------------------------------------------------------------------- kernel log


def test_dmesg_line_layouts() -> None:
    mono = parse_dmesg_line("<4>[ 1126.635824] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.144.03")
    assert (
        mono is not None
        and mono.boot_s == pytest.approx(1126.635824)
        and mono.text.startswith("NVRM: loading")
    )
    iso = parse_dmesg_line(
        "kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:38:00): 13, x"
    )
    assert iso is not None and iso.epoch == pytest.approx(
        datetime.fromisoformat("2025-01-21T04:41:44.283302+00:00").timestamp()
    )
    sys_ = parse_dmesg_line(
        "Mar  5 08:31:52 puma kernel: [10359910.034733] INFO: task a:1 blocked for more than 120 seconds."
    )
    assert (
        sys_ is not None
        and sys_.boot_s == pytest.approx(10359910.034733)
        and sys_.text.startswith("INFO: task")
    )


def ctime_epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y").timestamp()


def test_xid_119_on_an_h100_from_dmesg_ctime() -> None:
    now = ctime_epoch("Sun Feb 23 16:24:18 2025") + 3600
    f = read_findings(FileLog(realdata("gpud", "dmesg", "dmesg-with-xid-119.log")), now, None)
    assert f.xids == {119: {"0000:9b:00"}}
    c = check_xids(NodeView(kernel=f))
    # XID 119 (GSP RPC timeout) is firmware: reset the GPU, not the job's fault, not a board to replace.
    assert c.status == "warn" and "119 (GSP RPC timeout)" in c.finding and "reset the GPU" in c.decision
    # A day later it is history: counted, not judged.
    later = read_findings(FileLog(realdata("gpud", "dmesg", "dmesg-with-xid-119.log")), now + 86400, None)
    assert later.xids == {} and later.older == {"xid": f.xid_lines}
    assert check_xids(NodeView(kernel=later)).status == "ok"


def test_xid_13_storm_from_decoded_iso_dmesg() -> None:
    log = FileLog(realdata("gpud", "dmesg", "dmesg.decode.iso.log"))
    now = datetime.fromisoformat("2025-01-21T05:00:00+00:00").timestamp()
    f = read_findings(log, now, None)
    assert set(f.xids) == {13, 43} and f.xid_lines >= 8  # the storm ends with XID 43 (channel reset)
    c = check_xids(NodeView(kernel=f))
    assert c.status == "warn" and "the job's own faults" in c.decision


def test_hardware_xid_fails() -> None:
    # The captured line with its code changed to 79 (GPU has fallen off the bus), as the driver prints it.
    text = (
        realdata("gpud", "dmesg", "dmesg-with-xid-119.log")
        .read_text()
        .splitlines()[2]
        .replace("): 119,", "): 79,")
    )
    line = parse_dmesg_line(text)
    assert line is not None
    c = check_xids(NodeView(kernel=scan([line], "dmesg", line.epoch or 0.0, None)))
    assert c.status == "fail" and "drain the node" in c.decision


def test_kmsg_records_without_faults(tmp_path: Path) -> None:
    log = DevKmsg(realdata("gpud", "kmsg", "kmsg.1.log"))
    lines = log.read()
    assert (
        lines
        and lines[0].text == "nvidia-nvswitch2: open (major=510)"
        and lines[0].boot_s == pytest.approx(206.764307)
    )
    f = read_findings(log, time.time(), uptime_s=300.0)
    checks = [
        check_xids(NodeView(kernel=f)),
        check_hung_tasks(NodeView(kernel=f)),
        check_nfs_servers(NodeView(kernel=f)),
    ]
    assert [c.status for c in checks] == ["ok", "ok", "ok"]


def test_hung_tasks_from_node_problem_detector_corpus() -> None:
    lines = [
        *FileLog(realdata("node-problem-detector", "problems", "docker_hung")).read(),
        *FileLog(realdata("node-problem-detector", "problems", "aufs_umount_hung")).read(),
    ]
    f = scan(lines, "kern.log", time.time(), None)
    assert f.hung == {"docker": 1, "umount.aufs": 1} and f.undated == 2
    c = check_hung_tasks(NodeView(kernel=f))
    assert c.status == "fail" and c.value == 2 and "uninterruptible sleep" in c.decision


def test_oom_kill_shows_on_memory() -> None:
    f = scan(
        FileLog(realdata("node-problem-detector", "problems", "oom_kill")).read(),
        "kern.log",
        time.time(),
        None,
    )
    assert f.oom == ["heapster"]


def test_nfs_server_not_responding_then_ok() -> None:
    # The kernel's own messages (fs/nfs, net/sunrpc: "%s: server %s not responding, still trying" and
    # "%s: server %s OK"), with the [seconds since boot] stamps dmesg prints.
    down = [
        parse_dmesg_line("[ 5000.100000] nfs: server fs01 not responding, still trying"),
        parse_dmesg_line("[ 5002.200000] nfs: server fs01 not responding, timed out"),
    ]
    back = [parse_dmesg_line("[ 5090.000000] nfs: server fs01 OK")]
    lines = [x for x in down if x is not None]
    stalled = check_nfs_servers(NodeView(kernel=scan(lines, "dmesg", 0.0, uptime_s=5100.0)))
    assert stalled.status == "fail" and "fs01" in stalled.finding
    recovered = check_nfs_servers(
        NodeView(kernel=scan(lines + [x for x in back if x], "dmesg", 0.0, uptime_s=5100.0))
    )
    assert recovered.status == "warn" and "came back" in recovered.finding


def fake_tool(tmp_path: Path, name: str, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / name
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return bin_dir


def test_dmesg_command_and_its_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture = realdata("gpud", "dmesg", "dmesg-with-xid-119.log")
    bin_dir = fake_tool(tmp_path, "dmesg", f'cat "{capture}"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    lines = CommandLog(["dmesg", "--ctime"]).read()
    assert any("NVRM: Xid" in x.text for x in lines)
    fake_tool(
        tmp_path, "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n'
    )
    with pytest.raises(KernelLogUnavailable, match="no permission"):
        CommandLog(["dmesg"]).read()
    chain = FirstReadable([DevKmsg(tmp_path / "no-kmsg"), CommandLog(["dmesg"])])
    f = read_findings(chain, time.time(), None)
    assert f.error is not None and "does not exist" in f.error and "no permission" in f.error
    skipped = [
        check_xids(NodeView(kernel=f)),
        check_hung_tasks(NodeView(kernel=f)),
        check_nfs_servers(NodeView(kernel=f)),
    ]
    assert {c.status for c in skipped} == {"skipped"} and all("no permission" in c.finding for c in skipped)


def test_kernel_line_ages_from_boot_time() -> None:
    lines = [
        KernelLine("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE", boot_s=100.0),
        KernelLine("NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, row remap", boot_s=90_000.0),
    ]
    f = scan(lines, "/dev/kmsg", 0.0, uptime_s=90_100.0)
    assert f.xids == {63: {"0000:3b:00"}} and f.older == {"xid": 1}


# --------------------------------------------------------------------------- network


def host_tree(tmp_path: Path) -> tuple[Path, Path]:
    from tests.agent.test_fabric_source import host_tree as fabric_tree

    return fabric_tree(tmp_path)


def test_nic_and_ib_items_between_two_readings(tmp_path: Path) -> None:
    from tests.agent.test_fabric_source import bump, move_net

    proc, sys_root = host_tree(tmp_path)
    t = [0.0]
    sampler = NodeSampler(proc, sys_root, clock=lambda: t[0], kernel_log=None)
    first = run_checks(sampler.sample([]))
    assert by(first, "nic", "eth0").status == "unknown"
    assert {c.subject for c in first if c.check == "ib_port"} == {"mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1"}
    move_net(proc, "eth0", rx=225_000_000, tx=1_000_000)  # 112.5 MB/s of 125: 90 %
    c0 = sys_root / "class/infiniband/mlx5_0/ports/1/counters"
    bump(c0 / "symbol_error", 12)  # a failing cable
    bump(c0 / "port_rcv_data", 1_000_000)
    (sys_root / "class/infiniband/mlx5_bond_0/ports/1/state").write_text("1: DOWN\n")
    (proc / "uptime").write_text(f"{float((proc / 'uptime').read_text().split()[0]) + 2.0} 0\n")
    t[0] = 2.0
    checks = run_checks(sampler.sample([]))
    nic = by(checks, "nic", "eth0")
    assert nic.status == "warn" and nic.value == pytest.approx(90.0) and "bottleneck" in nic.decision
    ib0 = by(checks, "ib_port", "mlx5_0/1")
    assert (
        ib0.status == "fail"
        and "12 symbol_error" in ib0.finding
        and ib0.evidence["errors"]["symbol_error"] == 12
    )
    assert by(checks, "ib_port", "mlx5_bond_0/1").status == "warn"
    assert by(checks, "ib_port", "mlx5_1/1").status == "ok"
    move_net(proc, "eth0", rx=1_000, tx=1_000, rx_errs=5)
    (proc / "uptime").write_text(f"{float((proc / 'uptime').read_text().split()[0]) + 2.0} 0\n")
    t[0] = 4.0
    assert by(run_checks(sampler.sample([])), "nic", "eth0").status == "fail"


def test_no_fabric_is_skipped(tmp_path: Path) -> None:
    view = NodeView(nics=[], ib_ports=[])
    assert check_nics(view)[0].status == check_ib_ports(view)[0].status == "skipped"


# --------------------------------------------------------------------------- data-loader workers


def tree(workers: list[float], root_cpu: float, t: float = 0.0) -> TreeSample:
    return TreeSample(
        ProcCpu(100, "python", (100, 1.0), root_cpu),
        tuple(ProcCpu(200 + i, "pt_data_worker", (200 + i, 2.0), c) for i, c in enumerate(workers)),
    )


def loaders_view(prev: TreeSample, curr: TreeSample, util: float) -> NodeView:
    lv = loader_view(0, prev, curr, 2.0)
    return NodeView(gpus=[GpuView(0, row={"util_pct": util}, pids=[100])], loaders=[lv], interval_s=2.0)


def test_saturated_workers_starve_a_waiting_gpu() -> None:
    c = check_loaders(loaders_view(tree([10, 10, 10, 10], 5), tree([12, 11.95, 12, 12], 5.4), util=35))[0]
    assert c.status == "fail" and c.value == 4 and c.evidence["busy_workers"] == 4
    ok = check_loaders(loaders_view(tree([10, 10, 10, 10], 5), tree([10.5, 10.2, 11, 10.1], 5.4), util=35))[0]
    assert ok.status == "ok" and ok.evidence["busy_workers"] == 0


def test_no_workers_and_a_busy_trainer() -> None:
    c = check_loaders(loaders_view(tree([], 5), tree([], 6.9), util=40))[0]
    assert c.status == "fail" and "num_workers" in c.decision
    assert check_loaders(loaders_view(tree([], 5), tree([], 6.9), util=99))[0].status == "warn"


def test_real_process_tree(tmp_path: Path) -> None:
    script = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) for _ in range(3)]\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        first = sample_tree(parent.pid)
        assert len(first.workers) == 3 and first.root.pid == parent.pid
        view = loader_view(0, first, sample_tree(parent.pid), 1.0)
        assert view.workers == 3 and view.worker_cores is not None and len(view.worker_cores) == 3
        sampler = NodeSampler(Path("/proc"), tmp_path / "sys", kernel_log=None)
        sampler.sample([GpuInput(0, {"gpu": 0, "util_pct": 50}, pids=[parent.pid])])
        c = by(
            run_checks(sampler.sample([GpuInput(0, {"gpu": 0, "util_pct": 50}, pids=[parent.pid])])),
            "dataloader_workers",
        )
        assert c.value == 3 and c.evidence["workers"] == 3
    finally:
        for child in __import__("psutil").Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


# --------------------------------------------------------------------------- small files


def make_files(root: Path, n: int, size: int, per_dir: int = 500) -> None:
    blob = os.urandom(size)
    for i in range(n):
        d = root / f"shard{i // per_dir:04d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:07d}.jpg").write_bytes(blob)


def test_small_files_need_many_readers(tmp_path: Path) -> None:
    make_files(tmp_path / "ds", 2000, 16 * 1024)
    # A clock where each step costs 2 ms: the open and read of every file takes that long.
    ticks = iter(range(10**9))
    sample = sample_dataset(tmp_path / "ds", clock=lambda: next(ticks) * 0.002)
    assert sample.files == 2000 and sample.median_bytes == 16 * 1024 and len(sample.read_s) == 32
    c = check_dataset(NodeView(dataset=sample))
    # 1 GB/s of 16 KiB files: 61,035 files/s; one reader at 2 ms per file: 500 files/s, 122 readers.
    assert c.status == "fail" and c.value == pytest.approx(1e9 / 16384, rel=1e-3)
    assert c.evidence["readers_needed"] == pytest.approx(1e9 / 16384 / 500, rel=1e-3)
    assert "shards" in c.decision


def test_listing_stops_at_its_bound(tmp_path: Path) -> None:
    make_files(tmp_path / "ds", 1200, 1024, per_dir=100)
    sample = sample_dataset(tmp_path / "ds", max_entries=300)
    assert sample.truncated and sample.files < 1200
    assert check_dataset(NodeView(dataset=sample)).finding.startswith(f"at least {sample.files:,} files")


def test_large_shards_pass(tmp_path: Path) -> None:
    make_files(tmp_path / "ds", 6, 8 * 1024 * 1024)
    c = check_dataset(NodeView(dataset=sample_dataset(tmp_path / "ds")))
    assert c.status == "ok" and c.value == pytest.approx(1e9 / (8 * 1024 * 1024), rel=1e-3)


def test_missing_dataset_and_fs_type(tmp_path: Path) -> None:
    assert check_dataset(NodeView(dataset=sample_dataset(tmp_path / "nope"))).status == "unknown"
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nfs01:/data {tmp_path} nfs4 rw 0 0\n")
    assert fs_type_of(tmp_path / "x", mounts) == "nfs4" and fs_type_of(Path("/usr"), mounts) == "ext4"
    assert check_dataset(NodeView(dataset=DatasetSample(str(tmp_path)))).status == "unknown"


# --------------------------------------------------------------------------- DCGM


def test_dcgmi_level_1_passes() -> None:
    r = parse_diag_json(realdata("VirtualClient", "DCGMI", "DCGMIDiag_r1_results.json").read_text())
    assert r.error is None and [t.name for t in r.tests][:3] == [
        "Denylist",
        "NVML Library",
        "CUDA Main Library",
    ]
    assert {t.status for t in r.tests} == {"pass"} and len(r.tests) == 9
    c = check_dcgm_diag(NodeView(dcgm_diag=r))
    assert c.status == "ok" and "9 of 9 tests passed" in c.finding


def test_dcgmi_level_3_with_a_skipped_test() -> None:
    r = parse_diag_json(realdata("VirtualClient", "DCGMI", "DCGMIDiag_r3_results.json").read_text())
    eud = next(t for t in r.tests if t.name == "EUD Test")
    assert eud.status == "skip" and eud.gpus == (0,)
    assert {t.category for t in r.tests} == {"Deployment", "Integration", "Hardware", "Stress"}
    assert check_dcgm_diag(NodeView(dcgm_diag=r)).status == "ok"


def failing_doc() -> str:
    """The real level-3 document with GPU Memory failed, as DCGM 3.x reports a failure."""
    doc: dict[str, Any] = json.loads(
        realdata("VirtualClient", "DCGMI", "DCGMIDiag_r3_results.json").read_text()
    )
    for cat in doc["DCGM GPU Diagnostic"]["test_categories"]:
        for test in cat["tests"]:
            if test["name"] == "GPU Memory":
                test["results"][0].update(
                    status="Fail",
                    warnings=["GPU 0 Memory error: double-bit ECC errors detected, row remap pending"],
                )
    return json.dumps(doc)


def test_a_failed_test_fails_the_item() -> None:
    r = parse_diag_json(failing_doc())
    c = check_dcgm_diag(NodeView(dcgm_diag=r))
    assert c.status == "fail" and "GPU Memory on GPU 0" in c.finding and "quarantine" in c.decision
    assert c.value == 1


def test_malformed_document() -> None:
    r = parse_diag_json(realdata("VirtualClient", "DCGMI", "DCGMIIncorrectresults.json").read_text())
    assert r.error is not None and not r.tests
    assert check_dcgm_diag(NodeView(dcgm_diag=r)).status == "unknown"


def test_fake_dcgmi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "fail.json"
    doc.write_text(failing_doc())
    # dcgmi exits non-zero when a test fails and still prints the document.
    bin_dir = fake_tool(
        tmp_path, "dcgmi", f'[ "$1 $2 $3 $4" = "diag -r 1 -j" ] || exit 9\ncat "{doc}"\nexit 226\n'
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    r = run_diag(1)
    assert r.level == 1 and r.error is None and [t.name for t in r.failed] == ["GPU Memory"]
    result_file = tmp_path / "state" / "dcgm-diag.json"
    sched = DiagSchedule(result_file, interval_s=3600)
    assert sched.maybe_start()
    sched.join(30)
    stored = read_result(result_file)
    assert (
        stored is not None and stored.origin == "agent" and [t.name for t in stored.failed] == ["GPU Memory"]
    )
    assert not sched.maybe_start()  # fresh: not due again for an hour
    # What the Slurm prolog saves: dcgmi's own document; its time is the file's.
    raw = tmp_path / "prolog.json"
    shutil.copy(realdata("VirtualClient", "DCGMI", "DCGMIDiag_r1_results.json"), raw)
    prolog = read_result(raw)
    assert prolog is not None and prolog.time == pytest.approx(raw.stat().st_mtime) and len(prolog.tests) == 9


def test_no_dcgmi_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    r = run_diag(1)
    c = check_dcgm_diag(NodeView(dcgm_diag=r))
    assert c.status == "skipped" and "not on PATH" in c.finding
    write_result(tmp_path / "r.json", DiagResult(level=1, time=1.0, origin="agent", error="host engine down"))
    back = read_result(tmp_path / "r.json")
    assert back is not None and back.error == "host engine down"


# --------------------------------------------------------------------------- the command


def test_command_options(tmp_path: Path) -> None:
    from tests.agent.test_diagnose import host

    root = host(tmp_path)
    make_files(tmp_path / "ds", 300, 4096)
    runner = CliRunner()
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
            "--json",
            "--dcgm-diag",
            "0",
            "--dataset",
            str(tmp_path / "ds"),
            "--kernel-log",
            str(realdata("node-problem-detector", "problems", "docker_hung")),
        ],
    )
    doc = json.loads(res.stdout)
    status = {c["check"]: c for c in doc["checks"]}
    assert {c["check"] for c in doc["checks"]} == set(CHECKLIST)
    assert status["hung_tasks"]["status"] == "fail"
    assert status["small_files"]["evidence"]["files"] == 300 and status["small_files"]["status"] == "warn"
    assert status["dcgm_diag"]["status"] == "skipped" and "--dcgm-diag 0" in status["dcgm_diag"]["finding"]
    assert status["gpu_source"]["status"] == "skipped"
    for bad, word in (
        (["--dataset", str(tmp_path / "nope")], "does not exist"),
        (["--kernel-log", str(tmp_path / "nope")], "is not a file"),
        (["--dcgm-diag", "7"], "level"),
    ):
        res = runner.invoke(app, ["diagnose", "--source", "none", *bad])
        assert res.exit_code == 2 and word in res.output
