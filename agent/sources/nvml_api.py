"""The NVML calls the agent makes, behind one small interface, with NVML's errors translated once.

:class:`NvmlApi` lists exactly the NVML entry points the ``nvml`` source uses,
each stating its unit, so the source never touches ``pynvml`` and tests and
benchmarks swap in :class:`gpufleet.sim.nvml_fake.FakeNvml`.  :class:`PynvmlApi`
is the real implementation over ``pynvml`` (package ``nvidia-ml-py``), imported
lazily so nodes without a driver can still import the agent.

Errors are translated here and nowhere else:

* ``NVML_ERROR_NOT_SUPPORTED`` -> :class:`NotSupported`: the GPU does not offer
  that reading; the source stores NULL for the field.
* ``NVML_ERROR_NO_PERMISSION`` -> :class:`NotPermitted` (a ``NotSupported``):
  this agent may not read it on this node; also NULL, never 0.
* ``NVML_ERROR_GPU_IS_LOST`` -> :class:`GpuLost`: the GPU fell off the bus;
  the source reports that GPU as lost and keeps the others going.
* anything else -> :class:`NvmlError`, a :class:`SourceError`, raised ``from``
  the NVML exception.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar

from gpufleet.agent.sources.base import SourceError, SourceUnavailable

T = TypeVar("T")

#: An NVML device handle (parent GPU or MIG device); opaque to callers.
Handle = Any
#: An NVML event set; opaque to callers.
EventSet = Any

#: XID the kernel driver logs when a GPU has fallen off the bus; the source
#: reports it for a GPU NVML calls lost.
XID_FALLEN_OFF_BUS = 79


class NvmlError(SourceError):
    """An NVML call failed; the message names the call and NVML's reason."""


class NotSupported(NvmlError):
    """The device does not offer this reading (the field is NULL, not 0)."""


class NotPermitted(NotSupported):
    """The agent lacks the privilege to read this on this node (NULL as well)."""


class GpuLost(NvmlError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


class NvmlUnavailable(NvmlError, SourceUnavailable):
    """NVML's library or kernel driver is missing: the source cannot run here."""


class Clock(enum.IntEnum):
    """NVML clock domains (``nvmlClockType_t``)."""

    GRAPHICS = 0
    SM = 1
    MEM = 2


@dataclass(frozen=True)
class MemoryInfo:
    """Framebuffer memory, bytes; ``used`` excludes the driver's reserved share."""

    total_bytes: int
    used_bytes: int
    reserved_bytes: int = 0


@dataclass(frozen=True)
class RemappedRows:
    """``nvmlDeviceGetRemappedRows``: rows remapped after correctable / uncorrectable
    errors (counts), a remap waiting for a GPU reset, a remap that failed."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class NvLinkErrors:
    """Data-link error counters of one NVLink link since the driver loaded (counts)."""

    crc_flit: int
    replay: int
    recovery: int


@dataclass(frozen=True)
class XidEvent:
    """One critical XID event: the device it came from and the XID code."""

    device_key: int
    xid: int
    #: GPU instance the error was attributed to on MIG, else None.
    gpu_instance_id: int | None = None


class NvmlApi(Protocol):
    """The NVML surface the ``nvml`` source uses.  Every method may raise the
    errors above; none returns a placeholder for an unreadable value."""

    def init(self) -> None:
        """Load and initialise NVML; SourceUnavailable when there is no driver."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str:
        """Kernel driver version, e.g. ``"590.48.01"``."""

    def cuda_driver_version(self) -> int:
        """CUDA version the driver supports, as ``1000*major + 10*minor`` (13010 = 13.1)."""

    def device_count(self) -> int: ...

    def device_handle(self, index: int) -> Handle: ...

    def device_key(self, handle: Handle) -> int:
        """A stable integer identifying the device, to match XID events to GPUs."""

    def name(self, handle: Handle) -> str: ...

    def uuid(self, handle: Handle) -> str: ...

    def pci_bus_id(self, handle: Handle) -> str:
        """NVML's bus id, ``"00000000:83:00.0"`` (8-digit domain)."""

    def utilization_pct(self, handle: Handle) -> int:
        """GPU-Util over the driver's last sample period, 0-100 (%)."""

    def memory_info(self, handle: Handle) -> MemoryInfo:
        """Framebuffer total/used/reserved, bytes."""

    def power_usage_mw(self, handle: Handle) -> int:
        """Board power draw, mW."""

    def total_energy_mj(self, handle: Handle) -> int:
        """Energy since the driver was loaded, mJ (cumulative)."""

    def enforced_power_limit_mw(self, handle: Handle) -> int:
        """Power limit the driver enforces now, mW."""

    def power_management_limit_mw(self, handle: Handle) -> int:
        """Power limit set on the board (``nvidia-smi -pl``), mW; the enforced one may be lower."""

    def power_limit_constraints_mw(self, handle: Handle) -> tuple[int, int]:
        """Lowest and highest power limit the board accepts, mW."""

    def set_power_management_limit_mw(self, handle: Handle, limit_mw: int) -> None:
        """Set the board's power limit, mW (root only; NotPermitted otherwise). Lasts until changed or the
        driver reloads."""

    def clock_mhz(self, handle: Handle, clock: Clock) -> int:
        """Current clock, MHz."""

    def max_clock_mhz(self, handle: Handle, clock: Clock) -> int:
        """Maximum clock, MHz."""

    def gpu_temperature_c(self, handle: Handle) -> int:
        """GPU die temperature, °C."""

    def memory_temperature_c(self, handle: Handle) -> int:
        """HBM/GDDR temperature (field NVML_FI_DEV_MEMORY_TEMP), °C."""

    def clocks_event_reasons(self, handle: Handle) -> int:
        """Active clocks-event (throttle) reasons bitmask (``nvmlClocksEventReasons``)."""

    def pcie_link_gen(self, handle: Handle) -> int: ...

    def pcie_link_gen_max(self, handle: Handle) -> int:
        """Highest generation this GPU and its slot can train to."""

    def pcie_link_width(self, handle: Handle) -> int:
        """Current lanes."""

    def pcie_link_width_max(self, handle: Handle) -> int:
        """Maximum lanes."""

    def pcie_throughput_kb_s(self, handle: Handle, direction: Literal["tx", "rx"]) -> int:
        """PCIe throughput over the driver's last ~20 ms window, KB/s (1 KB = 1024 bytes)."""

    def ecc_dbe_volatile_total(self, handle: Handle) -> int:
        """Uncorrected (double-bit) ECC errors since the driver loaded, count."""

    def ecc_error_total(self, handle: Handle, uncorrected: bool, aggregate: bool) -> int:
        """ECC errors, count: corrected (single-bit) or uncorrected (double-bit), since
        the driver loaded (volatile) or over the board's life (aggregate)."""

    def remapped_rows(self, handle: Handle) -> RemappedRows:
        """Row-remapper state (Ampere and later)."""

    def pcie_replay_count(self, handle: Handle) -> int:
        """PCIe replays (link-level retransmissions) since the driver loaded, count."""

    def nvlink_states(self, handle: Handle) -> list[bool]:
        """One entry per NVLink link the GPU has: True while the link is active.
        NotSupported on a GPU without NVLink."""

    def nvlink_errors(self, handle: Handle, link: int) -> NvLinkErrors:
        """CRC (FLIT), replay and recovery counters of one link, counts."""

    def nvlink_throughput_kib(self, handle: Handle) -> tuple[int, int]:
        """NVLink data transmitted and received over all links since the driver loaded,
        KiB (cumulative counters: rates come from differences)."""

    def mig_enabled(self, handle: Handle) -> bool:
        """True when MIG mode is currently on (NotSupported on GPUs without MIG)."""

    def mig_devices(self, handle: Handle) -> list[Handle]:
        """Handles of the MIG devices on a MIG-enabled GPU, in NVML's order."""

    def gpu_instance_id(self, mig_handle: Handle) -> int:
        """GPU instance id of a MIG device."""

    def create_event_set(self) -> EventSet: ...

    def register_xid_events(self, handle: Handle, event_set: EventSet) -> None:
        """Subscribe the set to critical XID events of this device."""

    def wait_xid(self, event_set: EventSet, timeout_ms: int) -> XidEvent | None:
        """The next queued XID event, or None when none arrives within the timeout."""

    def free_event_set(self, event_set: EventSet) -> None: ...

    def cpu_affinity(self, handle: Handle) -> list[int]:
        """CPUs close to the GPU (NVML's ideal affinity), CPU numbers."""

    def numa_node(self, handle: Handle) -> int:
        """NUMA node of the GPU's PCIe attachment."""


# --------------------------------------------------------------------------- the real binding


class PynvmlApi:
    """:class:`NvmlApi` over ``pynvml``; every call goes through :meth:`_call`."""

    def __init__(self) -> None:
        self._nv: ModuleType | None = None

    @property
    def nv(self) -> ModuleType:
        if self._nv is None:
            try:
                self._nv = importlib.import_module("pynvml")
            except ImportError as e:
                raise SourceUnavailable("nvml: pynvml (nvidia-ml-py) is not installed") from e
        return self._nv

    def _translate(self, what: str, e: Exception) -> NvmlError:
        code = getattr(e, "value", None)
        nv = self.nv
        if code == nv.NVML_ERROR_NOT_SUPPORTED:
            return NotSupported(f"nvml: {what}: not supported")
        if code == nv.NVML_ERROR_NO_PERMISSION:
            return NotPermitted(f"nvml: {what}: no permission")
        if code == nv.NVML_ERROR_GPU_IS_LOST:
            return GpuLost(f"nvml: {what}: GPU is lost")
        if code in (nv.NVML_ERROR_LIBRARY_NOT_FOUND, nv.NVML_ERROR_DRIVER_NOT_LOADED):
            return NvmlUnavailable(f"nvml: {what}: {e}")
        return NvmlError(f"nvml: {what}: {e}")

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            raise self._translate(what, e) from e

    @staticmethod
    def _text(value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else value

    def init(self) -> None:
        self._call("nvmlInit", self.nv.nvmlInit)

    def shutdown(self) -> None:
        self._call("nvmlShutdown", self.nv.nvmlShutdown)

    def driver_version(self) -> str:
        return self._text(self._call("nvmlSystemGetDriverVersion", self.nv.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion", self.nv.nvmlSystemGetCudaDriverVersion))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self.nv.nvmlDeviceGetCount))

    def device_handle(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", self.nv.nvmlDeviceGetHandleByIndex, index)

    def device_key(self, handle: Handle) -> int:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0

    def name(self, handle: Handle) -> str:
        return self._text(self._call("nvmlDeviceGetName", self.nv.nvmlDeviceGetName, handle))

    def uuid(self, handle: Handle) -> str:
        return self._text(self._call("nvmlDeviceGetUUID", self.nv.nvmlDeviceGetUUID, handle))

    def pci_bus_id(self, handle: Handle) -> str:
        info = self._call("nvmlDeviceGetPciInfo", self.nv.nvmlDeviceGetPciInfo, handle)
        return self._text(info.busId)

    def utilization_pct(self, handle: Handle) -> int:
        return int(
            self._call("nvmlDeviceGetUtilizationRates", self.nv.nvmlDeviceGetUtilizationRates, handle).gpu
        )

    def memory_info(self, handle: Handle) -> MemoryInfo:
        nv = self.nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(handle, version=version)
                return MemoryInfo(int(m.total), int(m.used), int(m.reserved))
            except nv.NVMLError as e:
                # Drivers before r510 lack the v2 struct; fall back to v1,
                # whose "used" includes the reserved share.
                if getattr(e, "value", None) not in (
                    nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                    nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    raise self._translate("nvmlDeviceGetMemoryInfo_v2", e) from e
        m = self._call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, handle)
        return MemoryInfo(int(m.total), int(m.used), 0)

    def power_usage_mw(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", self.nv.nvmlDeviceGetPowerUsage, handle))

    def total_energy_mj(self, handle: Handle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetTotalEnergyConsumption", self.nv.nvmlDeviceGetTotalEnergyConsumption, handle
            )
        )

    def enforced_power_limit_mw(self, handle: Handle) -> int:
        return int(
            self._call("nvmlDeviceGetEnforcedPowerLimit", self.nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        )

    def power_management_limit_mw(self, handle: Handle) -> int:
        return int(
            self._call("nvmlDeviceGetPowerManagementLimit", self.nv.nvmlDeviceGetPowerManagementLimit, handle)
        )

    def power_limit_constraints_mw(self, handle: Handle) -> tuple[int, int]:
        lo, hi = self._call(
            "nvmlDeviceGetPowerManagementLimitConstraints",
            self.nv.nvmlDeviceGetPowerManagementLimitConstraints,
            handle,
        )
        return int(lo), int(hi)

    def set_power_management_limit_mw(self, handle: Handle, limit_mw: int) -> None:
        self._call(
            "nvmlDeviceSetPowerManagementLimit",
            self.nv.nvmlDeviceSetPowerManagementLimit,
            handle,
            int(limit_mw),
        )

    def clock_mhz(self, handle: Handle, clock: Clock) -> int:
        return int(self._call("nvmlDeviceGetClockInfo", self.nv.nvmlDeviceGetClockInfo, handle, int(clock)))

    def max_clock_mhz(self, handle: Handle, clock: Clock) -> int:
        return int(
            self._call("nvmlDeviceGetMaxClockInfo", self.nv.nvmlDeviceGetMaxClockInfo, handle, int(clock))
        )

    def gpu_temperature_c(self, handle: Handle) -> int:
        nv = self.nv
        return int(
            self._call(
                "nvmlDeviceGetTemperature", nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU
            )
        )

    def memory_temperature_c(self, handle: Handle) -> int:
        nv = self.nv
        values = self._call(
            "nvmlDeviceGetFieldValues", nv.nvmlDeviceGetFieldValues, handle, [nv.NVML_FI_DEV_MEMORY_TEMP]
        )
        fv = values[0]
        if fv.nvmlReturn != nv.NVML_SUCCESS:
            raise self._translate("nvmlDeviceGetFieldValues(MEMORY_TEMP)", nv.NVMLError(fv.nvmlReturn))
        return int(_field_value(nv, fv))

    def clocks_event_reasons(self, handle: Handle) -> int:
        nv = self.nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            try:
                return int(fn(handle))
            except nv.NVMLError as e:
                # The new name only exists in r535+ drivers; older ones answer
                # FUNCTION_NOT_FOUND and still serve the throttle-reasons call.
                if getattr(e, "value", None) != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise self._translate("nvmlDeviceGetCurrentClocksEventReasons", e) from e
        return int(
            self._call(
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                nv.nvmlDeviceGetCurrentClocksThrottleReasons,
                handle,
            )
        )

    def pcie_link_gen(self, handle: Handle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetCurrPcieLinkGeneration", self.nv.nvmlDeviceGetCurrPcieLinkGeneration, handle
            )
        )

    def pcie_link_gen_max(self, handle: Handle) -> int:
        return int(
            self._call(
                "nvmlDeviceGetMaxPcieLinkGeneration", self.nv.nvmlDeviceGetMaxPcieLinkGeneration, handle
            )
        )

    def pcie_link_width(self, handle: Handle) -> int:
        return int(
            self._call("nvmlDeviceGetCurrPcieLinkWidth", self.nv.nvmlDeviceGetCurrPcieLinkWidth, handle)
        )

    def pcie_link_width_max(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetMaxPcieLinkWidth", self.nv.nvmlDeviceGetMaxPcieLinkWidth, handle))

    def pcie_throughput_kb_s(self, handle: Handle, direction: Literal["tx", "rx"]) -> int:
        nv = self.nv
        counter = nv.NVML_PCIE_UTIL_TX_BYTES if direction == "tx" else nv.NVML_PCIE_UTIL_RX_BYTES
        return int(self._call("nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput, handle, counter))

    def ecc_dbe_volatile_total(self, handle: Handle) -> int:
        return self.ecc_error_total(handle, uncorrected=True, aggregate=False)

    def ecc_error_total(self, handle: Handle, uncorrected: bool, aggregate: bool) -> int:
        nv = self.nv
        kind = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        counter = nv.NVML_AGGREGATE_ECC if aggregate else nv.NVML_VOLATILE_ECC
        return int(
            self._call("nvmlDeviceGetTotalEccErrors", nv.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
        )

    def remapped_rows(self, handle: Handle) -> RemappedRows:
        cor, unc, pending, failed = self._call(
            "nvmlDeviceGetRemappedRows", self.nv.nvmlDeviceGetRemappedRows, handle
        )
        return RemappedRows(int(cor), int(unc), bool(pending), bool(failed))

    def pcie_replay_count(self, handle: Handle) -> int:
        return int(
            self._call("nvmlDeviceGetPcieReplayCounter", self.nv.nvmlDeviceGetPcieReplayCounter, handle)
        )

    def nvlink_states(self, handle: Handle) -> list[bool]:
        nv = self.nv
        states: list[bool] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                states.append(nv.nvmlDeviceGetNvLinkState(handle, link) == nv.NVML_FEATURE_ENABLED)
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                # Past the GPU's last link NVML answers INVALID_ARGUMENT (or NOT_SUPPORTED).
                if states and code in (nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NOT_SUPPORTED):
                    break
                raise self._translate(f"nvmlDeviceGetNvLinkState(link {link})", e) from e
        return states

    def nvlink_errors(self, handle: Handle, link: int) -> NvLinkErrors:
        nv = self.nv
        fn = nv.nvmlDeviceGetNvLinkErrorCounter

        def read(counter: int) -> int:
            return int(self._call(f"nvmlDeviceGetNvLinkErrorCounter(link {link})", fn, handle, link, counter))

        return NvLinkErrors(
            read(nv.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            read(nv.NVML_NVLINK_ERROR_DL_REPLAY),
            read(nv.NVML_NVLINK_ERROR_DL_RECOVERY),
        )

    def nvlink_throughput_kib(self, handle: Handle) -> tuple[int, int]:
        nv = self.nv
        all_links = 0xFFFFFFFF  # scopeId UINT_MAX: summed over every link
        values = self._call(
            "nvmlDeviceGetFieldValues",
            nv.nvmlDeviceGetFieldValues,
            handle,
            [
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all_links),
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all_links),
            ],
        )
        out = []
        for fv, what in zip(values, ("TX", "RX"), strict=True):
            if fv.nvmlReturn != nv.NVML_SUCCESS:
                raise self._translate(
                    f"nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA_{what})", nv.NVMLError(fv.nvmlReturn)
                )
            out.append(int(_field_value(nv, fv)))
        return out[0], out[1]

    def mig_enabled(self, handle: Handle) -> bool:
        nv = self.nv
        current, _pending = self._call("nvmlDeviceGetMigMode", nv.nvmlDeviceGetMigMode, handle)
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def mig_devices(self, handle: Handle) -> list[Handle]:
        nv = self.nv
        count = int(self._call("nvmlDeviceGetMaxMigDeviceCount", nv.nvmlDeviceGetMaxMigDeviceCount, handle))
        devices = []
        for i in range(count):
            try:
                devices.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except nv.NVMLError as e:
                # Unused MIG slots answer NOT_FOUND.
                if getattr(e, "value", None) != nv.NVML_ERROR_NOT_FOUND:
                    raise self._translate("nvmlDeviceGetMigDeviceHandleByIndex", e) from e
        return devices

    def gpu_instance_id(self, mig_handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceId", self.nv.nvmlDeviceGetGpuInstanceId, mig_handle))

    def create_event_set(self) -> EventSet:
        return self._call("nvmlEventSetCreate", self.nv.nvmlEventSetCreate)

    def register_xid_events(self, handle: Handle, event_set: EventSet) -> None:
        nv = self.nv
        self._call(
            "nvmlDeviceRegisterEvents",
            nv.nvmlDeviceRegisterEvents,
            handle,
            nv.nvmlEventTypeXidCriticalError,
            event_set,
        )

    def wait_xid(self, event_set: EventSet, timeout_ms: int) -> XidEvent | None:
        nv = self.nv
        try:
            data = nv.nvmlEventSetWait(event_set, timeout_ms)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return None
            raise self._translate("nvmlEventSetWait", e) from e
        gi = int(data.gpuInstanceId)
        return XidEvent(self.device_key(data.device), int(data.eventData), None if gi == 0xFFFFFFFF else gi)

    def free_event_set(self, event_set: EventSet) -> None:
        self._call("nvmlEventSetFree", self.nv.nvmlEventSetFree, event_set)

    def cpu_affinity(self, handle: Handle) -> list[int]:
        words = max(1, ((os.cpu_count() or 64) + 63) // 64)
        masks = self._call("nvmlDeviceGetCpuAffinity", self.nv.nvmlDeviceGetCpuAffinity, handle, words)
        return [w * 64 + bit for w, mask in enumerate(masks) for bit in range(64) if int(mask) >> bit & 1]

    def numa_node(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetNumaNodeId", self.nv.nvmlDeviceGetNumaNodeId, handle))


def _field_value(nv: ModuleType, fv: Any) -> float | int:
    """The number in an ``nvmlFieldValue_t`` union, by its value type."""
    kind = fv.valueType
    v = fv.value
    if kind == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.uiVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.ulVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return int(v.ullVal)
    if kind == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.sllVal)
    if kind == nv.NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.siVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return int(v.usVal)
    raise NvmlError(f"nvml: field value of unknown type {kind}")
