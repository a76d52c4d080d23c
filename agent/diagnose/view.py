"""What the node checks look at, read from the GPU source and the host's ``/proc`` and ``/sys``.

:class:`NodeSampler` keeps the previous reading of every counter (host CPU
times, each job cgroup, each NFS mount), so a :class:`NodeView` carries rates
over the interval since the previous sample: ``gpufleet diagnose`` samples
twice a few seconds apart; the agent samples at each facts refresh.  The GPU
side comes in as catalog rows, source facts and the processes on each GPU,
exactly what the agent's GPU sources (NVML, DCGM) already produce, so no
check talks to NVML itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

from gpufleet.agent.diagnose.dataset import DatasetSample
from gpufleet.agent.diagnose.dcgm_diag import DiagResult
from gpufleet.agent.diagnose.kernel_log import (
    DEFAULT_WINDOW_S,
    KernelFindings,
    KernelLog,
    default_log,
    kernel_view,
)
from gpufleet.agent.diagnose.loaders import LoaderView, TreeSample, loader_view, procfs, sample_tree
from gpufleet.agent.diagnose.memory import MemorySample, MemoryView, memory_view, read_memory
from gpufleet.agent.diagnose.network import IbPortView, NicView, ib_port_views, nic_views
from gpufleet.agent.sources.base import SourceError
from gpufleet.agent.sources.cgroup import CgroupPlace, CgroupRates, CgroupReader, CgroupStats, Quota, rates
from gpufleet.agent.sources.facts import cpu_governors, online_cpu_count, parse_cpu_list
from gpufleet.agent.sources.host import HostSnapshot, cpu_percentages, read_snapshot
from gpufleet.agent.sources.mountstats import NfsMount, NfsRates, nfs_rates, read_mountstats
from gpufleet.agent.sources.placement import PciDevice, cpus_allowed, last_cpu, numa_nodes, pci_device

log = logging.getLogger(__name__)


@dataclass
class GpuView:
    """One physical GPU as the GPU source and sysfs see it."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    #: NUMA node and nearby CPUs (NVML's answer, else the PCI device's sysfs entry).
    numa_node: int | None = None
    local_cpus: list[int] | None = None
    #: The latest catalog row (``pcie_gen``, ``throttle_reasons``, ``util_pct``...).
    row: dict[str, Any] = field(default_factory=dict)
    pci: PciDevice | None = None
    pids: list[int] = field(default_factory=list)


@dataclass
class ProcView:
    pid: int
    cpus_allowed: list[int] | None
    last_cpu: int | None
    cgroup: CgroupPlace | None


@dataclass
class JobView:
    """One cgroup feeding GPUs (or the diagnosing process's own, ``gpus`` empty)."""

    place: CgroupPlace
    quota: Quota
    gpus: list[int]
    pids: list[int]
    rates: CgroupRates


@dataclass
class NodeView:
    gpus: list[GpuView] = field(default_factory=list)
    #: Why there are no GPU readings (NVML missing...), None when the GPU source answered.
    gpu_error: str | None = None
    gpu_source: str | None = None
    procs: dict[int, ProcView] = field(default_factory=dict)
    jobs: list[JobView] = field(default_factory=list)
    #: The cgroup of the process running the checks (the container ``gpufleet diagnose`` runs in).
    own: JobView | None = None
    numa: dict[int, list[int]] = field(default_factory=dict)
    governors: dict[str, int] = field(default_factory=dict)
    cpu_count: int | None = None
    #: mpstat "all" shares over the interval (cpu_user_pct, cpu_iowait_pct...), None on the first sample.
    cpu: dict[str, float] | None = None
    nfs: list[NfsRates] = field(default_factory=list)
    interval_s: float | None = None
    #: Seconds since boot at this reading (``/proc/uptime``).
    uptime_s: float | None = None
    memory: MemoryView | None = None
    #: What the kernel log says (XIDs, hung tasks, NFS servers), or why it could not be read.
    kernel: KernelFindings | None = None
    #: Physical NICs and InfiniBand/RoCE ports over the interval; None when not readable.
    nics: list[NicView] | None = None
    ib_ports: list[IbPortView] | None = None
    #: The process tree of each GPU process (data-loader workers).
    loaders: list[LoaderView] = field(default_factory=list)
    #: The data set sampled for the small-files item (``--dataset``), None when none was given.
    dataset: DatasetSample | None = None
    #: The newest DCGM diagnostic, or why there is none.
    dcgm_diag: DiagResult | None = None
    dcgm_diag_skip: str | None = None


@dataclass
class GpuInput:
    """The GPU source's side of one GPU: its latest row, its facts entry, its processes."""

    index: int
    row: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)


def gpu_inputs(
    rows: list[dict[str, Any]], facts: Mapping[str, Any] | None, processes: Mapping[int, list[int]] | None
) -> list[GpuInput]:
    """Whole-GPU rows, the ``gpus`` entries of the source facts and the PIDs per GPU, joined by index."""
    by_facts: dict[int, dict[str, Any]] = {}
    for entry in (facts or {}).get("gpus") or []:
        if isinstance(entry, dict):
            idx = entry.get("gpu", entry.get("index"))
            if isinstance(idx, int):
                by_facts[idx] = entry
    out: dict[int, GpuInput] = {}
    for row in rows:
        if row.get("mig_instance") is not None or not isinstance(row.get("gpu"), int):
            continue
        out[row["gpu"]] = GpuInput(row["gpu"], dict(row))
    for idx in by_facts:
        out.setdefault(idx, GpuInput(idx))
    for idx in processes or {}:
        out.setdefault(idx, GpuInput(idx))
    for idx, g in out.items():
        g.facts = by_facts.get(idx, {})
        g.pids = sorted(set((processes or {}).get(idx, [])))
    return [out[k] for k in sorted(out)]


class NodeSampler:
    """Reads the host side of the checks and turns counters into rates between samples."""

    def __init__(
        self,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        clock: Callable[[], float] = time.monotonic,
        kernel_log: KernelLog | Literal["auto"] | None = "auto",
        wall: Callable[[], float] = time.time,
        kernel_window_s: float = DEFAULT_WINDOW_S,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.cgroups = CgroupReader(proc_root, sys_root)
        self.clock = clock
        self.wall = wall
        #: The kernel log is the kernel's, not the /proc tree's: a container reads its host's.
        self.kernel_log: KernelLog | None = default_log() if kernel_log == "auto" else kernel_log
        self.kernel_window_s = kernel_window_s
        self._t: float | None = None
        self._host: HostSnapshot | None = None
        self._jobs: dict[str, CgroupStats] = {}
        self._nfs: dict[str, NfsMount] = {}
        self._memory: MemorySample | None = None
        self._trees: dict[int, TreeSample] = {}

    def sample(
        self, gpus: list[GpuInput], gpu_error: str | None = None, gpu_source: str | None = None
    ) -> NodeView:
        now = self.clock()
        interval = now - self._t if self._t is not None else None
        self._t = now
        view = NodeView(gpu_error=gpu_error, gpu_source=gpu_source, interval_s=interval)
        view.numa = numa_nodes(self.sys_root)
        view.governors = cpu_governors(self.sys_root)
        view.cpu_count = online_cpu_count(self.sys_root)
        self._host_cpu(view)
        for g in gpus:
            view.gpus.append(self._gpu(g))
        self._processes(view)
        self._job_cgroups(view)
        self._mounts(view)
        self._loaders(view)
        self._memory_pressure(view)
        view.kernel = kernel_view(self.kernel_log, view.uptime_s, self.wall, self.kernel_window_s)
        return view

    # -- parts ---------------------------------------------------------------------------

    def _host_cpu(self, view: NodeView) -> None:
        try:
            snap = read_snapshot(self.proc_root, self.sys_root, rapl=False, fabric=True)
        except SourceError as e:
            log.debug("diagnose: %s", e)
            return
        view.uptime_s = snap.uptime_s
        if view.cpu_count is None:
            view.cpu_count = len(snap.cpus)
        prev = self._host
        if prev is not None:
            view.cpu = cpu_percentages(prev.cpus, snap.cpus)
        # Rates over the host's own clock (/proc/uptime), as the host row takes them.
        interval = snap.uptime_s - prev.uptime_s if prev is not None else None
        view.nics = nic_views(prev, snap, interval)
        view.ib_ports = ib_port_views(prev.ib if prev is not None else None, snap.ib or {}, interval)
        self._host = snap

    def _memory_pressure(self, view: NodeView) -> None:
        curr = read_memory(self.proc_root)
        view.memory = memory_view(self._memory, curr, view.interval_s)
        self._memory = curr

    def _loaders(self, view: NodeView) -> None:
        trees: dict[int, TreeSample] = {}
        with procfs(self.proc_root):
            for g in view.gpus:
                for pid in g.pids:
                    try:
                        tree = sample_tree(pid)
                    except psutil.Error as e:
                        why = (
                            "gone"
                            if isinstance(e, psutil.NoSuchProcess)
                            else "access denied"
                            if isinstance(e, psutil.AccessDenied)
                            else type(e).__name__
                        )
                        view.loaders.append(LoaderView(g.index, pid, "?", 0, error=why))
                        continue
                    trees[pid] = tree
                    view.loaders.append(loader_view(g.index, self._trees.get(pid), tree, view.interval_s))
        self._trees = trees

    def _gpu(self, g: GpuInput) -> GpuView:
        f = g.facts
        bus = f.get("pci_bus_id") if isinstance(f.get("pci_bus_id"), str) else None
        pci = pci_device(self.sys_root, bus) if bus else None
        numa = f.get("numa_node") if isinstance(f.get("numa_node"), int) else None
        local: list[int] | None = None
        aff = f.get("cpu_affinity")
        if isinstance(aff, str) and aff:
            try:
                local = parse_cpu_list(aff)
            except ValueError:
                local = None
        if pci is not None:
            numa = numa if numa is not None else pci.numa_node
            local = local or pci.local_cpus
        return GpuView(
            g.index,
            f.get("name") if isinstance(f.get("name"), str) else None,
            g.row.get("uuid") or f.get("uuid"),
            bus,
            numa,
            local,
            g.row,
            pci,
            list(g.pids),
        )

    def _processes(self, view: NodeView) -> None:
        for g in view.gpus:
            for pid in g.pids:
                if pid in view.procs:
                    continue
                view.procs[pid] = ProcView(
                    pid,
                    cpus_allowed(self.proc_root, pid),
                    last_cpu(self.proc_root, pid),
                    self.cgroups.locate(pid),
                )

    def _job_cgroups(self, view: NodeView) -> None:
        groups: dict[str, tuple[CgroupPlace, set[int], set[int]]] = {}
        for g in view.gpus:
            for pid in g.pids:
                p = view.procs.get(pid)
                if p is None or p.cgroup is None:
                    continue
                place, gpus, pids = groups.setdefault(p.cgroup.key, (p.cgroup, set(), set()))
                gpus.add(g.index)
                pids.add(pid)
        seen: dict[str, CgroupStats] = {}
        for _key, (place, gpus, pids) in sorted(groups.items()):
            view.jobs.append(self._job(place, sorted(gpus), sorted(pids), view.interval_s, seen))
        own = self.cgroups.locate("self")
        if own is not None and own.key not in groups:
            view.own = self._job(own, [], [], view.interval_s, seen)
        self._jobs = seen

    def _job(
        self,
        place: CgroupPlace,
        gpus: list[int],
        pids: list[int],
        interval: float | None,
        seen: dict[str, CgroupStats],
    ) -> JobView:
        stats = self.cgroups.read(place)
        seen[place.key] = stats
        return JobView(place, stats.quota, gpus, pids, rates(self._jobs.get(place.key), stats, interval))

    def _mounts(self, view: NodeView) -> None:
        mounts: dict[str, NfsMount] = {}
        # The mount namespaces of the processes on the GPUs (a job's container sees its own NFS
        # mounts), then this process's own.
        whose: list[int | str] = [*sorted(view.procs), "self"]
        for pid in whose:
            for m in read_mountstats(self.proc_root, pid):
                mounts.setdefault(m.key, m)
        view.nfs = [nfs_rates(self._nfs.get(k), m, view.interval_s) for k, m in sorted(mounts.items())]
        self._nfs = mounts
