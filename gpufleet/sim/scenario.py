"""Scenario files: the YAML description of a simulated fleet, validated strictly.

A scenario names the sites, the nodes and their GPU model, the runs and the
faults to inject.  Every model forbids unknown keys, so a typo is an error
naming the file and the key, never a silently ignored setting.  Names are
resolved by :func:`load_scenario`: a path, or the stem of a file shipped in
``gpufleet/sim/scenarios``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from gpufleet.sim.faults import FaultSpec
from gpufleet.sim.profiles import PROFILES
from gpufleet.sim.ranges import Range

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
DEFAULT_START = datetime(2026, 12, 1, 9, 30, 0, tzinfo=UTC)
#: Sampling intervals the simulator supports, s (real fleets: 100 ms to 30 s).
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 30.0


class ScenarioError(ValueError):
    """A scenario file is missing or malformed; the message names file and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SiteSpec(_Strict):
    site: str
    pue: float = Field(1.3, ge=1.0, le=3.0)
    price_per_kwh: float = Field(0.15, ge=0)
    gpu_hour_price: float = Field(2.5, ge=0)
    currency: str = "EUR"
    carbon_region: str | None = None
    #: Used when the region has no series in ``carbon``.
    carbon_g_per_kwh: float = Field(300.0, ge=0)


class CarbonSpec(_Strict):
    """An hourly carbon-intensity series: a daily swing around a mean, plus noise."""

    region: str
    mean_g_per_kwh: float = Field(gt=0)
    #: Peak-to-mean amplitude of the daily cycle, as a fraction of the mean.
    daily_swing: float = Field(0.25, ge=0, lt=1)
    #: Hour of day (UTC) of the highest intensity.
    peak_hour_utc: float = Field(19.0, ge=0, lt=24)
    #: Relative standard deviation of hour-to-hour noise.
    noise: float = Field(0.05, ge=0, lt=0.5)


class NodeGroupSpec(_Strict):
    """Identical nodes, named explicitly or ``prefix`` + two-digit index."""

    names: list[str] | None = Field(None, min_length=1)
    prefix: str | None = None
    count: int | None = Field(None, ge=1, le=512)
    gpu_model: str
    gpus: int = Field(8, ge=1, le=16)
    site: str
    cpu_count: int = Field(224, ge=1, le=4096)
    cpu_governor: Literal["performance", "powersave", "schedutil", "ondemand"] = "performance"
    #: Container/cgroup CPU quota in cores; None = no quota.
    cpu_quota_cores: float | None = Field(None, gt=0)
    #: CPUs the jobs' processes may run on: every CPU, only their GPU's NUMA node's, or only
    #: the other node's (a loader pinned to the wrong socket).
    job_cpus: Literal["all", "local", "remote"] = "all"
    #: An NFS mount holding the data sets: none, one that keeps up, or one that stalls
    #: (retransmissions, long backlog waits), as the agent's node checks would report it.
    nfs: Literal["none", "healthy", "stalled"] = "none"
    driver_version: str = "550.90.07"
    cuda_version: str = "12.4"
    #: Host power without GPUs at idle, W.
    host_idle_w: Range = (350.0, 450.0)
    #: Host power added at full CPU load, W.
    host_cpu_w: Range = (350.0, 500.0)
    #: Inlet air temperature of the GPUs, degC.
    inlet_temp_c: Range = (24.0, 30.0)
    #: Sequential bandwidth of the node's local storage, bytes/s.
    disk_read_bytes_s_max: Range = (1.5e9, 6.0e9)
    #: Background network traffic (monitoring, logging, remote data), bytes/s.
    net_rx_bytes_s: Range = (20e6, 150e6)
    net_tx_bytes_s: Range = (5e6, 40e6)

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v not in PROFILES:
            raise ValueError(f"unknown GPU model {v!r}; known: {', '.join(sorted(PROFILES))}")
        return v

    def node_names(self) -> list[str]:
        if self.names is not None:
            return list(self.names)
        assert self.prefix is not None and self.count is not None
        return [f"{self.prefix}{i:02d}" for i in range(1, self.count + 1)]


class WorkloadSpec(_Strict):
    """What a run does on its GPUs.

    ``training``: synchronous data-parallel steps; every step lasts as long
    as the slowest GPU's compute plus the all-reduce.  ``serving``: steady,
    low utilisation with an idle host (a hard negative for starvation).
    """

    kind: Literal["training", "serving"] = "training"
    #: Compute time of one step on a healthy GPU, s.
    step_s: Range = (0.6, 1.6)
    #: Share of a step spent in the all-reduce.
    comm_share: Range = (0.05, 0.12)
    #: Share of the compute bound by PCIe transfers (inputs, GPUDirect traffic).
    pcie_share: Range = (0.06, 0.15)
    #: Share of the compute bound by memory rather than SM clock.
    mem_bound_share: Range = (0.1, 0.25)
    sm_active: Range = (0.8, 0.92)
    tensor_active: Range = (0.35, 0.6)
    dram_active: Range = (0.3, 0.5)
    mem_used_fraction: Range = (0.7, 0.93)
    #: Host CPU the data loader uses when keeping up, % of all CPUs.
    loader_cpu_pct: Range = (8.0, 25.0)
    disk_read_bytes_s: Range = (50e6, 400e6)
    #: Model load and compilation at the start: GPUs idle then ramping, s.
    warmup_s: Range = (60.0, 180.0)
    #: Evaluation pauses (lower activity, no I/O burst); None = none.
    eval_period_s: Range | None = None
    eval_duration_s: Range = (20.0, 60.0)
    #: Share of time kernels run (``serving`` only).
    busy_fraction: Range = (0.15, 0.35)
    tokens_per_step: Range = (0.5e6, 4e6)
    #: Training FLOPs per token (6 x parameters), for MFU checks.
    flops_per_token: Range = (6 * 7e9, 6 * 70e9)


class RunSpec(_Strict):
    run_id: str = Field(min_length=1)
    name: str | None = None
    #: Default: the site of the first node.
    site: str | None = None
    start_s: float = Field(0.0, ge=0)
    #: None: runs until the end of the scenario (open in runs.csv).
    duration_s: float | None = Field(None, gt=0)
    nodes: list[str] = Field(min_length=1)
    #: GPU indices used on every node (default: all of them).
    gpus: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)
    team: str | None = None
    workload: WorkloadSpec = WorkloadSpec()


class Scenario(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    start_time: datetime = DEFAULT_START
    duration_s: float = Field(3600.0, gt=0)
    sample_interval_s: float = Field(1.0, ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    sites: list[SiteSpec] = Field(min_length=1)
    carbon: list[CarbonSpec] = Field(default_factory=list)
    nodes: list[NodeGroupSpec] = Field(min_length=1)
    runs: list[RunSpec] = Field(default_factory=list)
    faults: list[FaultSpec] = Field(default_factory=list)

    @field_validator("start_time")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("start_time needs a UTC offset, e.g. 2026-12-01T10:00:00Z")
        return v.astimezone(UTC)

    #: The file it was read from, for error messages (not part of the YAML).
    _source: str = PrivateAttr("<memory>")

    @property
    def source(self) -> str:
        return self._source


def scenario_names() -> list[str]:
    """Stems of the scenario files shipped with the simulator."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve_path(path_or_name: str | Path) -> Path:
    p = Path(path_or_name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    shipped = SCENARIO_DIR / f"{p.name}.yaml"
    if shipped.exists():
        return shipped
    raise ScenarioError(
        f"{path_or_name}: no such scenario file or shipped scenario (shipped: {', '.join(scenario_names())})"
    )


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Read, validate and cross-check a scenario. Raises :class:`ScenarioError`."""
    path = resolve_path(path_or_name)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ScenarioError(f"{path}: no such scenario file") from e
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: top level must be a mapping")
    raw.setdefault("name", path.stem)
    return parse_scenario(raw, source=str(path))


def parse_scenario(raw: dict[str, Any], source: str = "<memory>") -> Scenario:
    """Validate an already-parsed mapping (``source`` names it in errors)."""
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(_describe(e, raw, source)) from e
    sc._source = source
    from gpufleet.sim.crosscheck import crosscheck

    problems = crosscheck(sc)
    if problems:
        raise ScenarioError("\n".join(f"{source}: {key}: {msg}" for key, msg in problems))
    return sc


def _describe(e: ValidationError, raw: Any, source: str) -> str:
    lines = []
    for err in e.errors():
        lines.append(f"{source}: {loc_to_key(err['loc'], raw)}: {err['msg']}")
    return "\n".join(lines)


def loc_to_key(loc: tuple[Any, ...], raw: Any) -> str:
    """``('faults', 2, 'power_cap', 'limit_w')`` -> ``faults[2].limit_w``.

    Walks the raw data alongside so that the union tag pydantic inserts
    (the fault's ``kind``) is left out of the key a user has to look for.
    """
    key = ""
    node = raw
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            continue
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            continue
        key += f".{part}" if key else str(part)
        node = node.get(part) if isinstance(node, dict) else None
    return key or "(top level)"
