"""Node facts: the typed schema agents report them in, and how consumers read them.

A batch may carry ``facts``, an object describing the node (GPU models,
driver, CPU governor, container CPU quota ...).  They are stored in
``nodes.facts`` and read by the accounting (GPU models and peak FLOP/s for
MFU) and the ``host_misconfig`` detector (governor, quota, GPU count).

Two rules keep one node's facts from hurting anyone else:

* **At ingest** :func:`check_facts` refuses facts that do not fit the schema
  (422 naming the field; nothing is written).  Keys the schema does not know
  are accepted, forward compatible, but must still be plain JSON: objects,
  arrays, strings without NUL, finite numbers, booleans and null, at most
  :data:`MAX_DEPTH` deep and :data:`MAX_ITEMS` values in all.
* **When reading** :meth:`NodeFacts.read` never raises: facts stored before
  this schema existed (or written by hand) lose the fields that do not fit,
  so a bad value can blank at most that node's own result.

The known keys are what the agent's sources report: ``agent/sources/facts.py``
(hostname, kernel, cpu_*), the NVML source (driver and CUDA versions,
``gpu_count``, ``gpus``), dcgm-exporter (``gpus``, ``dcgm_exporter_url``),
DCGM (``dcgm_gpus``, ``dcgm_mig_instances``), attribution (``runs``: the
runs on the node's GPUs with name, team and labels) and the simulator (``gpu_model``,
``bf16_dense_peak_flops``, ...); ``host_misconfig`` also reads the cgroup
spellings ``cpu_quota_us``/``cpu_period_us``/``cpu_max`` and the governor
aliases ``scaling_governor``/``governor``.

The node checks (``gpufleet diagnose``, :mod:`gpufleet.agent.diagnose`) add
``checks`` (each check's status, finding, value and decision, for the node
page), ``checks_status`` (the worst), and the placement they judged, which
``host_misconfig`` reads: ``job_cgroups`` (each cgroup feeding GPUs, its CPU
quota and throttling), ``gpu_processes`` (each GPU's NUMA node and the CPUs
its processes may run on) and ``nfs_mounts`` (RPC retransmissions, backlog
wait and round trip of each NFS mount).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

#: Deepest nesting accepted inside ``facts`` (the agent's deepest is 4:
#: facts -> gpus -> entry -> mig_instances -> entry).
MAX_DEPTH = 16
#: Most values (of any kind, containers included) inside ``facts``.
MAX_ITEMS = 20_000
#: Longest string (or key) inside ``facts``, characters.
MAX_STR = 4096

_Count = Annotated[int, Field(ge=0, le=1_000_000)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Small = Annotated[int, Field(ge=-1, le=1_000_000)]
_Governor = str | list[str | None] | dict[str, str | None]


class _Base(BaseModel):
    # strict: "4" is not 4 and true is not 1; an int is still a float.
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class MigInstanceFacts(_Base):
    gpu: Annotated[int, Field(ge=0, le=32767)] | None = None
    gpu_instance_id: _Small | None = None
    uuid: str | None = None


class GpuFacts(_Base):
    """One GPU of the node (NVML, dcgm-exporter or DCGM spelling)."""

    gpu: Annotated[int, Field(ge=0, le=32767)] | None = None
    index: Annotated[int, Field(ge=0, le=32767)] | None = None
    uuid: str | None = None
    name: str | None = None
    lost: bool | None = None
    pci_bus_id: str | None = None
    hostname: str | None = None
    driver_version: str | None = None
    sm_clock_max_mhz: _Count | None = None
    pcie_gen_max: _Count | None = None
    pcie_width_max: _Count | None = None
    numa_node: _Small | None = None
    cpu_affinity: str | None = None
    mig_enabled: bool | None = None
    mig_instances: list[MigInstanceFacts] | None = None

    @property
    def index_of(self) -> int | None:
        return self.gpu if self.gpu is not None else self.index


class RunFacts(_Base):
    """A run the agent's attribution found on this node's GPUs (``facts["runs"][run_id]``), for the
    collector to register it with a name, team and labels (gpufleet.store.inferred)."""

    source: str | None = None
    name: str | None = None
    team: str | None = None
    labels: dict[str, str] | None = None


_Status = Literal["ok", "warn", "fail", "unknown", "skipped"]
_Big = Annotated[int, Field(ge=0, lt=2**63)]
_Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
_Pct = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
_GpuIndex = Annotated[int, Field(ge=0, le=32767)]


class CheckFacts(_Base):
    """One node check (:class:`gpufleet.agent.diagnose.checks.Check`) as the node page shows it."""

    check: str
    status: _Status
    subject: str | None = None
    value: _Finite | str | None = None
    unit: str | None = None
    finding: str | None = None
    decision: str | None = None


class JobCgroupFacts(_Base):
    """A cgroup feeding GPUs: the job's container, with what CPU it may use."""

    cgroup: str | None = None
    cgroup_version: Annotated[int, Field(ge=1, le=2)] | None = None
    gpus: list[_GpuIndex] | None = None
    pids: _Big | None = None
    #: Cores; None when nothing narrower than the host applies.
    cpu_quota_cores: _NonNeg | None = None
    #: ``cfs`` (cpu.max / cfs_quota_us) or ``cpuset``.
    quota_kind: str | None = None
    cpu_cores: _NonNeg | None = None
    cpu_throttled_share: _Share | None = None
    cpu_pressure_pct: _Pct | None = None
    io_pressure_pct: _Pct | None = None


class GpuProcessFacts(_Base):
    """Where the processes on one GPU may run, against the GPU's NUMA node."""

    gpu: _GpuIndex
    pids: _Big | None = None
    gpu_numa_node: _Small | None = None
    #: Kernel CPU list (``"0-15,32-47"``) the processes may run on together.
    cpus_allowed: str | None = None
    numa_nodes: list[_Small] | None = None


class NfsMountFacts(_Base):
    """One NFS mount's RPC figures over the last interval (or since it was mounted)."""

    mountpoint: str
    device: str | None = None
    interval_s: _NonNeg | None = None
    since_mount: bool | None = None
    ops: _Big | None = None
    retrans: _Big | None = None
    timeouts: _Big | None = None
    queue_ms: _NonNeg | None = None
    rtt_ms: _NonNeg | None = None
    execute_ms: _NonNeg | None = None
    backlog: _NonNeg | None = None


class NodeFacts(_Base):
    """The facts of one node; unknown keys are kept (``model_extra``)."""

    hostname: str | None = None
    kernel: str | None = None
    site: str | None = None
    simulated: bool | None = None
    cpu_count: _Count | None = None
    #: One name, ``"mixed: ondemand=2,performance=6"``, or a list / mapping (CPU -> name) of names.
    cpu_governor: _Governor | None = None
    #: How many CPUs run each governor: ``{"performance": 64}``.
    cpu_governors: dict[str, _Count] | None = None
    scaling_governor: _Governor | None = None
    governor: _Governor | None = None
    #: Cores of the CPU quota; None (or <= 0) means unlimited.
    cpu_quota_cores: _Finite | None = None
    cpu_quota_us: _Finite | None = None
    cpu_period_us: _Positive | None = None
    cpu_max: Annotated[str, Field(pattern=r"^\s*(max|\d+)(\s+\d+)?\s*$")] | None = None
    gpu_count: _Count | None = None
    gpus: list[GpuFacts] | None = None
    gpu_model: str | None = None
    gpu_profile: str | None = None
    bf16_dense_peak_flops: _Positive | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    mem_total_mib: _NonNeg | None = None
    power_limit_default_w: _NonNeg | None = None
    dcgm_exporter_url: str | None = None
    dcgm_gpus: list[GpuFacts] | None = None
    dcgm_mig_instances: list[MigInstanceFacts] | None = None
    runs: dict[str, RunFacts] | None = None
    checks: list[CheckFacts] | None = None
    checks_status: _Status | None = None
    job_cgroups: list[JobCgroupFacts] | None = None
    gpu_processes: list[GpuProcessFacts] | None = None
    nfs_mounts: list[NfsMountFacts] | None = None

    # -- reading -----------------------------------------------------------------

    @classmethod
    def read(cls, raw: Any) -> NodeFacts:
        """Facts as stored, never raising: fields that do not fit are dropped
        (one bad GPU entry drops that entry only), anything else not an object
        reads as no facts at all."""
        if isinstance(raw, NodeFacts):
            return raw
        if not isinstance(raw, Mapping):
            return _EMPTY
        doc: dict[str, Any] = {str(k): v for k, v in raw.items()}
        for _ in range(4):
            try:
                return cls.model_validate(doc)
            except ValidationError as e:
                doc = _without_bad(doc, e)
            except (RecursionError, TypeError, ValueError):
                break
        log.debug("node facts unreadable; reading them as none")
        return _EMPTY

    def gpu_model_of(self, gpu: int) -> str | None:
        """The model name of GPU ``gpu`` (``gpus[].name``), else the node's ``gpu_model``."""
        model = None
        for entry in self.gpus or ():
            if entry.index_of == gpu and entry.name:
                model = entry.name
        return model or self.gpu_model or None


_EMPTY = NodeFacts()


def _without_bad(doc: dict[str, Any], err: ValidationError) -> dict[str, Any]:
    """``doc`` less the top-level keys (or list entries) that ``err`` names."""
    drop_keys: set[str] = set()
    drop_items: dict[str, set[int]] = {}
    for e in err.errors():
        loc = e.get("loc") or ()
        if not loc:
            return {}
        key = str(loc[0])
        if len(loc) > 1 and isinstance(loc[1], int) and isinstance(doc.get(key), list):
            drop_items.setdefault(key, set()).add(loc[1])
        else:
            drop_keys.add(key)
    out = {k: v for k, v in doc.items() if k not in drop_keys}
    for key, idx in drop_items.items():
        if key in out:
            out[key] = [v for i, v in enumerate(out[key]) if i not in idx]
    return out


# -- ingest -----------------------------------------------------------------------


class FactsError(ValueError):
    """Facts that do not fit the schema; ``loc`` names the field from ``facts``."""

    def __init__(self, msg: str, loc: tuple[Any, ...]) -> None:
        super().__init__(msg)
        self.msg = msg
        self.loc = loc


def plain_json(value: Any, where: str = "facts") -> None:
    """Raise FactsError unless ``value`` is plain, bounded JSON (checked
    iteratively, so depth cannot exhaust the stack); ``loc`` starts at ``where``."""
    items = 0
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(value, (where,), 1)]
    while stack:
        v, loc, depth = stack.pop()
        items += 1
        if items > MAX_ITEMS:
            raise FactsError(f"more than {MAX_ITEMS} values", (where,))
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -(2**63) <= v < 2**63:
                raise FactsError("integer out of the 64-bit range", loc)
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise FactsError(f"{v!r} is not allowed (use null)", loc)
            continue
        if isinstance(v, str):
            if len(v) > MAX_STR or "\x00" in v:
                raise FactsError(f"strings must be at most {MAX_STR} characters without NUL", loc)
            continue
        if isinstance(v, dict | list):
            if depth >= MAX_DEPTH:
                raise FactsError(f"nested deeper than {MAX_DEPTH} levels", loc)
            if isinstance(v, dict):
                for k, sub in v.items():
                    if not isinstance(k, str) or len(k) > MAX_STR or "\x00" in k:
                        raise FactsError("keys must be strings without NUL", loc)
                    stack.append((sub, (*loc, k), depth + 1))
            else:
                stack.extend((sub, (*loc, i), depth + 1) for i, sub in enumerate(v))
            continue
        raise FactsError(
            f"must be JSON (object, array, string, number, boolean or null), got {type(v).__name__}", loc
        )


def check_facts(facts: Any) -> dict[str, Any]:
    """The facts of a batch when they fit the schema, else FactsError naming the field."""
    if not isinstance(facts, dict):
        raise FactsError("must be an object", ("facts",))
    plain_json(facts)
    try:
        NodeFacts.model_validate(facts)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ("facts", *first.get("loc", ()))
        raise FactsError(str(first.get("msg", "invalid")), loc) from None
    return facts
