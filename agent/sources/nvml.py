"""The ``nvml`` source: every ``gpu.csv`` field NVML offers, one row per GPU (and per MIG instance).

It talks only to :class:`gpufleet.agent.sources.nvml_api.NvmlApi`, so the same code runs
on the driver (:class:`PynvmlApi`) and on the faithful fake in tests and
benchmarks.  Units are converted here, once: mW -> W, bytes -> MiB,
KB/s -> bytes/s.

Rules the rows follow:

* A reading the GPU does not offer is ``None`` (NULL), never 0; the source
  remembers it and stops asking, which also keeps a collect cheap.
* Profiling ratios (``sm_active``, ``tensor_active``, ``dram_active``) need
  DCGM; NVML rows leave those keys out.  NVLink rates come from NVML's
  cumulative throughput counters (field values, all links): the difference
  since the previous collect over the time between them, NULL on the first
  collect and after a counter restart; GPUs without NVLink leave the keys out.
* Memory, bus and NVLink health (ECC counts, remapped rows, PCIe replays,
  NVLink link states and error counters) changes rarely and costs about one
  NVML call per link and counter, so it is read on every ``health_every``-th
  collect only (every 10 s at 1 Hz); rows in between leave those keys out
  (NULL, a gap, never a repeated value).
* MIG: the physical GPU's row (``mig_instance`` NULL) carries every
  whole-board quantity (power, energy, clocks, temperatures, throttle, PCIe,
  ECC, XID) exactly once; each GPU instance gets its own row with
  ``mig_instance`` = GPU-instance id, its own memory, and those whole-board
  fields NULL, so energy is never counted once per instance.
* ``xid`` is the last critical XID delivered to NVML's event set since the
  previous collect, 0 when none arrived, NULL where the GPU cannot deliver
  XID events.
* A GPU that falls off the bus (``GPU_IS_LOST``) is reported as lost: its row
  keeps ``gpu`` and ``uuid``, carries ``xid`` = 79 (the driver's "fallen off
  the bus" XID) and NULL readings; the other GPUs are read as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.agent.sources.base import GpuRow, Reading
from gpufleet.agent.sources.facts import parse_cpu_list
from gpufleet.agent.sources.nvml_api import (
    XID_FALLEN_OFF_BUS,
    Clock,
    GpuLost,
    Handle,
    NotSupported,
    NvmlApi,
    PynvmlApi,
)
from gpufleet.catalog import WHOLE_GPU_FIELDS

log = logging.getLogger(__name__)
T = TypeVar("T")

MIB = 1024 * 1024
#: NVML's PCIe throughput unit: KB/s with 1 KB = 1024 bytes.
PCIE_KB = 1024
#: Most XID events drained per collect; a storm beyond this waits for the next one.
MAX_EVENTS_PER_COLLECT = 1000

#: Catalog fields NVML provides (the others need DCGM).
NVML_FIELDS = (
    "uuid",
    "util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "energy_mj",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "temp_c",
    "mem_temp_c",
    "throttle_reasons",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "ecc_dbe_vol",
    "xid",
    "mig_instance",
    "ecc_sbe_vol",
    "ecc_sbe_agg",
    "ecc_dbe_agg",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "pcie_replay_count",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_links_up",
    "nvlink_links_max",
    "nvlink_tx_bytes_s",
    "nvlink_rx_bytes_s",
)
#: Health fields read every ``health_every``-th collect.
HEALTH_FIELDS = NVML_FIELDS[NVML_FIELDS.index("ecc_sbe_vol") : NVML_FIELDS.index("nvlink_tx_bytes_s")]


@dataclass
class _Gpu:
    """What the source keeps per physical GPU between collects."""

    index: int
    handle: Handle | None
    key: int | None = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    #: Static maxima, read once.
    static: dict[str, Any] = field(default_factory=dict)
    #: Readings this GPU answered NotSupported for.
    unsupported: set[str] = field(default_factory=set)
    xid_capable: bool = False
    lost: bool = False
    #: (monotonic time, tx KiB, rx KiB) of the previous NVLink throughput reading.
    nvlink_prev: tuple[float, int, int] | None = None


class NvmlSource:
    """The ``nvml`` telemetry source (see the module docstring for the row rules)."""

    name = "nvml"

    def __init__(
        self,
        api: NvmlApi | None = None,
        sys_root: Path | str = "/sys",
        health_every: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if health_every < 1:
            raise ValueError("health_every must be at least 1 (read the health counters every n-th collect)")
        self.api: NvmlApi = api if api is not None else PynvmlApi()
        self.sys_root = Path(sys_root)
        self.health_every = health_every
        self.clock = clock
        self._gpus: list[_Gpu] | None = None
        self._event_set: Any = None
        self._collects = 0

    # -- lifecycle -----------------------------------------------------------------------

    def _start(self) -> list[_Gpu]:
        if self._gpus is not None:
            return self._gpus
        api = self.api
        api.init()
        gpus = []
        for index in range(api.device_count()):
            try:
                gpus.append(self._open(index))
            except GpuLost:
                log.warning("nvml: GPU %d is lost at start", index)
                gpus.append(_Gpu(index, None, lost=True))
        try:
            self._event_set = api.create_event_set()
        except NotSupported:
            self._event_set = None
        if self._event_set is not None:
            for gpu in gpus:
                if gpu.handle is None:
                    continue
                try:
                    api.register_xid_events(gpu.handle, self._event_set)
                    gpu.xid_capable = True
                except NotSupported:
                    log.info("nvml: GPU %d cannot deliver XID events; xid stays NULL", gpu.index)
                except GpuLost:
                    gpu.lost = True
        self._gpus = gpus
        return gpus

    def _open(self, index: int) -> _Gpu:
        api = self.api
        handle = api.device_handle(index)
        gpu = _Gpu(index, handle, key=api.device_key(handle))
        gpu.uuid = api.uuid(handle)
        gpu.name = api.name(handle)
        gpu.pci_bus_id = self._optional(gpu, "pci_bus_id", api.pci_bus_id, handle)
        gpu.static = {
            "sm_clock_max_mhz": self._optional(gpu, "max_sm_clock", api.max_clock_mhz, handle, Clock.SM),
            "pcie_gen_max": self._optional(gpu, "pcie_gen_max", api.pcie_link_gen_max, handle),
            "pcie_width_max": self._optional(gpu, "pcie_width_max", api.pcie_link_width_max, handle),
        }
        return gpu

    def close(self) -> None:
        """Free the event set and shut NVML down; a later collect starts again."""
        if self._gpus is None:
            return
        try:
            if self._event_set is not None:
                self.api.free_event_set(self._event_set)
        finally:
            self._event_set = None
            self._gpus = None
            self.api.shutdown()

    # -- collect -------------------------------------------------------------------------

    def collect(self) -> Reading:
        gpus = self._start()
        xids = self._drain_xids(gpus)
        health = self._collects % self.health_every == 0
        self._collects += 1
        rows: list[GpuRow] = []
        for gpu in gpus:
            try:
                rows.extend(self._read(gpu, xids, health))
                gpu.lost = False
            except GpuLost:
                if not gpu.lost:
                    log.error("nvml: GPU %d (%s) fell off the bus", gpu.index, gpu.uuid)
                gpu.lost = True
                rows.append(self._lost_row(gpu))
        return Reading(gpus=rows)

    def _drain_xids(self, gpus: list[_Gpu]) -> dict[int, int]:
        """Last XID per GPU index among the events queued since the previous collect."""
        if self._event_set is None:
            return {}
        by_key = {g.key: g.index for g in gpus if g.key is not None}
        last: dict[int, int] = {}
        for _ in range(MAX_EVENTS_PER_COLLECT):
            event = self.api.wait_xid(self._event_set, 0)
            if event is None:
                break
            index = by_key.get(event.device_key)
            if index is not None:
                last[index] = event.xid
        return last

    def _optional(self, gpu: _Gpu, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None when the GPU does not offer it (remembered, not asked again)."""
        if what in gpu.unsupported:
            return None
        try:
            return fn(*args)
        except NotSupported as e:
            log.info("nvml: GPU %d: %s; %s stays NULL", gpu.index, e, what)
            gpu.unsupported.add(what)
            return None

    def _read(self, gpu: _Gpu, xids: dict[int, int], health: bool = False) -> list[GpuRow]:
        if gpu.handle is None:
            # Lost before we could open it: try again, it may be back after a reset.
            reopened = self._open(gpu.index)
            gpu.handle, gpu.key, gpu.uuid, gpu.name = (
                reopened.handle,
                reopened.key,
                reopened.uuid,
                reopened.name,
            )
            gpu.pci_bus_id, gpu.static = reopened.pci_bus_id, reopened.static
        api, h = self.api, gpu.handle
        opt = self._optional
        mig = opt(gpu, "mig_enabled", api.mig_enabled, h) or False
        mem = opt(gpu, "memory_info", api.memory_info, h)
        power_mw = opt(gpu, "power", api.power_usage_mw, h)
        limit_mw = opt(gpu, "power_limit", api.enforced_power_limit_mw, h)
        if limit_mw is None:
            # Boards (and vGPU guests) without the enforced limit still report the one set on them.
            limit_mw = opt(gpu, "power_mgmt_limit", api.power_management_limit_mw, h)
        tx = opt(gpu, "pcie_tx", api.pcie_throughput_kb_s, h, "tx")
        rx = opt(gpu, "pcie_rx", api.pcie_throughput_kb_s, h, "rx")
        row: GpuRow = {
            "gpu": gpu.index,
            "mig_instance": None,
            "uuid": gpu.uuid,
            # NVML has no GPU-Util for a MIG-enabled GPU; DCGM profiling fields cover it.
            "util_pct": None if mig else opt(gpu, "util", api.utilization_pct, h),
            "mem_used_mib": mem.used_bytes / MIB if mem else None,
            "mem_total_mib": mem.total_bytes / MIB if mem else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "energy_mj": opt(gpu, "energy", api.total_energy_mj, h),
            "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
            "sm_clock_mhz": opt(gpu, "sm_clock", api.clock_mhz, h, Clock.SM),
            "sm_clock_max_mhz": gpu.static.get("sm_clock_max_mhz"),
            "mem_clock_mhz": opt(gpu, "mem_clock", api.clock_mhz, h, Clock.MEM),
            "temp_c": opt(gpu, "temp", api.gpu_temperature_c, h),
            "mem_temp_c": opt(gpu, "mem_temp", api.memory_temperature_c, h),
            "throttle_reasons": opt(gpu, "throttle", api.clocks_event_reasons, h),
            "pcie_tx_bytes_s": tx * PCIE_KB if tx is not None else None,
            "pcie_rx_bytes_s": rx * PCIE_KB if rx is not None else None,
            "pcie_gen": opt(gpu, "pcie_gen", api.pcie_link_gen, h),
            "pcie_gen_max": gpu.static.get("pcie_gen_max"),
            "pcie_width": opt(gpu, "pcie_width", api.pcie_link_width, h),
            "pcie_width_max": gpu.static.get("pcie_width_max"),
            "ecc_dbe_vol": opt(gpu, "ecc_dbe", api.ecc_dbe_volatile_total, h),
            "xid": xids.get(gpu.index, 0) if gpu.xid_capable else None,
        }
        self._nvlink_rates(gpu, row)
        if health:
            self._health(gpu, row)
        rows = [row]
        if mig:
            rows.extend(self._mig_rows(gpu))
        return rows

    def _nvlink_rates(self, gpu: _Gpu, row: GpuRow) -> None:
        """NVLink bytes/s from the cumulative KiB counters (keys left out without NVLink)."""
        kib = self._optional(gpu, "nvlink_throughput", self.api.nvlink_throughput_kib, gpu.handle)
        if kib is None:
            return
        now = self.clock()
        prev, gpu.nvlink_prev = gpu.nvlink_prev, (now, kib[0], kib[1])
        tx = rx = None
        if prev is not None and now > prev[0] and kib[0] >= prev[1] and kib[1] >= prev[2]:
            dt = now - prev[0]
            tx, rx = (kib[0] - prev[1]) * 1024.0 / dt, (kib[1] - prev[2]) * 1024.0 / dt
        row["nvlink_tx_bytes_s"], row["nvlink_rx_bytes_s"] = tx, rx

    def _health(self, gpu: _Gpu, row: GpuRow) -> None:
        """ECC counts, remapped rows, PCIe replays, NVLink link states and error counters."""
        api, h, opt = self.api, gpu.handle, self._optional
        row["ecc_sbe_vol"] = opt(gpu, "ecc_sbe_vol", api.ecc_error_total, h, False, False)
        row["ecc_sbe_agg"] = opt(gpu, "ecc_sbe_agg", api.ecc_error_total, h, False, True)
        row["ecc_dbe_agg"] = opt(gpu, "ecc_dbe_agg", api.ecc_error_total, h, True, True)
        rr = opt(gpu, "remapped_rows", api.remapped_rows, h)
        row["remapped_rows_correctable"] = rr.correctable if rr else None
        row["remapped_rows_uncorrectable"] = rr.uncorrectable if rr else None
        row["remapped_rows_pending"] = int(rr.pending) if rr else None
        row["remapped_rows_failed"] = int(rr.failed) if rr else None
        row["pcie_replay_count"] = opt(gpu, "pcie_replay", api.pcie_replay_count, h)
        states = opt(gpu, "nvlink_states", api.nvlink_states, h)
        if states is None:
            return
        row["nvlink_links_max"], row["nvlink_links_up"] = len(states), sum(states)
        totals = [0, 0, 0]
        read = 0
        for link in range(len(states)):
            try:
                e = api.nvlink_errors(h, link)
            except NotSupported:
                continue  # this link keeps no counters (inactive on some drivers)
            totals[0] += e.crc_flit
            totals[1] += e.replay
            totals[2] += e.recovery
            read += 1
        if read:
            row["nvlink_crc_errors"], row["nvlink_replay_errors"], row["nvlink_recovery_errors"] = totals

    def _mig_rows(self, gpu: _Gpu) -> list[GpuRow]:
        api = self.api
        rows: list[GpuRow] = []
        seen: set[int] = set()
        for mh in api.mig_devices(gpu.handle):
            gi = api.gpu_instance_id(mh)
            # Several compute instances share one GPU instance (and its memory):
            # one row per GPU instance keeps (gpu, mig_instance) unique.
            if gi in seen:
                continue
            seen.add(gi)
            mem = self._optional(gpu, f"mig{gi}_memory_info", api.memory_info, mh)
            row: GpuRow = {f: None for f in WHOLE_GPU_FIELDS}
            row.update(
                {
                    "gpu": gpu.index,
                    "mig_instance": gi,
                    "uuid": api.uuid(mh),
                    "util_pct": None,
                    "mem_used_mib": mem.used_bytes / MIB if mem else None,
                    "mem_total_mib": mem.total_bytes / MIB if mem else None,
                    "pcie_tx_bytes_s": None,
                    "pcie_rx_bytes_s": None,
                }
            )
            rows.append(row)
        return rows

    def _lost_row(self, gpu: _Gpu) -> GpuRow:
        row: GpuRow = {f: None for f in NVML_FIELDS}
        row.update({"gpu": gpu.index, "uuid": gpu.uuid, "mig_instance": None, "xid": XID_FALLEN_OFF_BUS})
        return row

    # -- processes (for run attribution) -------------------------------------------------

    def processes(self) -> dict[int, list[int]]:
        """PIDs running compute work on each GPU (index -> PIDs), for the agent's run attribution.

        Uses the API's ``compute_processes(handle)`` when it has one, else
        ``nvmlDeviceGetComputeRunningProcesses``; GPUs that cannot list
        processes (or are lost) are left out.
        """
        out: dict[int, list[int]] = {}
        for gpu in self._start():
            if gpu.handle is None or gpu.lost:
                continue
            try:
                pids = self._optional(gpu, "processes", _compute_pids, self.api, gpu.handle)
            except GpuLost:
                continue
            if pids is not None:
                out[gpu.index] = pids
        return out

    # -- facts ---------------------------------------------------------------------------

    def facts(self) -> dict[str, Any]:
        """GPU models, UUIDs, driver and CUDA versions, PCIe maxima and NUMA/CPU affinity per GPU."""
        gpus = self._start()
        api = self.api
        cuda = api.cuda_driver_version()
        out: list[dict[str, Any]] = []
        for gpu in gpus:
            entry: dict[str, Any] = {
                "gpu": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "lost": gpu.lost,
                "pci_bus_id": gpu.pci_bus_id,
                **gpu.static,
            }
            if gpu.handle is not None and not gpu.lost:
                try:
                    entry.update(self._locality(gpu))
                    mig = self._optional(gpu, "mig_enabled", api.mig_enabled, gpu.handle) or False
                    entry["mig_enabled"] = mig
                    if mig:
                        entry["mig_instances"] = [
                            {"gpu_instance_id": api.gpu_instance_id(m), "uuid": api.uuid(m)}
                            for m in api.mig_devices(gpu.handle)
                        ]
                except GpuLost:
                    entry["lost"] = True
            out.append(entry)
        return {
            "driver_version": api.driver_version(),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpu_count": len(gpus),
            "gpus": out,
        }

    def _locality(self, gpu: _Gpu) -> dict[str, Any]:
        """NUMA node and nearby CPUs: from NVML, else from the PCI device's sysfs entry."""
        numa = self._optional(gpu, "numa_node", self.api.numa_node, gpu.handle)
        cpus = self._optional(gpu, "cpu_affinity", self.api.cpu_affinity, gpu.handle)
        sysfs = self._pci_sysfs(gpu.pci_bus_id)
        if (numa is None or numa < 0) and sysfs is not None:
            numa = _read_int(sysfs / "numa_node")
        if not cpus and sysfs is not None:
            try:
                cpus = parse_cpu_list((sysfs / "local_cpulist").read_text())
            except (OSError, ValueError):
                cpus = None
        return {
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "cpu_affinity": format_cpu_list(cpus) if cpus else None,
        }

    def _pci_sysfs(self, bus_id: str | None) -> Path | None:
        if not bus_id:
            return None
        path = self.sys_root / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id)
        return path if path.exists() else None


def _compute_pids(api: NvmlApi, handle: Handle) -> list[int]:
    lister = getattr(api, "compute_processes", None)
    if lister is not None:
        return sorted({int(p) for p in lister(handle)})
    if isinstance(api, PynvmlApi):
        procs = api._call(
            "nvmlDeviceGetComputeRunningProcesses", api.nv.nvmlDeviceGetComputeRunningProcesses, handle
        )
        return sorted({int(p.pid) for p in procs})
    raise NotSupported("nvml: this NVML binding cannot list processes")


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:83:00.0`` as sysfs names it: ``0000:83:00.0`` (4-digit domain, lower case)."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def format_cpu_list(cpus: list[int]) -> str:
    """CPU numbers as a kernel-style list, ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}-{b}" if b != a else f"{a}" for a, b in ranges)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
