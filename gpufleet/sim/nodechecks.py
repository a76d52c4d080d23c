"""The node checks a simulated node's agent would send, through the real checks.

A simulated node has no ``/proc`` or ``/sys`` to read, so the
:class:`~gpufleet.agent.diagnose.view.NodeView` the checks judge is built from
the plan: GPUs at their maximum PCIe link with no clocks-event reason (faults
come and go; the facts describe the node), two NUMA nodes splitting the CPUs
and the GPUs in halves, each run's processes in a cgroup of their own under
the node's CPU quota and allowed the CPUs the node's ``job_cpus`` says, and
the node's NFS mount as the agent would have measured it over its last
interval.  The facts then come from the same
:func:`~gpufleet.agent.diagnose.report.node_facts` as a real agent's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.agent.diagnose.checks import run_checks
from gpufleet.agent.diagnose.report import node_facts
from gpufleet.agent.diagnose.view import GpuView, JobView, NodeView, ProcView
from gpufleet.agent.sources.cgroup import CgroupPlace, CgroupRates, Quota
from gpufleet.agent.sources.mountstats import NfsRates
from gpufleet.sim.plan import FleetPlan, NodePlan

#: The agent's facts interval, s: NFS figures are over this long.
FACTS_INTERVAL_S = 300.0
_NFS = {
    "healthy": dict(
        ops=24_000,
        retrans=0,
        timeouts=0,
        errors=0,
        queue_ms=0.4,
        rtt_ms=1.8,
        execute_ms=2.4,
        backlog=0.02,
        read_bytes_s=310e6,
    ),
    "stalled": dict(
        ops=3_100,
        retrans=37,
        timeouts=3,
        errors=0,
        queue_ms=240.0,
        rtt_ms=420.0,
        execute_ms=61_000.0,
        backlog=9.5,
        read_bytes_s=12e6,
    ),
}


def numa_of(n: NodePlan) -> dict[int, list[int]]:
    half = max(1, n.cpu_count // 2)
    return {0: list(range(half)), 1: list(range(half, n.cpu_count))}


def gpu_numa_node(n: NodePlan, gpu: int) -> int:
    return 0 if gpu < len(n.gpu_idx) // 2 else 1


def node_view(plan: FleetPlan, name: str) -> NodeView:
    n = plan.nodes[name]
    prof = n.profile
    numa = numa_of(n)
    view = NodeView(
        gpu_source="sim",
        numa=numa,
        governors={n.cpu_governor: n.cpu_count},
        cpu_count=n.cpu_count,
        interval_s=FACTS_INTERVAL_S,
    )
    root = Path("/sys/fs/cgroup")
    for ri, run in enumerate(plan.runs):
        mine = [plan.gpus[gi] for gi in run.gpu_idx.tolist() if plan.gpus[gi].node == name]
        if not mine:
            continue
        path = f"/kubepods.slice/kubepods-pod{ri:04d}.slice/cri-containerd-{run.run_id}.scope"
        place = CgroupPlace(2, path, root / path.lstrip("/"), root)
        quota = Quota(n.cpu_quota_cores, "cfs" if n.cpu_quota_cores is not None else None)
        pids = []
        for gp in mine:
            pid = 10_000 + 100 * ri + gp.gpu
            pids.append(pid)
            node = gpu_numa_node(n, gp.gpu)
            allowed = {"all": list(range(n.cpu_count)), "local": numa[node], "remote": numa[1 - node]}[
                n.job_cpus
            ]
            view.procs[pid] = ProcView(pid, allowed, allowed[0] if allowed else None, place)
        view.jobs.append(
            JobView(
                place, quota, [gp.gpu for gp in mine], pids, CgroupRates(cpu_quota_cores=n.cpu_quota_cores)
            )
        )
    for gi in n.gpu_idx:
        gp = plan.gpus[gi]
        row = {
            "gpu": gp.gpu,
            "uuid": gp.uuid,
            "pcie_gen": prof.pcie_gen_max,
            "pcie_gen_max": prof.pcie_gen_max,
            "pcie_width": prof.pcie_width_max,
            "pcie_width_max": prof.pcie_width_max,
            "throttle_reasons": 0,
            "power_limit_w": prof.tdp_w,
        }
        node = gpu_numa_node(n, gp.gpu)
        pids = sorted(p for p, pv in view.procs.items() if pv.cgroup is not None and p % 100 == gp.gpu)
        view.gpus.append(
            GpuView(
                gp.gpu,
                prof.name,
                gp.uuid,
                f"00000000:{0x18 + 0x10 * gp.gpu:02X}:00.0",
                node,
                numa[node],
                row,
                None,
                pids,
            )
        )
    if n.nfs in _NFS:
        view.nfs.append(
            NfsRates("/datasets", "nas-01:/export/datasets", FACTS_INTERVAL_S, False, **_NFS[n.nfs])  # type: ignore[arg-type]
        )
    return view


def node_check_facts(plan: FleetPlan, name: str) -> dict[str, Any]:
    view = node_view(plan, name)
    return node_facts(run_checks(view), view)
