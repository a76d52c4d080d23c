"""The metric catalog: every column a sample may carry, as data, in one place.

Agents, the ingest decoder, the database schema, trace bundles and the
dashboards all read this list, so a field is added once and every layer agrees
on its name, unit and storage type.  Names follow ``../shared/contracts.md``
section 1 and carry their unit (``power_w``, ``energy_mj``, ``*_bytes_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["real", "double", "smallint", "integer", "bigint", "text"]

#: Python-side value ranges per storage type, so the ingest decoder can refuse
#: a value the column cannot hold instead of letting COPY fail half-way.
INT_RANGES: dict[str, tuple[int, int]] = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class Field:
    name: str
    kind: Kind
    unit: str
    doc: str
    #: NVML / DCGM origin, for operators mapping their own exporters.
    source: str = ""
    #: Whole-board quantity: on MIG it is reported once per physical GPU,
    #: never once per instance (else energy is counted several times over).
    whole_gpu: bool = False
    #: Inclusive sanity bounds; values outside are refused at ingest.
    lo: float | None = None
    hi: float | None = None


GPU_FIELDS: tuple[Field, ...] = (
    Field("uuid", "text", "", "GPU UUID", "nvmlDeviceGetUUID"),
    Field("util_pct", "real", "%", "GPU-Util: share of time a kernel ran", "DCGM_FI_DEV_GPU_UTIL", lo=0, hi=100),
    Field("sm_active", "real", "ratio", "SM activity 0-1", "DCGM_FI_PROF_SM_ACTIVE", lo=0, hi=1),
    Field("tensor_active", "real", "ratio", "tensor pipe activity 0-1", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", lo=0, hi=1),
    Field("dram_active", "real", "ratio", "DRAM activity 0-1", "DCGM_FI_PROF_DRAM_ACTIVE", lo=0, hi=1),
    Field("mem_used_mib", "real", "MiB", "framebuffer used", "DCGM_FI_DEV_FB_USED", lo=0),
    Field("mem_total_mib", "real", "MiB", "framebuffer total", "DCGM_FI_DEV_FB_TOTAL", lo=0),
    Field("power_w", "real", "W", "board power draw", "DCGM_FI_DEV_POWER_USAGE", True, lo=0, hi=10000),
    Field("energy_mj", "bigint", "mJ", "cumulative energy counter; may reset",
          "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", True, lo=0),
    Field("power_limit_w", "real", "W", "enforced power limit", "nvmlDeviceGetEnforcedPowerLimit", True, lo=0, hi=10000),
    Field("sm_clock_mhz", "integer", "MHz", "SM clock", "DCGM_FI_DEV_SM_CLOCK", True, lo=0, hi=100000),
    Field("sm_clock_max_mhz", "integer", "MHz", "maximum SM clock", "nvmlDeviceGetMaxClockInfo", True, lo=0, hi=100000),
    Field("mem_clock_mhz", "integer", "MHz", "memory clock", "DCGM_FI_DEV_MEM_CLOCK", True, lo=0, hi=100000),
    Field("temp_c", "smallint", "degC", "GPU temperature", "DCGM_FI_DEV_GPU_TEMP", True, lo=-100, hi=300),
    Field("mem_temp_c", "smallint", "degC", "memory temperature", "DCGM_FI_DEV_MEMORY_TEMP", True, lo=-100, hi=300),
    Field("throttle_reasons", "bigint", "bitmask", "NVML clocks-event reasons",
          "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", True, lo=0),
    Field("pcie_tx_bytes_s", "real", "B/s", "PCIe transmit rate", "DCGM_FI_PROF_PCIE_TX_BYTES", lo=0),
    Field("pcie_rx_bytes_s", "real", "B/s", "PCIe receive rate", "DCGM_FI_PROF_PCIE_RX_BYTES", lo=0),
    Field("pcie_gen", "smallint", "", "current PCIe link generation", "nvmlDeviceGetCurrPcieLinkGeneration", True, lo=0, hi=64),
    Field("pcie_gen_max", "smallint", "", "maximum PCIe link generation", "nvmlDeviceGetMaxPcieLinkGeneration", True, lo=0, hi=64),
    Field("pcie_width", "smallint", "lanes", "current PCIe link width", "nvmlDeviceGetCurrPcieLinkWidth", True, lo=0, hi=64),
    Field("pcie_width_max", "smallint", "lanes", "maximum PCIe link width", "nvmlDeviceGetMaxPcieLinkWidth", True, lo=0, hi=64),
    Field("nvlink_tx_bytes_s", "real", "B/s", "NVLink transmit rate", "DCGM_FI_PROF_NVLINK_TX_BYTES", lo=0),
    Field("nvlink_rx_bytes_s", "real", "B/s", "NVLink receive rate", "DCGM_FI_PROF_NVLINK_RX_BYTES", lo=0),
    Field("ecc_dbe", "bigint", "count", "volatile double-bit ECC errors, cumulative", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", True, lo=0),
    Field("xid", "integer", "code", "last XID error in the interval, 0 if none", "DCGM_FI_DEV_XID_ERRORS", True, lo=0),
    # Project extensions (contracts.md allows new optional columns).
    Field("mig_instance", "smallint", "", "MIG GPU-instance id; NULL for a whole physical GPU", "nvmlDeviceGetGpuInstanceId",
          lo=0, hi=1000),
    Field("run_id", "text", "", "run the GPU worked for, from attribution", ""),
    # The job's own cgroup (the processes on this GPU): the cause of a
    # starvation is judged from what the job may use, not from the whole host.
    # The same figures appear on every GPU the cgroup feeds.
    Field("job_cpu_cores", "real", "cores", "CPU the job's cgroup used (cpu.stat usage_usec per second)",
          "cgroup cpu.stat / cpuacct.usage", lo=0, hi=100000),
    Field("job_cpu_quota_cores", "real", "cores", "CPU quota of the job's cgroup, tightest on its path; NULL unlimited",
          "cgroup cpu.max / cpu.cfs_quota_us", lo=0, hi=100000),
    Field("job_cpu_throttled_share", "real", "ratio", "share of CFS periods the job's cgroup was throttled",
          "cgroup cpu.stat nr_throttled / nr_periods", lo=0, hi=1),
    Field("job_cpu_pressure_pct", "real", "%", "share of time some task of the job waited for CPU",
          "cgroup cpu.pressure some", lo=0, hi=100),
    Field("job_io_pressure_pct", "real", "%", "share of time some task of the job waited for I/O",
          "cgroup io.pressure some", lo=0, hi=100),
)

HOST_FIELDS: tuple[Field, ...] = (
    Field("cpu_user_pct", "real", "%", "all-CPU user time, as mpstat %usr", lo=0, hi=100),
    Field("cpu_system_pct", "real", "%", "all-CPU system time, as mpstat %sys", lo=0, hi=100),
    Field("cpu_iowait_pct", "real", "%", "all-CPU iowait, as mpstat %iowait", lo=0, hi=100),
    Field("cpu_idle_pct", "real", "%", "all-CPU idle, as mpstat %idle", lo=0, hi=100),
    Field("cpu_count", "smallint", "", "logical CPUs", lo=0, hi=32767),
    Field("disk_read_bytes_s", "real", "B/s", "read rate summed over block devices", lo=0),
    Field("disk_write_bytes_s", "real", "B/s", "write rate summed over block devices", lo=0),
    Field("disk_util_pct", "real", "%", "busiest device, as iostat -x %util", lo=0, hi=100),
    Field("disk_await_ms", "real", "ms", "busiest device, as iostat -x await", lo=0),
    Field("net_rx_bytes_s", "real", "B/s", "receive rate over physical interfaces", lo=0),
    Field("net_tx_bytes_s", "real", "B/s", "transmit rate over physical interfaces", lo=0),
    Field("host_power_w", "real", "W", "whole-host power excluding GPUs (BMC/IPMI/RAPL)", lo=0, hi=100000),
)

#: Key columns of each sample table, in storage order, before the catalog fields.
GPU_KEY = ("time", "node", "gpu")
HOST_KEY = ("time", "node")

GPU_BY_NAME = {f.name: f for f in GPU_FIELDS}
HOST_BY_NAME = {f.name: f for f in HOST_FIELDS}

#: contracts.md section 1: the columns of a bundle's gpu.csv and host.csv, in
#: order (the catalog's, less the collector's own MIG and run attribution).
GPU_CSV_COLUMNS: tuple[str, ...] = (
    "time", "node", "gpu", *(f.name for f in GPU_FIELDS if f.name not in ("mig_instance", "run_id")))
HOST_CSV_COLUMNS: tuple[str, ...] = ("time", "node", *(f.name for f in HOST_FIELDS))

#: Columns that may be NULL on a MIG instance row because they belong to the
#: physical GPU row.
WHOLE_GPU_FIELDS = frozenset(f.name for f in GPU_FIELDS if f.whole_gpu)

#: NVML clocks-event (throttle) reason bits, from nvml.h.
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APP_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_DISPLAY_CLOCKS = 0x100


def gpu_columns() -> tuple[str, ...]:
    """All ``gpu_samples`` columns in storage order."""
    return GPU_KEY + tuple(f.name for f in GPU_FIELDS)


def host_columns() -> tuple[str, ...]:
    """All ``host_samples`` columns in storage order."""
    return HOST_KEY + tuple(f.name for f in HOST_FIELDS)


def validate_catalog() -> None:
    """Refuse a catalog with duplicate or reserved names (checked at start-up)."""
    for key, fields in ((GPU_KEY, GPU_FIELDS), (HOST_KEY, HOST_FIELDS)):
        names = [f.name for f in fields]
        dup = {n for n in names if names.count(n) > 1} | (set(names) & set(key))
        if dup:
            raise ValueError(f"metric catalog: duplicate or reserved field names {sorted(dup)}")
