"""The checks: each turns a :class:`~gpufleet.agent.diagnose.view.NodeView` into findings.

Every :class:`Check` has a status (``ok``, ``warn``, ``fail``, ``unknown``
when the data is not there), the number behind it with its unit, a sentence
saying what was found, and the decision it implies.  Thresholds are those of
the detectors (:class:`gpufleet.detectconfig.DetectorConfig`),
so the node page, ``gpufleet diagnose`` and the ``host_misconfig`` detector
agree on what counts as wrong.

Judgement notes:

* PCIe: a GPU lowers its link *generation* when idle to save power, so a
  lower generation fails only under load (GPU-Util above 0 or board power
  above idle); idle it is a warning to re-check under load.  A narrower
  *width* is never power management: it fails whatever the load.
* Clocks-event reasons: HW slowdown, HW thermal and HW power brake fail (the
  board protects itself); SW thermal warns; the SW power cap warns only when
  the enforced limit is below the model's board power (an operator's cap).
* NUMA: processes confined to CPUs of other NUMA nodes than their GPU's fail;
  unpinned processes pass (the kernel may place them anywhere).
* CPU quota: the job's cgroup (the processes on the GPUs) against
  ``min_cores_per_gpu`` per GPU it feeds; being throttled in many periods
  during the sample warns.  Without processes on the GPUs, the cgroup the
  check itself runs in (the container) is judged against every GPU it sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.agent.diagnose.dataset import check_dataset
from gpufleet.agent.diagnose.dcgm_diag import check_dcgm_diag
from gpufleet.agent.diagnose.kernel_log import check_hung_tasks, check_nfs_servers, check_xids
from gpufleet.agent.diagnose.loaders import check_loaders
from gpufleet.agent.diagnose.memory import check_hugepages, check_memory_available, check_swap
from gpufleet.agent.diagnose.network import check_ib_ports, check_nics
from gpufleet.agent.diagnose.result import Check, Status, skipped
from gpufleet.agent.diagnose.view import GpuView, JobView, NodeView
from gpufleet.agent.sources.facts import summarise_governors
from gpufleet.agent.sources.nvml import format_cpu_list
from gpufleet.agent.sources.placement import nodes_of
from gpufleet.catalog import (
    THROTTLE_APP_CLOCKS,
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
    THROTTLE_SYNC_BOOST,
)
from gpufleet.detectconfig import DetectorConfig
from gpufleet.gpu_models import board_power_w
from gpufleet.nfs import nfs_verdict

#: Reason bits and their names as ``nvidia-smi -q -d PERFORMANCE`` prints them.
REASONS = (
    (THROTTLE_GPU_IDLE, "idle"),
    (THROTTLE_APP_CLOCKS, "applications clocks setting"),
    (THROTTLE_SW_POWER_CAP, "SW power cap"),
    (THROTTLE_HW_SLOWDOWN, "HW slowdown"),
    (THROTTLE_SYNC_BOOST, "sync boost"),
    (THROTTLE_SW_THERMAL, "SW thermal slowdown"),
    (THROTTLE_HW_THERMAL, "HW thermal slowdown"),
    (THROTTLE_HW_POWER_BRAKE, "HW power brake slowdown"),
)
#: A GPU drawing more than this share of its board power above idle is under load.
LOADED_POWER_SHARE = 0.25
#: NVLink traffic below this while PCIe carries several times more, on a busy GPU: collectives on PCIe.
NVLINK_QUIET_BYTES_S = 1e9
PCIE_OVER_NVLINK = 4.0
#: ... but only when PCIe itself is busy: a one-GPU job or a compute-bound step moves a few MB/s
#: over PCIe and nothing over NVLink, which says nothing about where collectives run.
PCIE_HEAVY_BYTES_S = 2e9


#: Every item of the checklist, in its order: each appears at least once in every run.
CHECKLIST: tuple[str, ...] = (
    "gpu_source",
    "pcie_link",
    "clocks_event_reasons",
    "nvlink",
    "cpu_governor",
    "cpu_quota",
    "numa_affinity",
    "dataloader_workers",
    "iowait",
    "nfs",
    "small_files",
    "memory_available",
    "hugepages",
    "swap",
    "kernel_xid",
    "hung_tasks",
    "nfs_server",
    "nic",
    "ib_port",
    "dcgm_diag",
)


def _per_gpu(view: NodeView, name: str, check: Callable[[GpuView], Check], unit: str = "") -> list[Check]:
    if not view.gpus:
        return [skipped(name, "gpus", f"no GPU readings: {view.gpu_error or 'no GPU on this node'}", unit)]
    return [check(g) for g in view.gpus]


def run_checks(view: NodeView, cfg: DetectorConfig | None = None) -> list[Check]:
    """Every item of :data:`CHECKLIST`, in order; one that cannot run here is ``skipped`` with the reason."""
    cfg = cfg or DetectorConfig()
    out: list[Check] = [check_gpu_source(view)]
    out += _per_gpu(view, "pcie_link", check_pcie)
    out += _per_gpu(view, "clocks_event_reasons", check_clocks)
    out += _per_gpu(view, "nvlink", check_nvlink, "GB/s")
    out.append(check_governor(view, cfg))
    out += check_cpu_quota(view, cfg) or [
        skipped("cpu_quota", "node", "no cgroup found for the GPU processes or for this process", "cores")
    ]
    out += check_numa(view) or [
        skipped(
            "numa_affinity",
            "gpus",
            "no process runs on the GPUs"
            if view.gpus
            else f"no GPU readings: {view.gpu_error or 'no GPU on this node'}",
        )
    ]
    out += check_loaders(view)
    out.append(check_iowait(view, cfg))
    out += check_nfs(view, cfg) or [
        skipped("nfs", "node", "no NFS mount seen by the GPU processes or this process", "ms")
    ]
    out.append(check_dataset(view))
    out += [check_memory_available(view), check_hugepages(view), check_swap(view)]
    out += [check_xids(view), check_hung_tasks(view), check_nfs_servers(view)]
    out += check_nics(view)
    out += check_ib_ports(view)
    out.append(check_dcgm_diag(view))
    return out


def _gpu(g: GpuView) -> str:
    return f"gpu{g.index}"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _loaded(g: GpuView) -> bool | None:
    """Whether the GPU works (GPU-Util above 0, or power well above idle); None when unknown."""
    util = _num(g.row.get("util_pct"))
    if util is not None:
        return util > 0
    power, limit = _num(g.row.get("power_w")), _num(g.row.get("power_limit_w"))
    if power is not None and limit:
        return power > LOADED_POWER_SHARE * limit
    return None


# --------------------------------------------------------------------------- GPU side


def check_gpu_source(view: NodeView) -> Check:
    if view.gpu_error is not None:
        if view.gpu_source is None:
            return skipped("gpu_source", "node", view.gpu_error, "GPUs")
        return Check(
            "gpu_source",
            "node",
            "unknown",
            f"no GPU readings: {view.gpu_error}",
            None,
            "GPUs",
            "run on a GPU node with the NVIDIA driver (NVML) or a DCGM host engine; the GPU checks are "
            "skipped",
        )
    return Check(
        "gpu_source",
        "node",
        "ok",
        f"{view.gpu_source or 'GPU source'}: {len(view.gpus)} GPUs",
        len(view.gpus),
        "GPUs",
        "",
    )


def check_pcie(g: GpuView) -> Check:
    r = g.row
    gen, gen_max = _num(r.get("pcie_gen")), _num(r.get("pcie_gen_max"))
    width, width_max = _num(r.get("pcie_width")), _num(r.get("pcie_width_max"))
    src = "NVML"
    if (gen is None or width is None) and g.pci is not None:
        gen, gen_max = g.pci.link_gen, g.pci.max_link_gen
        width, width_max = _num(g.pci.link_width), _num(g.pci.max_link_width)
        src = "sysfs"
    if gen is None or width is None or not gen_max or not width_max:
        return Check(
            "pcie_link",
            _gpu(g),
            "unknown",
            "PCIe link state not reported",
            None,
            "",
            "read it with nvidia-smi -q -d PCI or lspci -vv",
        )
    now = f"Gen{gen:.0f} x{width:.0f}"
    best = f"Gen{gen_max:.0f} x{width_max:.0f}"
    ev = {
        "pcie_gen": gen,
        "pcie_gen_max": gen_max,
        "pcie_width": width,
        "pcie_width_max": width_max,
        "source": src,
    }
    loaded = _loaded(g)
    ev["loaded"] = loaded
    if width < width_max:
        return Check(
            "pcie_link",
            _gpu(g),
            "fail",
            f"link trained at {now} of {best}: fewer lanes",
            now,
            "",
            f"link trained at {now} of {best}: reseat the GPU or its riser, or quarantine the node",
            ev,
        )
    if gen < gen_max:
        if loaded:
            return Check(
                "pcie_link",
                _gpu(g),
                "fail",
                f"link trained at {now} of {best} under load",
                now,
                "",
                f"link trained at {now} of {best}: reseat or quarantine",
                ev,
            )
        return Check(
            "pcie_link",
            _gpu(g),
            "warn",
            f"link at {now} of {best} while idle (power saving lowers the generation)",
            now,
            "",
            "re-run under load; if it stays below the maximum, reseat or quarantine",
            ev,
        )
    return Check("pcie_link", _gpu(g), "ok", f"link at {now}, its maximum", now, "", "", ev)


def reason_names(bits: int) -> list[str]:
    return [name for bit, name in REASONS if bits & bit]


def check_clocks(g: GpuView) -> Check:
    raw = _num(g.row.get("throttle_reasons"))
    if raw is None:
        return Check(
            "clocks_event_reasons",
            _gpu(g),
            "unknown",
            "clocks-event reasons not reported",
            None,
            "",
            "read them with nvidia-smi -q -d PERFORMANCE",
        )
    bits = int(raw)
    names = reason_names(bits)
    value = f"0x{bits:x}"
    ev: dict[str, Any] = {
        "throttle_reasons": bits,
        "reasons": names,
        "sm_clock_mhz": g.row.get("sm_clock_mhz"),
        "temp_c": g.row.get("temp_c"),
        "power_w": g.row.get("power_w"),
        "power_limit_w": g.row.get("power_limit_w"),
    }
    hw = bits & (THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE)
    if hw:
        return Check(
            "clocks_event_reasons",
            _gpu(g),
            "fail",
            f"clocks held down by {', '.join(reason_names(hw))}",
            value,
            "",
            "check cooling, power supplies and the board (nvidia-smi -q -d PERFORMANCE, "
            "dmesg for XIDs); quarantine the node if it persists",
            ev,
        )
    if bits & THROTTLE_SW_THERMAL:
        return Check(
            "clocks_event_reasons",
            _gpu(g),
            "warn",
            "clocks held down by SW thermal slowdown",
            value,
            "",
            "check airflow, fans and inlet temperature",
            ev,
        )
    if bits & THROTTLE_SW_POWER_CAP:
        limit, board = _num(g.row.get("power_limit_w")), board_power_w(g.name)
        ev["board_power_w"] = board
        if limit is not None and board is not None and limit < 0.95 * board:
            return Check(
                "clocks_event_reasons",
                _gpu(g),
                "warn",
                f"power cap {limit:.0f} W of the board's {board:.0f} W holds the clocks",
                value,
                "",
                "raise the power limit (nvidia-smi -pl) unless the cap is intended",
                ev,
            )
        return Check(
            "clocks_event_reasons", _gpu(g), "ok", "at its power limit (full load)", value, "", "", ev
        )
    return Check(
        "clocks_event_reasons",
        _gpu(g),
        "ok",
        ", ".join(names) if names else "no reason set",
        value,
        "",
        "",
        ev,
    )


def check_nvlink(g: GpuView) -> Check:
    r = g.row
    links_up, links_max = _num(r.get("nvlink_links_up")), _num(r.get("nvlink_links_max"))
    if links_max == 0:
        return Check("nvlink", _gpu(g), "ok", "this board has no NVLink", 0, "links", "")
    if links_up is not None and links_max is not None and links_up < links_max:
        return Check(
            "nvlink",
            _gpu(g),
            "fail",
            f"{int(links_max - links_up)} of {int(links_max)} NVLink links down",
            links_up,
            "links",
            "a link down: check nvidia-smi nvlink -s, then reset the GPU or quarantine the node",
            {"links_up": links_up, "links_max": links_max},
        )
    nv = [_num(r.get("nvlink_tx_bytes_s")), _num(r.get("nvlink_rx_bytes_s"))]
    pc = [_num(r.get("pcie_tx_bytes_s")), _num(r.get("pcie_rx_bytes_s"))]
    if all(x is None for x in nv):
        return Check(
            "nvlink",
            _gpu(g),
            "unknown",
            "no NVLink counters (DCGM profiling fields)",
            None,
            "",
            "run the dcgm or dcgm_exporter source to compare NVLink with PCIe traffic",
        )
    nvl = sum(x for x in nv if x is not None)
    pcie = sum(x for x in pc if x is not None)
    ev = {"nvlink_bytes_s": nvl, "pcie_bytes_s": pcie, "loaded": _loaded(g)}
    value = round(nvl / 1e9, 3)
    if (
        _loaded(g)
        and nvl < NVLINK_QUIET_BYTES_S
        and pcie >= PCIE_HEAVY_BYTES_S
        and pcie > PCIE_OVER_NVLINK * max(nvl, 1.0)
    ):
        return Check(
            "nvlink",
            _gpu(g),
            "warn",
            f"busy GPU moves {pcie / 1e9:.2f} GB/s over PCIe and {nvl / 1e9:.2f} GB/s over NVLink",
            value,
            "GB/s",
            "collectives may be running over PCIe: check nvidia-smi nvlink -s and NCCL_P2P_DISABLE / "
            "the NCCL topology",
            ev,
        )
    return Check(
        "nvlink",
        _gpu(g),
        "ok",
        f"NVLink {nvl / 1e9:.2f} GB/s, PCIe {pcie / 1e9:.2f} GB/s",
        value,
        "GB/s",
        "",
        ev,
    )


# --------------------------------------------------------------------------- host side


def check_governor(view: NodeView, cfg: DetectorConfig) -> Check:
    gov = view.governors
    if not gov:
        return Check(
            "cpu_governor",
            "node",
            "unknown",
            "no cpufreq governor (a VM, or the platform sets the frequency)",
            None,
            "",
            "",
        )
    summary = summarise_governors(gov) or ""
    ev = {"cpu_governors": dict(gov)}
    bad = sorted(g for g in gov if g in cfg.bad_governors)
    not_perf = sorted(g for g in gov if g != "performance")
    if bad:
        n = sum(gov[g] for g in bad)
        return Check(
            "cpu_governor",
            "node",
            "fail",
            f"{n} of {sum(gov.values())} CPUs run {', '.join(bad)}",
            summary,
            "",
            "set the governor to performance (cpupower frequency-set -g performance)",
            ev,
        )
    if not_perf:
        return Check(
            "cpu_governor",
            "node",
            "warn",
            f"CPUs run {summary}, not performance",
            summary,
            "",
            "set the governor to performance for training hosts",
            ev,
        )
    return Check("cpu_governor", "node", "ok", "every CPU runs performance", summary, "", "", ev)


def _job_subject(j: JobView) -> str:
    return f"cgroup {j.place.name}"


def check_cpu_quota(view: NodeView, cfg: DetectorConfig) -> list[Check]:
    out = []
    jobs = list(view.jobs)
    if not jobs and view.own is not None:
        own = view.own
        if not view.gpus:
            q = own.quota.cores
            what = (
                f"may use {q:g} cores ({own.quota.kind})"
                if q is not None
                else "has no CPU limit narrower than the host"
            )
            return [
                Check(
                    "cpu_quota",
                    _job_subject(own),
                    "unknown",
                    f"this cgroup {what}; no GPU to judge it against",
                    q,
                    "cores",
                    "",
                    {"cgroup": own.place.name, "cpu_quota_cores": q},
                )
            ]
        jobs = [JobView(own.place, own.quota, [g.index for g in view.gpus], own.pids, own.rates)]
    for j in jobs:
        q = j.quota.cores
        need = cfg.min_cores_per_gpu * len(j.gpus)
        ev: dict[str, Any] = {
            "cgroup": j.place.name,
            "cgroup_version": j.place.version,
            "gpus": j.gpus,
            "pids": j.pids,
            "cpu_quota_cores": q,
            "quota_kind": j.quota.kind,
            "cpu_cores": j.rates.cpu_cores,
            "cpu_throttled_share": j.rates.cpu_throttled_share,
            "cpu_pressure_pct": j.rates.cpu_pressure_pct,
            "min_cores_per_gpu": cfg.min_cores_per_gpu,
        }
        gpus = ", ".join(f"gpu{i}" for i in j.gpus) or "no GPU"
        limit = "cpu.max" if j.place.version == 2 else "cpu.cfs_quota_us"
        if q is not None and j.gpus and q < need:
            out.append(
                Check(
                    "cpu_quota",
                    _job_subject(j),
                    "fail",
                    f"{q:g} cores ({j.quota.kind}) for {len(j.gpus)} GPUs ({gpus})",
                    q,
                    "cores",
                    f"raise the job's CPU limit ({limit}, or the pod's resources.limits.cpu) to at least "
                    f"{need:g} cores, or use fewer loader workers",
                    ev,
                )
            )
            continue
        thr = j.rates.cpu_throttled_share
        if thr is not None and thr >= cfg.job_throttled_high_share:
            out.append(
                Check(
                    "cpu_quota",
                    _job_subject(j),
                    "warn",
                    f"throttled in {100 * thr:.0f} % of CFS periods at {q:g} cores",
                    q,
                    "cores",
                    "the loader needs more CPU than its quota: raise the limit or lighten the loader",
                    ev,
                )
            )
            continue
        if q is None:
            out.append(
                Check(
                    "cpu_quota",
                    _job_subject(j),
                    "ok",
                    f"no CPU limit narrower than the host for {gpus}",
                    None,
                    "cores",
                    "",
                    ev,
                )
            )
        else:
            out.append(
                Check(
                    "cpu_quota",
                    _job_subject(j),
                    "ok",
                    f"{q:g} cores for {len(j.gpus)} GPUs",
                    q,
                    "cores",
                    "",
                    ev,
                )
            )
    return out


def check_numa(view: NodeView) -> list[Check]:
    out = []
    for g in view.gpus:
        if not g.pids:
            continue
        if g.numa_node is None or not view.numa:
            out.append(
                Check(
                    "numa_affinity",
                    _gpu(g),
                    "unknown",
                    "the GPU's NUMA node is not reported",
                    None,
                    "",
                    "",
                    {"pids": g.pids},
                )
            )
            continue
        local = set(view.numa.get(g.numa_node, []))
        remote_only = []
        placed: dict[str, Any] = {}
        for pid in g.pids:
            p = view.procs.get(pid)
            if p is None or p.cpus_allowed is None:
                continue
            nodes = nodes_of(p.cpus_allowed, view.numa)
            last = nodes_of([p.last_cpu], view.numa) if p.last_cpu is not None else []
            placed[str(pid)] = {
                "cpus_allowed": format_cpu_list(p.cpus_allowed),
                "numa_nodes": nodes,
                "last_cpu": p.last_cpu,
                "last_numa_node": last[0] if last else None,
            }
            if not local & set(p.cpus_allowed):
                remote_only.append((pid, nodes))
        ev = {"gpu_numa_node": g.numa_node, "processes": placed}
        if not placed:
            out.append(
                Check(
                    "numa_affinity",
                    _gpu(g),
                    "unknown",
                    "the processes' CPUs are not readable",
                    None,
                    "",
                    "",
                    ev,
                )
            )
        elif remote_only:
            pid, nodes = remote_only[0]
            where = ",".join(str(n) for n in nodes)
            out.append(
                Check(
                    "numa_affinity",
                    _gpu(g),
                    "fail",
                    f"PID {pid} may run only on NUMA node {where}; the GPU is on node {g.numa_node}",
                    f"node {where}",
                    "",
                    f"pin the loader to node {g.numa_node}'s CPUs (numactl --cpunodebind={g.numa_node}, "
                    "or the scheduler's GPU/CPU affinity)",
                    ev,
                )
            )
        else:
            out.append(
                Check(
                    "numa_affinity",
                    _gpu(g),
                    "ok",
                    f"processes may run on the GPU's NUMA node {g.numa_node}",
                    f"node {g.numa_node}",
                    "",
                    "",
                    ev,
                )
            )
    return out


def check_iowait(view: NodeView, cfg: DetectorConfig) -> Check:
    if view.cpu is None:
        return Check("iowait", "node", "unknown", "needs two readings of /proc/stat", None, "%", "")
    iow = view.cpu.get("cpu_iowait_pct")
    ev: dict[str, float | None] = {k: round(v, 2) for k, v in view.cpu.items()}
    ev["interval_s"] = view.interval_s
    if iow is None:
        return Check("iowait", "node", "unknown", "no CPU ticks in the interval", None, "%", "", ev)
    if iow >= cfg.iowait_high_pct:
        return Check(
            "iowait",
            "node",
            "fail",
            f"{iow:.1f} % of CPU time waiting for I/O",
            round(iow, 2),
            "%",
            "the node is I/O-bound: check the data path (local disk %util, the NFS checks)",
            ev,
        )
    if iow >= 0.5 * cfg.iowait_high_pct:
        return Check(
            "iowait",
            "node",
            "warn",
            f"{iow:.1f} % of CPU time waiting for I/O",
            round(iow, 2),
            "%",
            "watch the data path: iowait is half way to I/O-bound",
            ev,
        )
    return Check("iowait", "node", "ok", f"{iow:.1f} % iowait", round(iow, 2), "%", "", ev)


def check_nfs(view: NodeView, cfg: DetectorConfig) -> list[Check]:
    out = []
    for m in view.nfs:
        verdict, why = nfs_verdict(m.ops, m.retrans, m.timeouts, m.queue_ms, m.rtt_ms, cfg)
        status: Status = "fail" if verdict == "fail" else "warn" if verdict == "warn" else "ok"
        span = "since mount" if m.since_mount else f"over {m.interval_s:.0f} s" if m.interval_s else ""
        ev = {
            "device": m.device,
            "ops": m.ops,
            "retrans": m.retrans,
            "timeouts": m.timeouts,
            "errors": m.errors,
            "queue_ms": m.queue_ms,
            "rtt_ms": m.rtt_ms,
            "execute_ms": m.execute_ms,
            "backlog": m.backlog,
            "since_mount": m.since_mount,
            "interval_s": m.interval_s,
        }
        decision = ""
        if status == "fail" and ((m.retrans or 0) > 0 or (m.timeouts or 0) > 0):
            decision = "the server is not answering in time: check the NFS server and the network path"
        elif status == "fail":
            decision = (
                "RPC backlog: the server or the transport is saturated; add connections (nconnect) "
                "or move the data set to local disk"
            )
        elif status == "warn":
            decision = "slow server: check its load, or cache the data set locally"
        if m.since_mount and status != "ok":
            status = "warn"  # old history: the counters cannot say whether it stalls now
            decision = (decision + "; counted since mount: re-run to see whether it stalls now").lstrip("; ")
        value = round(m.queue_ms, 2) if m.queue_ms is not None else None
        out.append(
            Check(
                "nfs", m.mountpoint, status, f"{why} ({span})".replace(" ()", ""), value, "ms", decision, ev
            )
        )
    return out
