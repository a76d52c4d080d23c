"""The evidence of each finding kind: the typed shape detectors write and readers read.

A finding's ``evidence`` is a JSON object (contracts.md section 2); each kind
writes its own keys.  They are declared here as ``TypedDict``s, one per kind
(two for ``host_misconfig``: node settings and repeated XIDs), so that mypy
checks every key a detector writes and every field a reader takes.  The JSON
itself is unchanged: a ``TypedDict`` is the plain ``dict`` that is stored.

Two views of each shape:

* **as written** (``StarvationEvidence``, ...): what a detector builds now;
  ``NotRequired`` keys are the ones it writes only sometimes (a pattern's own
  figures, an issue's numbers when that issue is present).
* **as stored** (``StoredStarvation``, ...): the same keys, every one
  optional.  Incidents in the database may predate a key, or have been
  written by hand; :func:`read_evidence` returns the stored view of a kind
  with the keys whose values fit their declared type (lists keep the items
  that fit), so a reader takes ``ev.get("clock_ratio")`` as ``float | None``
  and a misspelt field is a type error, never a silent miss.  Python's typing
  cannot derive them ("every key optional") and mypy checks readers only
  against views it reads as source, so tools/gen_evidence_views.py renders
  them from the written shapes into gpufleet/evidence_stored.py; this module
  imports them, and readers import them from here.

Shared core: imported by the detectors (the collector), the accounting, the
store, the API and the alerting alike, so it imports none of them.
"""

# No ``from __future__ import annotations``: ``TypedDict`` reads ``NotRequired`` off evaluated annotations
# only (with string annotations Python 3.11 counts every key as required in ``__required_keys__``).
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, Union, is_typeddict, overload

# The stored views, generated from the shapes below (see "as stored"); readers import them from here.
from gpufleet.evidence_stored import (  # noqa: F401
    STORED_TYPES,
    StoredCheckpointStall,
    StoredGpuHealth,
    StoredHostMisconfig,
    StoredHungCollective,
    StoredIdleAllocation,
    StoredIdleGpu,
    StoredNvlinkDegraded,
    StoredPcieDegraded,
    StoredSpinningGpu,
    StoredStarvation,
    StoredStraggler,
    StoredThrottledGpu,
    StoredThrottling,
)

STARVATION = "starvation"
CHECKPOINT_STALL = "checkpoint_stall"
STRAGGLER = "straggler"
THROTTLING = "throttling"
PCIE_DEGRADED = "pcie_degraded"
HOST_MISCONFIG = "host_misconfig"
NVLINK_DEGRADED = "nvlink_degraded"
GPU_HEALTH = "gpu_health"
IDLE_ALLOCATION = "idle_allocation"
HUNG_COLLECTIVE = "hung_collective"


# --- as written --------------------------------------------------------------------------------------------


class HostEvidence(TypedDict):
    """The most pressured host of a run over the finding's span (None: no host data)."""

    cpu_user_pct: float | None
    iowait_pct: float | None
    disk_util_pct: float | None
    disk_await_ms: float | None
    host: str | None


class JobEvidence(TypedDict):
    """The most pressured of the run's job cgroups over the finding's span (None: not reported)."""

    job_node: str | None
    job_cpu_cores: float | None
    job_cpu_quota_cores: float | None
    job_cpu_throttled_share: float | None
    job_cpu_pressure_pct: float | None
    job_io_pressure_pct: float | None


class StarvationEvidence(HostEvidence, JobEvidence):
    pattern: Literal["oscillating", "steady_low"]
    #: Oscillating: median over the GPUs; steady low: None.
    period_s: float | None
    duty_cycle: float | None
    depth: float | None
    #: Oscillating only: complete idle phases in a row.
    cycles: NotRequired[int]
    #: Steady low only.
    mean_activity: NotRequired[float | None]
    #: ``job_cgroup`` or ``host``: which figures named the cause (None: neither).
    cause_basis: str | None
    #: ``quota``, ``throttled``, ``cpu_pressure`` or ``io_pressure`` (None: the job's cgroup showed nothing).
    job_cause_basis: str | None
    gpu_time_lost_share: float | None
    gpus_affected: int
    gpu_count: int
    activity_source: str
    activity_basis: str


class CheckpointStallEvidence(TypedDict):
    basis: Literal["gpu+host", "gpu_only"]
    #: What showed it a checkpoint: ``host_write`` (a host write burst in the pauses), ``writer`` (one
    #: rank blocked while its peers spun), ``sharded_d2h`` (every rank idle, copying out over PCIe) or
    #: ``sharded_sync`` (every rank idle at once at a slow, regular spacing).
    signature: Literal["host_write", "writer", "sharded_d2h", "sharded_sync"]
    #: ``sharded_d2h``: the ranks' mean PCIe transmit during the pauses, bytes/s.
    d2h_bytes_s: float | None
    period_s: float | None
    pause_s: float | None
    pauses: int
    run_time_lost_share: float | None
    #: ``node/gpu`` of the rank that blocked while its peers spun (None: no such rank).
    writer_gpu: str | None
    blocking_gpus: list[str]
    writer_same_share: float | None
    spinning_gpus: float | None
    write_bytes_s: float | None
    write_bytes_s_busy: float | None
    #: ``disk`` or ``network`` (None: no host write rates).
    write_path: str | None
    host: str | None
    gpu_count: int
    activity_basis: str


class StragglerEvidence(TypedDict):
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
    #: Share of the span this GPU, and its peers (median), spun in a collective (a kernel resident at
    #: power below its own pause level): a GPU that spins more than its peers waits on them.
    wait_share: float | None
    peer_wait_share: float | None
    #: Share of the span it, and its peers, dipped below their own busy power with a kernel resident.
    dip_share: float | None
    peer_dip_share: float | None
    #: Cause ``network``: what the straggler's node's fabric showed (``link_errors``, ``port_down``,
    #: ``packet_loss``, ``saturated``) and the nodes implicated.
    network_reason: NotRequired[str]
    network_nodes: NotRequired[list[str]]
    activity_basis: str


class ThrottlingGpuEvidence(TypedDict):
    """One throttled GPU; for a run's GPUs throttled for one reason, the summary over them."""

    throttled_share: float | None
    throttled_s: float | None
    busy_s: float | None
    clock_ratio: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    reasons: list[str]
    #: Hex of the reason bits seen (``0x4``).
    reasons_mask: str
    #: ``bitmask`` or ``inferred``; for a run's GPUs also ``mixed``.
    reason_source: str
    cause_share: float | None
    temp_c_max: float | None
    power_frac: float | None


class ThrottledGpu(ThrottlingGpuEvidence):
    """An entry of a run's throttling ``evidence.gpus``: the GPU and its own evidence."""

    node: str | None
    gpu: int | None
    #: When this GPU's throttling began (RFC 3339): its own row's ``start`` in FINDINGS.jsonl.
    since: NotRequired[str]


class ThrottlingEvidence(ThrottlingGpuEvidence):
    #: A run's GPUs throttled for one reason (``gpu`` null): how many, and each one.
    gpu_count: NotRequired[int]
    gpus: NotRequired[list[ThrottledGpu]]


class PcieDegradedEvidence(TypedDict):
    pcie_gen: float | None
    pcie_gen_max: float | None
    pcie_width: float | None
    pcie_width_max: float | None
    degraded_share: float | None
    degraded_s: float | None
    pcie_rx_bytes_s: float | None
    pcie_tx_bytes_s: float | None


class JobQuota(TypedDict):
    """A job's cgroup on the node: the GPUs it feeds and the cores it may use (None: unlimited)."""

    job: str | None
    gpus: list[int]
    cpu_quota_cores: float | None


class NumaMisplaced(TypedDict):
    gpu: int
    gpu_numa_node: int
    numa_nodes: list[int]
    cpus_allowed: str | None


class NfsStall(TypedDict):
    mountpoint: str
    device: str | None
    why: str
    ops: int | None
    retrans: int | None
    timeouts: int | None
    queue_ms: float | None
    rtt_ms: float | None


class XidMeaning(TypedDict):
    """What one XID code means (:func:`gpufleet.xid.meanings`); a code not in its table has no cause or
    action."""

    name: str
    meaning: str
    #: :data:`gpufleet.xid.Cause`
    cause: NotRequired[str]
    #: :data:`gpufleet.xid.Action`
    action: NotRequired[str]


class HostSettingsEvidence(TypedDict):
    """``host_misconfig`` of a node's settings (node-scoped; cause ``cpu_quota``, ``numa_affinity``, ...)."""

    issues: list[str]
    cpu_governor: NotRequired[list[str]]
    gpu_count: int | None
    cpu_count: int | None
    #: ``job_cgroup``, ``job_columns`` or None (the node-level quota facts).
    quota_basis: str | None
    cpu_quota_cores: float | None
    jobs: NotRequired[list[JobQuota]]
    jobs_short: NotRequired[list[str | None]]
    numa_misplaced: NotRequired[list[NumaMisplaced]]
    nfs_stalls: NotRequired[list[NfsStall]]


class RepeatedXidEvidence(TypedDict):
    """``host_misconfig`` with cause ``repeated_xid`` (GPU-scoped)."""

    xid_events: int
    xid_codes: list[int]
    last_xid: int
    xid_meanings: dict[str, XidMeaning]


HostMisconfigEvidence = HostSettingsEvidence | RepeatedXidEvidence


class NvlinkDegradedEvidence(TypedDict):
    #: The causes present, most serious first; each one's figures below.
    issues: list[str]
    # links_down
    links_up: NotRequired[int]
    links_expected: NotRequired[int]
    links_down: NotRequired[int]
    down_s: NotRequired[float | None]
    # pcie_fallback
    nvlink_bytes_s: NotRequired[float | None]
    peers_nvlink_bytes_s: NotRequired[float | None]
    pcie_tx_bytes_s: NotRequired[float | None]
    pcie_rx_bytes_s: NotRequired[float | None]
    busy_s: NotRequired[float | None]
    nvlink_threshold_bytes_s: NotRequired[float | None]
    # link_errors
    crc_errors: NotRequired[int]
    replay_errors: NotRequired[int]
    recoveries: NotRequired[int]
    errors_per_min: NotRequired[float | None]
    crc_errors_total: NotRequired[float | None]


class GpuHealthEvidence(TypedDict):
    #: The causes present, most serious first; each one's figures below.
    issues: list[str]
    # row_remap_failed / row_remap_pending: the flag, 1
    remapped_rows_failed: NotRequired[int]
    remapped_rows_pending: NotRequired[int]
    # uncorrectable_ecc
    dbe_errors: NotRequired[int]
    dbe_total: NotRequired[float | None]
    uncorrectable_remaps: NotRequired[int]
    # correctable_ecc
    sbe_errors: NotRequired[int]
    sbe_per_h: NotRequired[float | None]
    sbe_total: NotRequired[float | None]
    # pcie_replay
    pcie_replays: NotRequired[int]
    pcie_replays_per_min: NotRequired[float | None]
    pcie_replay_total: NotRequired[float | None]
    # the XIDs the GPU logged in the window, when any
    xid_codes: NotRequired[list[int]]
    xid_meanings: NotRequired[dict[str, XidMeaning]]


class IdleGpu(TypedDict):
    """A GPU of an idle allocation: which, since when (RFC 3339), and what it read meanwhile."""

    node: str
    gpu: int
    since: str
    idle_s: float
    util_pct: float | None
    power_w: float | None
    mem_used_mib: float | None


class IdleAllocationEvidence(TypedDict):
    #: ``all``: every GPU of the run idles; ``some``: these idle while the others work.
    scope: Literal["all", "some"]
    gpus: list[IdleGpu]
    idle_gpus: int
    gpu_count: int
    #: Seconds the longest-idle GPU has been idle (at least, when it idled before the window).
    idle_s: float
    #: The idling began before the window in view: ``since`` is the earliest time seen.
    since_before_window: bool
    activity_basis: str


class SpinningGpu(TypedDict):
    node: str
    gpu: int
    util_pct: float | None
    power_w: float | None
    power_frac: float | None
    sm_active: float | None


class HungCollectiveEvidence(TypedDict):
    #: Seconds every working rank has spun with no progress (at least, when it began before the window).
    hung_s: float
    since: str
    spinning_gpus: list[SpinningGpu]
    #: Ranks that run no kernel at all among the spinners: the rank that died or blocked.
    dead_gpus: list[str]
    gpu_count: int
    #: What told spinning from work: ``power_frac`` (limit, model or busy history), ``dead_rank_power``
    #: (the spinners' power next to the dead ranks' idle power) or ``sm_active``.
    power_basis: str
    #: Tokens the run reported over the stretch (None: the run reports no progress).
    progress_tokens: float | None
    #: Where a node of the run shows a fabric fault: what (``link_errors``, ``port_down``,
    #: ``packet_loss``, ``saturated``) and which nodes, a likely reason the collective never completes.
    network_reason: NotRequired[str]
    network_nodes: NotRequired[list[str]]
    activity_basis: str


#: Every shape a finding's evidence takes (a GPU throttled on its own has no ``gpus``).
Evidence = (
    StarvationEvidence
    | CheckpointStallEvidence
    | StragglerEvidence
    | ThrottlingEvidence
    | ThrottlingGpuEvidence
    | PcieDegradedEvidence
    | HostSettingsEvidence
    | RepeatedXidEvidence
    | NvlinkDegradedEvidence
    | GpuHealthEvidence
    | IdleAllocationEvidence
    | HungCollectiveEvidence
)

#: Each kind's evidence as written: the ``TypedDict`` (or, for ``host_misconfig``, those) a finding of it fits.
EVIDENCE_TYPES: Mapping[str, tuple[Any, ...]] = {
    STARVATION: (StarvationEvidence,),
    CHECKPOINT_STALL: (CheckpointStallEvidence,),
    STRAGGLER: (StragglerEvidence,),
    THROTTLING: (ThrottlingEvidence,),
    PCIE_DEGRADED: (PcieDegradedEvidence,),
    HOST_MISCONFIG: (HostSettingsEvidence, RepeatedXidEvidence),
    NVLINK_DEGRADED: (NvlinkDegradedEvidence,),
    GPU_HEALTH: (GpuHealthEvidence,),
    IDLE_ALLOCATION: (IdleAllocationEvidence,),
    HUNG_COLLECTIVE: (HungCollectiveEvidence,),
}


#: The nested shapes that are a GPU's own evidence (a run's throttled GPUs, its idle GPUs, the ranks spinning
#: in a hung collective).  As stored each has a view of its own with every key optional, read like its kind's
#: evidence (an entry keeps the keys that fit); the other nested shapes (a job's quota, a misplaced GPU, an
#: NFS stall, an XID's meaning) are stored as written, and an entry without its required keys is left out.
GPU_ENTRIES: tuple[Any, ...] = (ThrottledGpu, IdleGpu, SpinningGpu)


# --- as stored: the same keys, none required ---------------------------------------------------------------

# Each kind's stored view (``StoredStarvation``, ...), each GPU entry's (``StoredThrottledGpu``, ...) and
# ``STORED_TYPES`` are generated from the shapes above into gpufleet/evidence_stored.py by
# tools/gen_evidence_views.py, and imported at the top of this module: readers import them from here.


class LostTime(TypedDict, total=False):
    """What the loss model reads from a ``starvation`` or ``checkpoint_stall`` incident (contracts.md
    section 3.2): ``gpu_time_lost_share``, else ``run_time_lost_share``, else 1 - ``duty_cycle``."""

    gpu_time_lost_share: float | None
    run_time_lost_share: float | None
    duty_cycle: float | None


# --- reading ------------------------------------------------------------------------------------------------

_MISSING = object()


def fits(value: object, tp: Any) -> bool:
    """Whether a JSON value is of type ``tp`` (an annotation of these shapes), exactly: every key of a
    ``TypedDict`` declared, the required ones present, every item of a list fitting.  An int is a float;
    a bool is neither."""
    return _fit(value, tp, strict=True) is not _MISSING


def _fit(value: object, tp: Any, strict: bool) -> object:
    """``value`` as type ``tp``, or ``_MISSING`` when it does not fit.  Lenient (``strict`` false): a
    ``TypedDict`` keeps the declared keys that fit (it does not fit without its required ones) and a
    list or mapping the items that fit."""
    return _checker(tp, strict)(value)


Check = typing.Callable[[object], object]
_CHECKERS: dict[tuple[Any, bool], Check] = {}


def _checker(tp: Any, strict: bool) -> Check:
    """The check of ``tp`` (see :func:`_fit`), built once per annotation: readers check the evidence of
    every incident they price, and reading the annotation again for each value cost more than the
    pricing's own Python."""
    key = (tp, strict)
    got = _CHECKERS.get(key)
    if got is None:
        got = _CHECKERS[key] = _build(tp, strict)
    return got


def _build(tp: Any, strict: bool) -> Check:
    if tp is Any or tp is object:
        return lambda value: value
    if tp is None or tp is type(None):
        return lambda value: value if value is None else _MISSING
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        arms = [_checker(arm, strict) for arm in typing.get_args(tp)]

        def union(value: object) -> object:
            for arm in arms:
                got = arm(value)
                if got is not _MISSING:
                    return got
            return _MISSING

        return union
    if origin is Literal:
        allowed = typing.get_args(tp)
        return lambda value: (
            value if any(value == a and type(value) is type(a) for a in allowed) else _MISSING
        )
    if origin is list:
        (item_t,) = typing.get_args(tp)
        item = _checker(item_t, strict)

        def listed(value: object) -> object:
            if not isinstance(value, list):
                return _MISSING
            items = [item(v) for v in value]
            if strict and any(v is _MISSING for v in items):
                return _MISSING
            return [v for v in items if v is not _MISSING]

        return listed
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        key_c, val_c = _checker(key_t, strict), _checker(val_t, strict)

        def mapping(value: object) -> object:
            if not isinstance(value, dict):
                return _MISSING
            entries = {k: val_c(v) for k, v in value.items() if key_c(k) is not _MISSING}
            if strict and (len(entries) != len(value) or any(v is _MISSING for v in entries.values())):
                return _MISSING
            return {k: v for k, v in entries.items() if v is not _MISSING}

        return mapping
    if is_typeddict(tp):
        return _typeddict(tp, strict)
    if tp is float:
        return lambda value: (
            value if isinstance(value, int | float) and not isinstance(value, bool) else _MISSING
        )
    if tp is int:
        return lambda value: value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if isinstance(tp, type):
        return lambda value: value if isinstance(value, tp) else _MISSING
    raise TypeError(f"evidence: no check for the annotation {tp!r}")


def _typeddict(tp: Any, strict: bool) -> Check:
    hints = _hints(tp)
    required: frozenset[str] = tp.__required_keys__
    declared = set(hints)
    fields = [(k, _checker(ann, strict)) for k, ann in hints.items()]

    def check(value: object) -> object:
        if not isinstance(value, dict):
            return _MISSING
        if strict and (set(value) - declared or required - set(value)):
            return _MISSING
        out = {}
        for key, fit in fields:
            if key not in value:
                continue
            got = fit(value[key])
            if got is _MISSING:
                if strict or key in required:
                    return _MISSING
                continue
            out[key] = got
        if required - set(out):
            return _MISSING
        return out

    return check


_HINTS: dict[Any, dict[str, Any]] = {}


def _hints(tp: Any) -> dict[str, Any]:
    """The keys of a ``TypedDict`` and their types (``NotRequired`` taken off)."""
    got = _HINTS.get(tp)
    if got is None:
        got = _HINTS[tp] = typing.get_type_hints(tp)
    return got


@overload
def read_evidence(kind: Literal["starvation"], raw: object) -> StoredStarvation: ...
@overload
def read_evidence(kind: Literal["checkpoint_stall"], raw: object) -> StoredCheckpointStall: ...
@overload
def read_evidence(kind: Literal["straggler"], raw: object) -> StoredStraggler: ...
@overload
def read_evidence(kind: Literal["throttling"], raw: object) -> StoredThrottling: ...
@overload
def read_evidence(kind: Literal["pcie_degraded"], raw: object) -> StoredPcieDegraded: ...
@overload
def read_evidence(kind: Literal["host_misconfig"], raw: object) -> StoredHostMisconfig: ...
@overload
def read_evidence(kind: Literal["nvlink_degraded"], raw: object) -> StoredNvlinkDegraded: ...
@overload
def read_evidence(kind: Literal["gpu_health"], raw: object) -> StoredGpuHealth: ...
@overload
def read_evidence(kind: Literal["idle_allocation"], raw: object) -> StoredIdleAllocation: ...
@overload
def read_evidence(kind: Literal["hung_collective"], raw: object) -> StoredHungCollective: ...
def read_evidence(kind: str, raw: object) -> Any:
    """The stored evidence ``raw`` of an incident of ``kind``, as that kind's stored view: the declared
    keys whose values fit their type (a list keeps the items that fit); never raises on stored data.
    An unknown ``kind`` is a caller's error (``KeyError``)."""
    return read_as(STORED_TYPES[kind], raw)


def read_lost_time(raw: object) -> LostTime:
    """The lost-share fields of a ``starvation`` or ``checkpoint_stall`` incident's stored evidence."""
    got: LostTime = read_as(LostTime, raw)
    return got


def read_as(view: Any, raw: object) -> Any:
    """``raw`` (a stored JSON object, or anything) read as the all-optional ``TypedDict`` ``view``."""
    got = _fit(raw, view, strict=False)
    return {} if got is _MISSING else got
