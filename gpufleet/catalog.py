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
    #: A column of a trace bundle's gpu.csv (contracts.md section 1).  Project
    #: extensions beyond the contract are stored and ingested but not written
    #: to bundles, whose columns stay exactly the contract's.
    bundle: bool = True
    #: Mantissa bits a ``real`` value keeps when stored, after its leading
    #: one (None: all 23 of float4).  Compressed storage spends its bytes on the mantissa bits that
    #: change from one sample to the next; a sampled ratio or rate carries no
    #: information in its last bits, so they are rounded off before storing
    #: (to nearest, relative error at most 2**-(bits+1)).  See
    #: docs/capacity.md, "Storage".
    bits: int | None = None


#: Stored precision of the sampled ratios and rates (activity, bus and link
#: rates, the job's CPU and pressure): 2**-11 = 0.05 % of the value at most,
#: far below what the sampling itself varies by.
RATE_BITS = 10
#: Board power keeps more: at 700 W a step of 1/32 W (NVML reads in mW, but
#: its stated accuracy is a few watts), so energy integrated from power where
#: no counter is sent moves by less than 0.01 %.
POWER_BITS = 14

GPU_FIELDS: tuple[Field, ...] = (
    Field("uuid", "text", "", "GPU UUID", "nvmlDeviceGetUUID"),
    Field(
        "util_pct", "real", "%", "GPU-Util: share of time a kernel ran", "DCGM_FI_DEV_GPU_UTIL", lo=0, hi=100
    ),
    Field(
        "sm_active", "real", "ratio", "SM activity 0-1", "DCGM_FI_PROF_SM_ACTIVE", lo=0, hi=1, bits=RATE_BITS
    ),
    Field(
        "tensor_active",
        "real",
        "ratio",
        "tensor pipe activity 0-1",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        lo=0,
        hi=1,
        bits=RATE_BITS,
    ),
    Field(
        "dram_active",
        "real",
        "ratio",
        "DRAM activity 0-1",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        lo=0,
        hi=1,
        bits=RATE_BITS,
    ),
    Field("mem_used_mib", "real", "MiB", "framebuffer used", "DCGM_FI_DEV_FB_USED", lo=0),
    Field("mem_total_mib", "real", "MiB", "framebuffer total", "DCGM_FI_DEV_FB_TOTAL", lo=0),
    Field(
        "power_w",
        "real",
        "W",
        "board power draw",
        "DCGM_FI_DEV_POWER_USAGE",
        True,
        lo=0,
        hi=10000,
        bits=POWER_BITS,
    ),
    Field(
        "energy_mj",
        "bigint",
        "mJ",
        "cumulative energy counter; may reset",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        True,
        lo=0,
    ),
    Field(
        "power_limit_w",
        "real",
        "W",
        "enforced power limit",
        "nvmlDeviceGetEnforcedPowerLimit",
        True,
        lo=0,
        hi=10000,
    ),
    Field("sm_clock_mhz", "integer", "MHz", "SM clock", "DCGM_FI_DEV_SM_CLOCK", True, lo=0, hi=100000),
    Field(
        "sm_clock_max_mhz",
        "integer",
        "MHz",
        "maximum SM clock",
        "nvmlDeviceGetMaxClockInfo",
        True,
        lo=0,
        hi=100000,
    ),
    Field("mem_clock_mhz", "integer", "MHz", "memory clock", "DCGM_FI_DEV_MEM_CLOCK", True, lo=0, hi=100000),
    Field("temp_c", "smallint", "degC", "GPU temperature", "DCGM_FI_DEV_GPU_TEMP", True, lo=-100, hi=300),
    Field(
        "mem_temp_c",
        "smallint",
        "degC",
        "memory temperature",
        "DCGM_FI_DEV_MEMORY_TEMP",
        True,
        lo=-100,
        hi=300,
    ),
    Field(
        "throttle_reasons",
        "bigint",
        "bitmask",
        "NVML clocks-event reasons",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        True,
        lo=0,
    ),
    Field(
        "pcie_tx_bytes_s",
        "real",
        "B/s",
        "PCIe transmit rate",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        lo=0,
        bits=RATE_BITS,
    ),
    Field(
        "pcie_rx_bytes_s",
        "real",
        "B/s",
        "PCIe receive rate",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        lo=0,
        bits=RATE_BITS,
    ),
    Field(
        "pcie_gen",
        "smallint",
        "",
        "current PCIe link generation",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        True,
        lo=0,
        hi=64,
    ),
    Field(
        "pcie_gen_max",
        "smallint",
        "",
        "maximum PCIe link generation",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        True,
        lo=0,
        hi=64,
    ),
    Field(
        "pcie_width",
        "smallint",
        "lanes",
        "current PCIe link width",
        "nvmlDeviceGetCurrPcieLinkWidth",
        True,
        lo=0,
        hi=64,
    ),
    Field(
        "pcie_width_max",
        "smallint",
        "lanes",
        "maximum PCIe link width",
        "nvmlDeviceGetMaxPcieLinkWidth",
        True,
        lo=0,
        hi=64,
    ),
    Field(
        "nvlink_tx_bytes_s",
        "real",
        "B/s",
        "NVLink transmit rate",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        lo=0,
        bits=RATE_BITS,
    ),
    Field(
        "nvlink_rx_bytes_s",
        "real",
        "B/s",
        "NVLink receive rate",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        lo=0,
        bits=RATE_BITS,
    ),
    # Named ``ecc_dbe`` in contracts.md section 1; that name is still read everywhere
    # (:data:`GPU_ALIASES`) and written as the bundle column.
    Field(
        "ecc_dbe_vol",
        "bigint",
        "count",
        "volatile double-bit (uncorrected) ECC errors since the driver loaded",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "xid",
        "integer",
        "code",
        "last XID error in the interval, 0 if none",
        "DCGM_FI_DEV_XID_ERRORS",
        True,
        lo=0,
    ),
    # Project extensions (contracts.md allows new optional columns).
    Field(
        "mig_instance",
        "smallint",
        "",
        "MIG GPU-instance id; NULL for a whole physical GPU",
        "nvmlDeviceGetGpuInstanceId",
        lo=0,
        hi=1000,
    ),
    Field("run_id", "text", "", "run the GPU worked for, from attribution", ""),
    # From dcgm-exporter's field list (deploy/dcgm-exporter/counters.csv) and DCGM: stored and
    # ingested, outside trace bundles.
    Field(
        "gr_engine_active",
        "real",
        "ratio",
        "graphics/compute engine activity 0-1",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        lo=0,
        hi=1,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "mem_copy_util_pct",
        "real",
        "%",
        "memory copy utilisation (framebuffer interface busy)",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        True,
        lo=0,
        hi=100,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "nvlink_bandwidth_mb_s",
        "real",
        "MB/s",
        "NVLink throughput over all links, as DCGM reports it",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        True,
        lo=0,
        bundle=False,
        bits=RATE_BITS,
    ),
    # Memory, bus and NVLink health (contracts.md section 1, optional columns; stored
    # after the columns above, in the order they were added).  Counters
    # are cumulative; the volatile ones restart at a driver reload, the
    # aggregate ones persist in the InfoROM for the board's life.
    Field(
        "ecc_sbe_vol",
        "bigint",
        "count",
        "volatile single-bit (corrected) ECC errors since the driver loaded",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "ecc_sbe_agg",
        "bigint",
        "count",
        "single-bit (corrected) ECC errors over the board's life",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "ecc_dbe_agg",
        "bigint",
        "count",
        "double-bit (uncorrected) ECC errors over the board's life",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "remapped_rows_correctable",
        "bigint",
        "rows",
        "memory rows remapped after correctable errors",
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "remapped_rows_uncorrectable",
        "bigint",
        "rows",
        "memory rows remapped after uncorrectable errors",
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "remapped_rows_pending",
        "smallint",
        "flag",
        "1 when a row remap waits for a GPU reset to take effect",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        True,
        lo=0,
        hi=1,
    ),
    Field(
        "remapped_rows_failed",
        "smallint",
        "flag",
        "1 when a row remap failed (no spare row left)",
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
        True,
        lo=0,
        hi=1,
    ),
    Field(
        "pcie_replay_count",
        "bigint",
        "count",
        "PCIe link-level replays (retransmissions), cumulative",
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "nvlink_crc_errors",
        "bigint",
        "count",
        "NVLink flow-control (FLIT) CRC errors over all links, cumulative",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "nvlink_replay_errors",
        "bigint",
        "count",
        "NVLink data-link replays over all links, cumulative",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "nvlink_recovery_errors",
        "bigint",
        "count",
        "NVLink link recoveries over all links, cumulative",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
        True,
        lo=0,
    ),
    Field(
        "nvlink_links_up",
        "smallint",
        "links",
        "NVLink links active now",
        "nvmlDeviceGetNvLinkState",
        True,
        lo=0,
        hi=64,
    ),
    Field(
        "nvlink_links_max",
        "smallint",
        "links",
        "NVLink links the GPU has (active or not)",
        "nvmlDeviceGetNvLinkState",
        True,
        lo=0,
        hi=64,
    ),
    # The job's own cgroup (the processes on this GPU): the cause of a
    # starvation is judged from what the job may use, not from the whole host.
    # The same figures appear on every GPU the cgroup feeds.
    Field(
        "job_cpu_cores",
        "real",
        "cores",
        "CPU the job's cgroup used (cpu.stat usage_usec per second)",
        "cgroup cpu.stat / cpuacct.usage",
        lo=0,
        hi=100000,
        bits=RATE_BITS,
    ),
    Field(
        "job_cpu_quota_cores",
        "real",
        "cores",
        "CPU quota of the job's cgroup, tightest on its path; NULL unlimited",
        "cgroup cpu.max / cpu.cfs_quota_us",
        lo=0,
        hi=100000,
    ),
    Field(
        "job_cpu_throttled_share",
        "real",
        "ratio",
        "share of CFS periods the job's cgroup was throttled",
        "cgroup cpu.stat nr_throttled / nr_periods",
        lo=0,
        hi=1,
    ),
    Field(
        "job_cpu_pressure_pct",
        "real",
        "%",
        "share of time some task of the job waited for CPU",
        "cgroup cpu.pressure some",
        lo=0,
        hi=100,
        bits=RATE_BITS,
    ),
    Field(
        "job_io_pressure_pct",
        "real",
        "%",
        "share of time some task of the job waited for I/O",
        "cgroup io.pressure some",
        lo=0,
        hi=100,
        bits=RATE_BITS,
    ),
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
    # The fabric (project extensions, outside trace bundles): what a straggler or a slow
    # collective caused by the network shows.  Error, drop and link-down figures are
    # events counted in the interval since the node's previous host row.
    Field(
        "net_errors",
        "integer",
        "count",
        "receive and transmit errors on physical interfaces in the interval",
        "/proc/net/dev errs",
        lo=0,
        bundle=False,
    ),
    Field(
        "net_drops",
        "integer",
        "count",
        "packets dropped by physical interfaces in the interval",
        "/proc/net/dev drop",
        lo=0,
        bundle=False,
    ),
    Field(
        "net_link_bytes_s",
        "real",
        "B/s",
        "link speed summed over physical interfaces that are up",
        "/sys/class/net/*/speed",
        lo=0,
        bundle=False,
    ),
    Field(
        "net_util_pct",
        "real",
        "%",
        "busiest physical interface: larger direction against its link speed",
        "/proc/net/dev, /sys/class/net/*/speed",
        lo=0,
        hi=100,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_rx_bytes_s",
        "real",
        "B/s",
        "InfiniBand/RoCE data received over active ports",
        "/sys/class/infiniband/*/ports/*/counters/port_rcv_data",
        lo=0,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_tx_bytes_s",
        "real",
        "B/s",
        "InfiniBand/RoCE data transmitted over active ports",
        "/sys/class/infiniband/*/ports/*/counters/port_xmit_data",
        lo=0,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_rx_packets_s",
        "real",
        "packets/s",
        "InfiniBand/RoCE packets received over active ports",
        "port_rcv_packets",
        lo=0,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_tx_packets_s",
        "real",
        "packets/s",
        "InfiniBand/RoCE packets transmitted over active ports",
        "port_xmit_packets",
        lo=0,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_link_bytes_s",
        "real",
        "B/s",
        "link rate summed over active InfiniBand/RoCE ports",
        "/sys/class/infiniband/*/ports/*/rate",
        lo=0,
        bundle=False,
    ),
    Field(
        "ib_util_pct",
        "real",
        "%",
        "busiest InfiniBand/RoCE port: larger direction against its link rate",
        "port_rcv_data, port_xmit_data, rate",
        lo=0,
        hi=100,
        bundle=False,
        bits=RATE_BITS,
    ),
    Field(
        "ib_ports_down",
        "smallint",
        "ports",
        "InfiniBand/RoCE ports present but not ACTIVE",
        "/sys/class/infiniband/*/ports/*/state",
        lo=0,
        hi=32767,
        bundle=False,
    ),
    Field(
        "ib_symbol_errors",
        "integer",
        "count",
        "physical-layer symbol errors on InfiniBand/RoCE ports in the interval",
        "symbol_error",
        lo=0,
        bundle=False,
    ),
    Field(
        "ib_link_downed",
        "integer",
        "count",
        "InfiniBand/RoCE link-down events in the interval",
        "link_downed",
        lo=0,
        bundle=False,
    ),
    Field(
        "ib_link_error_recovery",
        "integer",
        "count",
        "InfiniBand/RoCE link error recoveries in the interval",
        "link_error_recovery",
        lo=0,
        bundle=False,
    ),
    Field(
        "ib_rx_errors",
        "integer",
        "count",
        "InfiniBand/RoCE packets received with errors in the interval",
        "port_rcv_errors",
        lo=0,
        bundle=False,
    ),
    Field(
        "ib_tx_discards",
        "integer",
        "count",
        "InfiniBand/RoCE packets discarded on transmit in the interval",
        "port_xmit_discards",
        lo=0,
        bundle=False,
    ),
)

#: Key columns of each sample table, in storage order, before the catalog fields.
GPU_KEY = ("time", "node", "gpu")
HOST_KEY = ("time", "node")

GPU_BY_NAME = {f.name: f for f in GPU_FIELDS}
HOST_BY_NAME = {f.name: f for f in HOST_FIELDS}

#: Older names of GPU catalog columns, still accepted wherever samples enter
#: (ingest, bundles) and mapped to the current name: ``ecc_dbe`` is the name
#: contracts.md section 1 fixed for the volatile double-bit ECC counter.
GPU_ALIASES: dict[str, str] = {"ecc_dbe": "ecc_dbe_vol"}
#: Bundle (gpu.csv) column names that differ from the catalog's: the contract's
#: own name is written, so tools that read bundles keep finding it.
GPU_CSV_NAMES: dict[str, str] = {"ecc_dbe_vol": "ecc_dbe"}

#: contracts.md section 1: the columns of a bundle's gpu.csv and host.csv, in
#: order (the catalog's, less the collector's own MIG and run attribution).
GPU_CSV_COLUMNS: tuple[str, ...] = (
    "time",
    "node",
    "gpu",
    *(
        GPU_CSV_NAMES.get(f.name, f.name)
        for f in GPU_FIELDS
        if f.bundle and f.name not in ("mig_instance", "run_id")
    ),
)
HOST_CSV_COLUMNS: tuple[str, ...] = ("time", "node", *(f.name for f in HOST_FIELDS if f.bundle))

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
    clash = set(GPU_ALIASES) & set(GPU_BY_NAME)
    if clash or not set(GPU_ALIASES.values()) <= set(GPU_BY_NAME):
        raise ValueError(
            f"metric catalog: aliases must name no current field and map to one: {sorted(clash)}"
        )


def canonical_gpu_name(name: str) -> str:
    """The catalog name of a GPU column given by its current or an older name."""
    return GPU_ALIASES.get(name, name)
