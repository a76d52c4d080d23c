"""A faithful fake of :class:`gpufleet.agent.sources.nvml_api.NvmlApi` for tests and benchmarks.

Each :class:`GpuProfile` is transcribed from a real ``nvidia-smi -q`` capture
(``realdata/nvidia_gpu_exporter/captures``, named in ``capture``): model name,
framebuffer total and reserved MiB, enforced power limit, maximum clocks, PCIe
maximum link, CPU affinity, idle and loaded readings, and which readings the
GPU does not offer (an L40S has no memory temperature sensor; a MIG-enabled
H100 reports no GPU utilisation).  ``tests/agent/test_nvml_fake.py`` re-reads
the captures and fails if a profile drifts from them.

Beyond the captures the fake models what the source must survive: settable
per-GPU state, an energy counter that integrates power over the fake's clock,
XID events, NotSupported fields, a GPU falling off the bus, MIG instances, and
a per-call latency so a benchmark can charge realistic NVML costs (real calls
take roughly 20-100 µs each).
"""

from __future__ import annotations

import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.agent.sources.nvml_api import (
    XID_FALLEN_OFF_BUS,
    Clock,
    GpuLost,
    MemoryInfo,
    NotPermitted,
    NotSupported,
    NvLinkErrors,
    NvmlError,
    RemappedRows,
    XidEvent,
)
from gpufleet.catalog import THROTTLE_GPU_IDLE

MIB = 1024 * 1024


@dataclass(frozen=True)
class MigSlice:
    """One MIG GPU instance as ``nvidia-smi -q`` lists it."""

    gpu_instance_id: int
    profile: str
    mem_total_mib: int
    mem_used_mib: int = 0


@dataclass(frozen=True)
class GpuProfile:
    """Static facts and captured readings of one GPU model (units in the names)."""

    name: str
    #: Capture file (without ``.txt``) the values were read from.
    capture: str
    driver_version: str
    #: ``1000*major + 10*minor``, as nvmlSystemGetCudaDriverVersion returns it.
    cuda_driver_version: int
    mem_total_mib: int
    mem_reserved_mib: int
    power_limit_w: float
    sm_clock_max_mhz: int
    mem_clock_max_mhz: int
    pcie_gen_max: int
    pcie_width_max: int
    pci_bus_id: str
    cpu_affinity: str
    numa_node: int
    idle_power_w: float
    idle_sm_clock_mhz: int
    idle_temp_c: int
    #: None where the GPU has no memory temperature sensor (NotSupported).
    idle_mem_temp_c: int | None
    idle_pcie_tx_kb_s: int
    idle_pcie_rx_kb_s: int
    load_util_pct: int
    load_power_w: float
    load_temp_c: int
    load_mem_temp_c: int | None
    load_mem_used_mib: int
    mig_capable: bool = True
    #: Non-empty: MIG mode is on with these GPU instances.
    mig: tuple[MigSlice, ...] = ()
    #: "Replays Since Reset" of the PCIe section.
    pcie_replays: int = 0
    #: NVLink links of the board (datasheet: 18 on H100/H200 SXM; 0: none, NVML answers NotSupported).
    nvlink_links: int = 0


H100_SXM = GpuProfile(
    name="NVIDIA H100 80GB HBM3",
    capture="linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01",
    driver_version="590.48.01",
    cuda_driver_version=13010,
    mem_total_mib=81559,
    mem_reserved_mib=479,
    power_limit_w=700.0,
    sm_clock_max_mhz=1980,
    mem_clock_max_mhz=2619,
    pcie_gen_max=5,
    pcie_width_max=16,
    pci_bus_id="00000000:00:09.0",
    cpu_affinity="0-19",
    numa_node=0,
    idle_power_w=69.62,
    idle_sm_clock_mhz=345,
    idle_temp_c=41,
    idle_mem_temp_c=48,
    idle_pcie_tx_kb_s=352,
    idle_pcie_rx_kb_s=329,
    load_util_pct=100,
    load_power_w=588.39,
    load_temp_c=59,
    load_mem_temp_c=55,
    load_mem_used_mib=19818,
    pcie_replays=9,
    nvlink_links=18,
)

H100_MIG = replace(
    H100_SXM,
    capture="linux-x86_64__nvidia-h100-mig__590.48.01",
    idle_power_w=72.63,
    idle_temp_c=42,
    idle_mem_temp_c=48,
    idle_pcie_tx_kb_s=359,
    idle_pcie_rx_kb_s=329,
    load_power_w=444.72,
    load_temp_c=53,
    load_mem_temp_c=58,
    load_mem_used_mib=11125,
    mig=(
        MigSlice(2, "3g.40gb", 40448, 26),
        MigSlice(3, "2g.20gb", 20096, 17),
        MigSlice(9, "1g.10gb", 9984, 9),
        MigSlice(10, "1g.10gb", 9984, 9),
    ),
)

H200 = GpuProfile(
    name="NVIDIA H200",
    capture="linux-x86_64__nvidia-h200__590.48.01",
    driver_version="590.48.01",
    cuda_driver_version=13010,
    mem_total_mib=143771,
    mem_reserved_mib=614,
    power_limit_w=700.0,
    sm_clock_max_mhz=1980,
    mem_clock_max_mhz=3201,
    pcie_gen_max=5,
    pcie_width_max=16,
    pci_bus_id="00000000:83:00.0",
    cpu_affinity="0-23",
    numa_node=0,
    idle_power_w=77.88,
    idle_sm_clock_mhz=345,
    idle_temp_c=28,
    idle_mem_temp_c=32,
    idle_pcie_tx_kb_s=371,
    idle_pcie_rx_kb_s=337,
    load_util_pct=100,
    load_power_w=625.24,
    load_temp_c=52,
    load_mem_temp_c=41,
    load_mem_used_mib=32362,
    pcie_replays=0,
    nvlink_links=18,
)

L40S = GpuProfile(
    name="NVIDIA L40S",
    capture="linux-x86_64__nvidia-l40s__595.80",
    driver_version="595.80",
    cuda_driver_version=13020,
    mem_total_mib=46068,
    mem_reserved_mib=609,
    power_limit_w=350.0,
    sm_clock_max_mhz=2520,
    mem_clock_max_mhz=9001,
    pcie_gen_max=4,
    pcie_width_max=16,
    pci_bus_id="00000000:01:00.0",
    cpu_affinity="0-7",
    numa_node=0,
    idle_power_w=119.88,
    idle_sm_clock_mhz=2520,
    idle_temp_c=64,
    idle_mem_temp_c=None,
    idle_pcie_tx_kb_s=585,
    idle_pcie_rx_kb_s=244,
    load_util_pct=9,
    load_power_w=110.01,
    load_temp_c=54,
    load_mem_temp_c=None,
    load_mem_used_mib=1235,
    mig_capable=False,
)

PROFILES: dict[str, GpuProfile] = {"h100": H100_SXM, "h100-mig": H100_MIG, "h200": H200, "l40s": L40S}


@dataclass(frozen=True)
class FakeHandle:
    """A device handle: a physical GPU, or one of its MIG devices when ``gpu_instance_id`` is set."""

    index: int
    gpu_instance_id: int | None = None


@dataclass
class FakeEventSet:
    devices: set[int] = field(default_factory=set)
    queue: deque[XidEvent] = field(default_factory=deque)


class FakeMigDevice:
    """Settable state of one MIG device."""

    def __init__(self, parent: FakeGpu, piece: MigSlice) -> None:
        self.parent = parent
        self.gpu_instance_id = piece.gpu_instance_id
        self.profile = piece.profile
        self.mem_total_mib = piece.mem_total_mib
        self.mem_used_mib = piece.mem_used_mib
        self.uuid = f"MIG-{parent.index:08x}-{piece.gpu_instance_id:04x}-4000-8000-{parent.index:012x}"


class FakeGpu:
    """Settable state of one GPU; power changes are integrated into the energy counter."""

    def __init__(
        self, index: int, profile: GpuProfile, clock: Callable[[], float], energy_mj: float = 0.0
    ) -> None:
        self.index = index
        self.profile = profile
        self.uuid = f"GPU-{index:08x}-0000-4000-8000-{zlib.crc32(profile.name.encode()):012x}"
        self._clock = clock
        self._t = clock()
        self._energy_mj = energy_mj
        self._power_w = profile.idle_power_w
        self.util_pct = 0
        self.mem_used_mib = 0.0
        self.power_limit_w = profile.power_limit_w
        #: Lowest limit the board accepts (NVML's constraints; about 30 % of the default on data-center boards).
        self.power_limit_min_w = round(0.3 * profile.power_limit_w)
        self.sm_clock_mhz = profile.idle_sm_clock_mhz
        self.mem_clock_mhz = profile.mem_clock_max_mhz
        self.temp_c = profile.idle_temp_c
        self.mem_temp_c = profile.idle_mem_temp_c
        self.throttle_reasons = THROTTLE_GPU_IDLE
        self.pcie_gen = profile.pcie_gen_max
        self.pcie_width = profile.pcie_width_max
        self.pcie_tx_kb_s = profile.idle_pcie_tx_kb_s
        self.pcie_rx_kb_s = profile.idle_pcie_rx_kb_s
        self.ecc_dbe = 0
        self.ecc_sbe = 0
        self.ecc_sbe_agg = 0
        self.ecc_dbe_agg = 0
        self.remapped_correctable = 0
        self.remapped_uncorrectable = 0
        self.remap_pending = False
        self.remap_failed = False
        self.pcie_replays = profile.pcie_replays
        #: Per link: active?  Error counters per link: [crc_flit, replay, recovery].
        self.nvlink_up = [True] * profile.nvlink_links
        self.nvlink_counters = [[0, 0, 0] for _ in range(profile.nvlink_links)]
        #: NVLink data rates, bytes/s, integrated into the KiB counters over the fake clock.
        self._nvlink_rate = (0.0, 0.0)
        self._nvlink_kib = [0.0, 0.0]
        self.lost = False
        #: NvmlApi method names that answer NotSupported on this GPU.
        self.unsupported: set[str] = set()
        if profile.idle_mem_temp_c is None:
            self.unsupported.add("memory_temperature_c")
        self.mig = [FakeMigDevice(self, s) for s in profile.mig]

    @property
    def power_w(self) -> float:
        return self._power_w

    @power_w.setter
    def power_w(self, watts: float) -> None:
        self._integrate()
        self._power_w = watts

    @property
    def energy_mj(self) -> int:
        """Cumulative energy, mJ: the integral of power over the fake clock."""
        self._integrate()
        return int(self._energy_mj)

    @property
    def nvlink_bytes_s(self) -> tuple[float, float]:
        return self._nvlink_rate

    @nvlink_bytes_s.setter
    def nvlink_bytes_s(self, tx_rx: tuple[float, float]) -> None:
        """Set the NVLink (transmit, receive) rates, bytes/s, from now on."""
        self._integrate()
        self._nvlink_rate = (float(tx_rx[0]), float(tx_rx[1]))

    @property
    def nvlink_kib(self) -> tuple[int, int]:
        """Cumulative NVLink data transmitted and received, KiB."""
        self._integrate()
        return int(self._nvlink_kib[0]), int(self._nvlink_kib[1])

    def reset_energy(self) -> None:
        """What a driver reload does to the counter."""
        self._integrate()
        self._energy_mj = 0.0

    def _integrate(self) -> None:
        now = self._clock()
        dt = max(0.0, now - self._t)
        self._energy_mj += self._power_w * dt * 1000.0
        if dt and hasattr(self, "_nvlink_kib"):
            self._nvlink_kib[0] += self._nvlink_rate[0] * dt / 1024.0
            self._nvlink_kib[1] += self._nvlink_rate[1] * dt / 1024.0
        self._t = now

    def set(self, **state: float | int | None) -> FakeGpu:
        """Set several readings at once (``gpu.set(util_pct=97, power_w=650)``)."""
        for key, value in state.items():
            if not hasattr(self, key) or key.startswith("_"):
                raise AttributeError(f"FakeGpu has no reading {key!r}")
            setattr(self, key, value)
        return self

    def idle(self) -> FakeGpu:
        p = self.profile
        return self.set(
            util_pct=0,
            power_w=p.idle_power_w,
            sm_clock_mhz=p.idle_sm_clock_mhz,
            temp_c=p.idle_temp_c,
            mem_temp_c=p.idle_mem_temp_c,
            throttle_reasons=THROTTLE_GPU_IDLE,
            mem_used_mib=0,
        )

    def load(self) -> FakeGpu:
        """The captured under-load readings."""
        p = self.profile
        return self.set(
            util_pct=p.load_util_pct,
            power_w=p.load_power_w,
            sm_clock_mhz=p.sm_clock_max_mhz,
            temp_c=p.load_temp_c,
            mem_temp_c=p.load_mem_temp_c,
            throttle_reasons=0,
            mem_used_mib=p.load_mem_used_mib,
        )


class FakeNvml:
    """In-memory NVML with the :class:`NvmlApi` surface.

    ``call_latency_s`` is charged on every call by spinning on
    ``time.perf_counter`` (``time.sleep`` cannot wait tens of microseconds);
    ``calls`` counts calls per method so tests and benchmarks can see what a
    collect costs.
    """

    def __init__(
        self,
        profiles: Sequence[GpuProfile] | Iterable[GpuProfile],
        *,
        call_latency_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        energy_mj: float = 0.0,
    ) -> None:
        profiles = list(profiles)
        if not profiles:
            raise ValueError("FakeNvml needs at least one GPU profile")
        self.gpus = [FakeGpu(i, p, clock, energy_mj) for i, p in enumerate(profiles)]
        self.driver = profiles[0].driver_version
        self.cuda = profiles[0].cuda_driver_version
        self.call_latency_s = call_latency_s
        self.calls: Counter[str] = Counter()
        self.initialized = False
        #: Whether the caller may set power limits (root, as the driver requires).
        self.may_set_power_limit = True
        self._event_sets: list[FakeEventSet] = []

    # -- test controls -----------------------------------------------------------------

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: the driver logs XID 79 and NVML answers GPU_IS_LOST."""
        self.gpus[index].lost = True
        self.inject_xid(index, XID_FALLEN_OFF_BUS)

    def inject_xid(self, index: int, xid: int, gpu_instance_id: int | None = None) -> None:
        """Queue a critical XID event on every event set registered for the GPU."""
        for es in self._event_sets:
            if index in es.devices:
                es.queue.append(XidEvent(index, xid, gpu_instance_id))

    # -- plumbing ----------------------------------------------------------------------

    def _enter(self, what: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls[what] += 1
        if self.call_latency_s > 0:
            end = time.perf_counter() + self.call_latency_s
            while time.perf_counter() < end:
                pass
        if not self.initialized and what != "init":
            raise NvmlError(f"nvml: {what}: Uninitialized")
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise GpuLost(f"nvml: {what}: GPU is lost")
        if what in gpu.unsupported:
            raise NotSupported(f"nvml: {what}: not supported")
        return gpu

    def _whole(self, what: str, handle: FakeHandle) -> FakeGpu:
        """A whole-board reading: MIG device handles do not offer it."""
        gpu = self._enter(what, handle)
        assert gpu is not None
        if handle.gpu_instance_id is not None:
            raise NotSupported(f"nvml: {what}: not supported on a MIG device")
        return gpu

    def _mig(self, gpu: FakeGpu, gpu_instance_id: int) -> FakeMigDevice:
        for m in gpu.mig:
            if m.gpu_instance_id == gpu_instance_id:
                return m
        raise NvmlError(f"nvml: no GPU instance {gpu_instance_id} on GPU {gpu.index}")

    # -- NvmlApi -----------------------------------------------------------------------

    def init(self) -> None:
        self._enter("init")
        self.initialized = True

    def shutdown(self) -> None:
        self._enter("shutdown")
        self.initialized = False

    def driver_version(self) -> str:
        self._enter("driver_version")
        return self.driver

    def cuda_driver_version(self) -> int:
        self._enter("cuda_driver_version")
        return self.cuda

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self.gpus)

    def device_handle(self, index: int) -> FakeHandle:
        self._enter("device_handle", FakeHandle(index))
        return FakeHandle(index)

    def device_key(self, handle: FakeHandle) -> int:
        return handle.index

    def name(self, handle: FakeHandle) -> str:
        gpu = self._enter("name", handle)
        assert gpu is not None
        return gpu.profile.name

    def uuid(self, handle: FakeHandle) -> str:
        gpu = self._enter("uuid", handle)
        assert gpu is not None
        if handle.gpu_instance_id is not None:
            return self._mig(gpu, handle.gpu_instance_id).uuid
        return gpu.uuid

    def pci_bus_id(self, handle: FakeHandle) -> str:
        return self._whole("pci_bus_id", handle).profile.pci_bus_id

    def utilization_pct(self, handle: FakeHandle) -> int:
        gpu = self._whole("utilization_pct", handle)
        if gpu.mig:
            raise NotSupported("nvml: utilization_pct: not supported while MIG is enabled")
        return int(gpu.util_pct)

    def memory_info(self, handle: FakeHandle) -> MemoryInfo:
        gpu = self._enter("memory_info", handle)
        assert gpu is not None
        if handle.gpu_instance_id is not None:
            m = self._mig(gpu, handle.gpu_instance_id)
            return MemoryInfo(m.mem_total_mib * MIB, int(m.mem_used_mib * MIB), 0)
        used = sum(m.mem_used_mib for m in gpu.mig) if gpu.mig else gpu.mem_used_mib
        return MemoryInfo(
            gpu.profile.mem_total_mib * MIB, int(used * MIB), gpu.profile.mem_reserved_mib * MIB
        )

    def power_usage_mw(self, handle: FakeHandle) -> int:
        return round(self._whole("power_usage_mw", handle).power_w * 1000)

    def total_energy_mj(self, handle: FakeHandle) -> int:
        return self._whole("total_energy_mj", handle).energy_mj

    def enforced_power_limit_mw(self, handle: FakeHandle) -> int:
        return round(self._whole("enforced_power_limit_mw", handle).power_limit_w * 1000)

    def power_management_limit_mw(self, handle: FakeHandle) -> int:
        return round(self._whole("power_management_limit_mw", handle).power_limit_w * 1000)

    def power_limit_constraints_mw(self, handle: FakeHandle) -> tuple[int, int]:
        gpu = self._whole("power_limit_constraints_mw", handle)
        return round(gpu.power_limit_min_w * 1000), round(gpu.profile.power_limit_w * 1000)

    def set_power_management_limit_mw(self, handle: FakeHandle, limit_mw: int) -> None:
        """As the driver does: only root may, only within the board's constraints."""
        gpu = self._whole("set_power_management_limit_mw", handle)
        if not self.may_set_power_limit:
            raise NotPermitted("nvml: nvmlDeviceSetPowerManagementLimit: no permission")
        if not gpu.power_limit_min_w * 1000 <= limit_mw <= gpu.profile.power_limit_w * 1000:
            raise NvmlError(f"nvml: nvmlDeviceSetPowerManagementLimit: Invalid Argument ({limit_mw} mW)")
        gpu.power_limit_w = limit_mw / 1000.0

    def clock_mhz(self, handle: FakeHandle, clock: Clock) -> int:
        gpu = self._whole("clock_mhz", handle)
        return int(gpu.mem_clock_mhz if clock == Clock.MEM else gpu.sm_clock_mhz)

    def max_clock_mhz(self, handle: FakeHandle, clock: Clock) -> int:
        gpu = self._whole("max_clock_mhz", handle)
        return gpu.profile.mem_clock_max_mhz if clock == Clock.MEM else gpu.profile.sm_clock_max_mhz

    def gpu_temperature_c(self, handle: FakeHandle) -> int:
        return int(self._whole("gpu_temperature_c", handle).temp_c)

    def memory_temperature_c(self, handle: FakeHandle) -> int:
        gpu = self._whole("memory_temperature_c", handle)
        if gpu.mem_temp_c is None:
            raise NotSupported("nvml: memory_temperature_c: not supported")
        return int(gpu.mem_temp_c)

    def clocks_event_reasons(self, handle: FakeHandle) -> int:
        return int(self._whole("clocks_event_reasons", handle).throttle_reasons)

    def pcie_link_gen(self, handle: FakeHandle) -> int:
        return int(self._whole("pcie_link_gen", handle).pcie_gen)

    def pcie_link_gen_max(self, handle: FakeHandle) -> int:
        return self._whole("pcie_link_gen_max", handle).profile.pcie_gen_max

    def pcie_link_width(self, handle: FakeHandle) -> int:
        return int(self._whole("pcie_link_width", handle).pcie_width)

    def pcie_link_width_max(self, handle: FakeHandle) -> int:
        return self._whole("pcie_link_width_max", handle).profile.pcie_width_max

    def pcie_throughput_kb_s(self, handle: FakeHandle, direction: Literal["tx", "rx"]) -> int:
        gpu = self._whole("pcie_throughput_kb_s", handle)
        return int(gpu.pcie_tx_kb_s if direction == "tx" else gpu.pcie_rx_kb_s)

    def ecc_dbe_volatile_total(self, handle: FakeHandle) -> int:
        return int(self._whole("ecc_dbe_volatile_total", handle).ecc_dbe)

    def ecc_error_total(self, handle: FakeHandle, uncorrected: bool, aggregate: bool) -> int:
        gpu = self._whole("ecc_error_total", handle)
        if uncorrected:
            return int(gpu.ecc_dbe_agg if aggregate else gpu.ecc_dbe)
        return int(gpu.ecc_sbe_agg if aggregate else gpu.ecc_sbe)

    def remapped_rows(self, handle: FakeHandle) -> RemappedRows:
        gpu = self._whole("remapped_rows", handle)
        if gpu.mig:
            raise NotSupported("nvml: remapped_rows: not reported while MIG is enabled")
        return RemappedRows(
            gpu.remapped_correctable, gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failed
        )

    def pcie_replay_count(self, handle: FakeHandle) -> int:
        return int(self._whole("pcie_replay_count", handle).pcie_replays)

    def _nvlink(self, what: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._whole(what, handle)
        if not gpu.profile.nvlink_links:
            raise NotSupported(f"nvml: {what}: GPU has no NVLink")
        return gpu

    def nvlink_states(self, handle: FakeHandle) -> list[bool]:
        gpu = self._nvlink("nvlink_states", handle)
        # ``calls`` counts driver calls: the real binding asks once per link (nvmlDeviceGetNvLinkState).
        self.calls["nvlink_states"] += len(gpu.nvlink_up) - 1
        return list(gpu.nvlink_up)

    def nvlink_errors(self, handle: FakeHandle, link: int) -> NvLinkErrors:
        gpu = self._nvlink("nvlink_errors", handle)
        if not 0 <= link < len(gpu.nvlink_counters):
            raise NvmlError(f"nvml: nvlink_errors: no link {link}")
        self.calls["nvlink_errors"] += 2  # one nvmlDeviceGetNvLinkErrorCounter call per counter
        crc, replay, recovery = gpu.nvlink_counters[link]
        return NvLinkErrors(crc, replay, recovery)

    def nvlink_throughput_kib(self, handle: FakeHandle) -> tuple[int, int]:
        return self._nvlink("nvlink_throughput_kib", handle).nvlink_kib

    def mig_enabled(self, handle: FakeHandle) -> bool:
        gpu = self._whole("mig_enabled", handle)
        if not gpu.profile.mig_capable:
            raise NotSupported("nvml: mig_enabled: GPU has no MIG")
        return bool(gpu.mig)

    def mig_devices(self, handle: FakeHandle) -> list[FakeHandle]:
        gpu = self._whole("mig_devices", handle)
        return [FakeHandle(gpu.index, m.gpu_instance_id) for m in gpu.mig]

    def gpu_instance_id(self, mig_handle: FakeHandle) -> int:
        self._enter("gpu_instance_id", mig_handle)
        if mig_handle.gpu_instance_id is None:
            raise NvmlError("nvml: gpu_instance_id: not a MIG device handle")
        return mig_handle.gpu_instance_id

    def create_event_set(self) -> FakeEventSet:
        self._enter("create_event_set")
        es = FakeEventSet()
        self._event_sets.append(es)
        return es

    def register_xid_events(self, handle: FakeHandle, event_set: FakeEventSet) -> None:
        self._whole("register_xid_events", handle)
        event_set.devices.add(handle.index)

    def wait_xid(self, event_set: FakeEventSet, timeout_ms: int) -> XidEvent | None:
        self._enter("wait_xid")
        return event_set.queue.popleft() if event_set.queue else None

    def free_event_set(self, event_set: FakeEventSet) -> None:
        self._enter("free_event_set")
        if event_set in self._event_sets:
            self._event_sets.remove(event_set)

    def cpu_affinity(self, handle: FakeHandle) -> list[int]:
        gpu = self._whole("cpu_affinity", handle)
        cpus: list[int] = []
        for part in gpu.profile.cpu_affinity.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        return cpus

    def numa_node(self, handle: FakeHandle) -> int:
        return self._whole("numa_node", handle).profile.numa_node


def fake_nvml_source(gpus: int, call_latency_s: float = 0.0, loaded: bool = True) -> NvmlSource:
    """The real ``nvml`` source over :class:`FakeNvml` H100s (tests, benchmarks, demos without GPUs)."""
    fake = FakeNvml([H100_SXM] * gpus, call_latency_s=call_latency_s)
    if loaded:
        for g in fake.gpus:
            g.load()
    return NvmlSource(api=fake)
