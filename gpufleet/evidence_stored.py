"""Each finding kind's evidence as stored: its shapes as written, with every key optional.

Generated from gpufleet/evidence.py by tools/gen_evidence_views.py: do not edit it by hand.  Change
the shapes there and run ``python tools/gen_evidence_views.py``; tests/detectors/test_evidence.py
fails while this module differs from what the script renders.

It is source because mypy checks a reader of stored evidence (``ev.get("clock_ratio")`` as
``float | None``, a misspelt key an error) only against a view it reads as source, and Python's
typing has no "every key optional" operator to derive one from a ``TypedDict``.  A GPU's own entry
in a list (``gpufleet.evidence.GPU_ENTRIES``) has a stored view of its own; the other nested shapes
are kept as written.

gpufleet.evidence imports these views (readers import them from there), so this module imports
nothing from it: the nested shapes kept as written (``JobQuota``, ...) are copied here, with the
same keys, types and required keys.  No ``from __future__ import annotations``, as there: Python
3.11 reads ``NotRequired`` only off evaluated annotations.
"""

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict


class StoredStarvation(TypedDict, total=False):
    """``StarvationEvidence`` as stored: every key optional."""

    cpu_user_pct: float | None
    iowait_pct: float | None
    disk_util_pct: float | None
    disk_await_ms: float | None
    host: str | None
    job_node: str | None
    job_cpu_cores: float | None
    job_cpu_quota_cores: float | None
    job_cpu_throttled_share: float | None
    job_cpu_pressure_pct: float | None
    job_io_pressure_pct: float | None
    pattern: Literal["oscillating", "steady_low"]
    period_s: float | None
    duty_cycle: float | None
    depth: float | None
    cycles: int
    mean_activity: float | None
    cause_basis: str | None
    job_cause_basis: str | None
    gpu_time_lost_share: float | None
    gpus_affected: int
    gpu_count: int
    activity_source: str
    activity_basis: str


class StoredCheckpointStall(TypedDict, total=False):
    """``CheckpointStallEvidence`` as stored: every key optional."""

    basis: Literal["gpu+host", "gpu_only"]
    signature: Literal["host_write", "writer", "sharded_d2h", "sharded_sync"]
    d2h_bytes_s: float | None
    period_s: float | None
    pause_s: float | None
    pauses: int
    run_time_lost_share: float | None
    writer_gpu: str | None
    blocking_gpus: list[str]
    writer_same_share: float | None
    spinning_gpus: float | None
    write_bytes_s: float | None
    write_bytes_s_busy: float | None
    write_path: str | None
    host: str | None
    gpu_count: int
    activity_basis: str


class StoredStraggler(TypedDict, total=False):
    """``StragglerEvidence`` as stored: every key optional."""

    z: float | None
    feature: str
    peers: int
    activity: float | None
    peer_activity: float | None
    power_frac: float | None
    peer_power_frac: float | None
    power_limit_w: float | None
    peer_power_limit_w: float | None
    sm_clock_mhz: float | None
    peer_sm_clock_mhz: float | None
    temp_c: float | None
    peer_temp_c: float | None
    thermal_share: float | None
    power_cap_share: float | None
    pcie_degraded_share: float | None
    z_power_limit: float | None
    z_sm_clock: float | None
    z_temp: float | None
    z_activity: float | None
    power_plateau_w: float | None
    peer_power_plateau_w: float | None
    z_power_plateau: float | None
    power_w: float | None
    peer_power_w: float | None
    z_power: float | None
    power_correlation: float | None
    peer_power_correlation: float | None
    wait_share: float | None
    peer_wait_share: float | None
    dip_share: float | None
    peer_dip_share: float | None
    network_reason: str
    network_nodes: list[str]
    activity_basis: str


class StoredThrottledGpu(TypedDict, total=False):
    """``ThrottledGpu`` as stored (a GPU's entry in its kind's evidence): every key optional."""

    throttled_share: float | None
    throttled_s: float | None
    busy_s: float | None
    clock_ratio: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    reasons: list[str]
    reasons_mask: str
    reason_source: str
    cause_share: float | None
    temp_c_max: float | None
    power_frac: float | None
    node: str | None
    gpu: int | None
    since: str


class StoredThrottling(TypedDict, total=False):
    """``ThrottlingEvidence`` as stored: every key optional."""

    throttled_share: float | None
    throttled_s: float | None
    busy_s: float | None
    clock_ratio: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    reasons: list[str]
    reasons_mask: str
    reason_source: str
    cause_share: float | None
    temp_c_max: float | None
    power_frac: float | None
    gpu_count: int
    gpus: list[StoredThrottledGpu]


class StoredPcieDegraded(TypedDict, total=False):
    """``PcieDegradedEvidence`` as stored: every key optional."""

    pcie_gen: float | None
    pcie_gen_max: float | None
    pcie_width: float | None
    pcie_width_max: float | None
    degraded_share: float | None
    degraded_s: float | None
    pcie_rx_bytes_s: float | None
    pcie_tx_bytes_s: float | None


class JobQuota(TypedDict):
    """``gpufleet.evidence.JobQuota``, copied: the stored views keep it as written."""

    job: str | None
    gpus: list[int]
    cpu_quota_cores: float | None


class NumaMisplaced(TypedDict):
    """``gpufleet.evidence.NumaMisplaced``, copied: the stored views keep it as written."""

    gpu: int
    gpu_numa_node: int
    numa_nodes: list[int]
    cpus_allowed: str | None


class NfsStall(TypedDict):
    """``gpufleet.evidence.NfsStall``, copied: the stored views keep it as written."""

    mountpoint: str
    device: str | None
    why: str
    ops: int | None
    retrans: int | None
    timeouts: int | None
    queue_ms: float | None
    rtt_ms: float | None


class XidMeaning(TypedDict):
    """``gpufleet.evidence.XidMeaning``, copied: the stored views keep it as written."""

    name: str
    meaning: str
    cause: NotRequired[str]
    action: NotRequired[str]


class StoredHostMisconfig(TypedDict, total=False):
    """``HostSettingsEvidence`` and ``RepeatedXidEvidence`` as stored: every key optional."""

    issues: list[str]
    cpu_governor: list[str]
    gpu_count: int | None
    cpu_count: int | None
    quota_basis: str | None
    cpu_quota_cores: float | None
    jobs: list[JobQuota]
    jobs_short: list[str | None]
    numa_misplaced: list[NumaMisplaced]
    nfs_stalls: list[NfsStall]
    xid_events: int
    xid_codes: list[int]
    last_xid: int
    xid_meanings: dict[str, XidMeaning]


class StoredNvlinkDegraded(TypedDict, total=False):
    """``NvlinkDegradedEvidence`` as stored: every key optional."""

    issues: list[str]
    links_up: int
    links_expected: int
    links_down: int
    down_s: float | None
    nvlink_bytes_s: float | None
    peers_nvlink_bytes_s: float | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    busy_s: float | None
    nvlink_threshold_bytes_s: float | None
    crc_errors: int
    replay_errors: int
    recoveries: int
    errors_per_min: float | None
    crc_errors_total: float | None


class StoredGpuHealth(TypedDict, total=False):
    """``GpuHealthEvidence`` as stored: every key optional."""

    issues: list[str]
    remapped_rows_failed: int
    remapped_rows_pending: int
    dbe_errors: int
    dbe_total: float | None
    uncorrectable_remaps: int
    sbe_errors: int
    sbe_per_h: float | None
    sbe_total: float | None
    pcie_replays: int
    pcie_replays_per_min: float | None
    pcie_replay_total: float | None
    xid_codes: list[int]
    xid_meanings: dict[str, XidMeaning]


class StoredIdleGpu(TypedDict, total=False):
    """``IdleGpu`` as stored (a GPU's entry in its kind's evidence): every key optional."""

    node: str
    gpu: int
    since: str
    idle_s: float
    util_pct: float | None
    power_w: float | None
    mem_used_mib: float | None


class StoredIdleAllocation(TypedDict, total=False):
    """``IdleAllocationEvidence`` as stored: every key optional."""

    scope: Literal["all", "some"]
    gpus: list[StoredIdleGpu]
    idle_gpus: int
    gpu_count: int
    idle_s: float
    since_before_window: bool
    activity_basis: str


class StoredSpinningGpu(TypedDict, total=False):
    """``SpinningGpu`` as stored (a GPU's entry in its kind's evidence): every key optional."""

    node: str
    gpu: int
    util_pct: float | None
    power_w: float | None
    power_frac: float | None
    sm_active: float | None


class StoredHungCollective(TypedDict, total=False):
    """``HungCollectiveEvidence`` as stored: every key optional."""

    hung_s: float
    since: str
    spinning_gpus: list[StoredSpinningGpu]
    dead_gpus: list[str]
    gpu_count: int
    power_basis: str
    progress_tokens: float | None
    network_reason: str
    network_nodes: list[str]
    activity_basis: str


#: Each kind's evidence as stored (every key optional).
STORED_TYPES: Mapping[str, Any] = {
    "starvation": StoredStarvation,
    "checkpoint_stall": StoredCheckpointStall,
    "straggler": StoredStraggler,
    "throttling": StoredThrottling,
    "pcie_degraded": StoredPcieDegraded,
    "host_misconfig": StoredHostMisconfig,
    "nvlink_degraded": StoredNvlinkDegraded,
    "gpu_health": StoredGpuHealth,
    "idle_allocation": StoredIdleAllocation,
    "hung_collective": StoredHungCollective,
}
