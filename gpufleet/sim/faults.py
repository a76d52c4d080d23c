"""The injectable faults, one pydantic model per kind (``kind`` selects it).

Every numeric parameter is a range drawn per seed, with defaults chosen so the
fault is clearly present (a power cap that binds, a thermal rise that reaches
the limit) but never the same number twice.  Times are seconds from the
scenario start; ``end_s`` None means "until the end of the scenario".
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.sim.ranges import Range


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_s: float = Field(0.0, ge=0)
    end_s: float | None = Field(None, gt=0)
    #: Free text shown in labels; what the fault stands for.
    note: str | None = None

    @model_validator(mode="after")
    def _window(self) -> _Fault:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s {self.end_s} must be after start_s {self.start_s}")
        return self


class _GpuTarget(_Fault):
    """A fault on GPUs: all of a run's, a node's, or a seeded pick of them."""

    run_id: str | None = None
    node: str | None = None
    #: GPU indices on ``node`` (only with ``node``).
    gpus: list[Annotated[int, Field(ge=0)]] | None = None
    #: Choose this many GPUs at random (by seed) among the run's or node's.
    pick: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _target(self) -> _GpuTarget:
        if (self.run_id is None) == (self.node is None):
            raise ValueError("give exactly one of run_id or node")
        if self.gpus is not None and self.node is None:
            raise ValueError("gpus needs node (use pick to choose among a run's GPUs)")
        if self.gpus is not None and self.pick is not None:
            raise ValueError("give gpus or pick, not both")
        return self


class _RunTarget(_Fault):
    """A fault on a whole run (optionally only its GPUs on some nodes)."""

    run_id: str
    #: Restrict to the run's GPUs on these nodes (default: all its nodes).
    nodes: list[str] | None = None


class StarvationCpu(_RunTarget):
    """Data loader CPU-bound: host user CPU saturated, GPUs sawtooth busy/idle."""

    kind: Literal["starvation_cpu"]
    #: Sawtooth period: one busy stretch plus one wait for input, s.
    period_s: Range = (8.0, 40.0)
    #: Share of each period the GPUs compute.
    duty: Range = (0.3, 0.7)
    cpu_user_pct: Range = (95.0, 99.5)
    #: The host side of the step rather than the loader: an optimizer stepping on the CPU
    #: (ZeRO-Offload) or an all-reduce on a CPU backend.  Every step the GPUs idle while the host
    #: works, gradients going out and parameters coming back over PCIe in equal measure.
    offload: bool = False


class StarvationIo(_RunTarget):
    """Data loader I/O-bound: iowait high, disk saturated, GPUs sawtooth."""

    kind: Literal["starvation_io"]
    period_s: Range = (8.0, 40.0)
    duty: Range = (0.3, 0.7)
    cpu_iowait_pct: Range = (25.0, 60.0)
    disk_await_ms: Range = (40.0, 250.0)
    disk_util_pct: Range = (97.0, 100.0)


class CheckpointStall(_RunTarget):
    """Every ``period_s`` the run stops ``duration_s`` while its state is written.

    ``writer``: rank 0 writes (no kernel) while the other ranks spin in the
    next collective waiting for it (GPU-Util ~100 %, idle power): a plain
    ``torch.save`` on rank 0.  ``sharded``: every rank copies its shard to the
    host and writes it at once (FSDP / distributed checkpointing): all ranks
    idle together, each with a device-to-host PCIe burst."""

    kind: Literal["checkpoint_stall"]
    mode: Literal["writer", "sharded"] = "writer"
    period_s: Range = (300.0, 900.0)
    duration_s: Range = (25.0, 90.0)
    #: Delay of the first stall after training starts (default: one period).
    first_after_s: Range | None = None
    disk_write_bytes_s: Range = (1.0e9, 3.0e9)
    net_tx_bytes_s: Range = (0.4e9, 1.5e9)


class IdleAllocation(_RunTarget):
    """The run holds GPUs that do no work: all of them (a notebook left open, a job whose data
    loader died while the process lives on) or ``pick`` of them (a job that asked for 8 and uses 6)."""

    kind: Literal["idle_allocation"]
    #: Idle this many of the run's GPUs, chosen by seed (default: all of them).
    pick: int | None = Field(None, ge=1)


class HungCollective(_RunTarget):
    """A rank dies or blocks and every other rank spins in the collective waiting for it until
    the timeout: GPU-Util ~100 %, idle power, near-zero SM activity, no progress."""

    kind: Literal["hung_collective"]
    #: Ranks that died or blocked (no kernel at all), chosen by seed; 0: every rank spins.
    dead_ranks: int = Field(1, ge=0)


class PowerCap(_GpuTarget):
    """An enforced power limit below what the workload would draw."""

    kind: Literal["power_cap"]
    #: Limit in W; when absent, ``limit_fraction`` of the board TDP.
    limit_w: Range | None = None
    limit_fraction: Range = (0.4, 0.6)


class Thermal(_GpuTarget):
    """Cooling fault: inlet/heatsink temperature raised, clocks pulled down."""

    kind: Literal["thermal"]
    #: Rise of the temperature the GPU settles at, degC.  Above about 48 the
    #: SW controller cannot hold the limit and HW thermal slowdown engages.
    temp_rise_c: Range = (30.0, 42.0)


class HwSlowdown(_GpuTarget):
    """HW slowdown asserted (bit 0x8): clocks cut by half or more."""

    kind: Literal["hw_slowdown"]
    clock_factor: Range = (0.35, 0.5)


class PowerBrake(_GpuTarget):
    """External power brake asserted (bit 0x80), e.g. by the PSU."""

    kind: Literal["power_brake"]
    clock_factor: Range = (0.2, 0.45)


class ClockLock(_GpuTarget):
    """SM clock locked below maximum (``nvidia-smi -lgc``); no throttle reason."""

    kind: Literal["clock_lock"]
    clock_fraction: Range = (0.6, 0.8)


class PcieDegraded(_GpuTarget):
    """The link trained at a lower generation and/or width than its maximum."""

    kind: Literal["pcie_degraded"]
    #: Generation to run at; None with ``width`` None: chosen by seed.
    gen: int | None = Field(None, ge=1, le=6)
    width: Literal[1, 2, 4, 8, 16] | None = None


class Xid(_GpuTarget):
    """XID errors reported ``count`` times at random moments in the window."""

    kind: Literal["xid"]
    codes: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [79, 48, 63], min_length=1)
    count: Range = (3.0, 8.0)


class NvlinkDown(_GpuTarget):
    """NVLink links of a GPU go down (a bad cable/bridge, a link that failed
    training).  The collective's ring is paced by the slowest GPU, so the
    whole run's all-reduce slows by the share of bandwidth lost; with every
    link down the GPU's collectives cross PCIe."""

    kind: Literal["nvlink_down"]
    #: Links down; at or above the board's link count: all of them.
    links_down: Range = (2.0, 8.0)


class NvlinkFallback(_GpuTarget):
    """Links stay up but carry no traffic: NVLink peer access is unavailable
    (the fabric manager is not running, P2P disabled), so NCCL moves the
    collectives over PCIe and through host memory."""

    kind: Literal["nvlink_fallback"]


class NvlinkErrors(_GpuTarget):
    """A marginal link: CRC errors and the replays they cause keep rising
    (links stay up; a retraining recovery now and then)."""

    kind: Literal["nvlink_errors"]
    crc_per_s: Range = (0.5, 20.0)
    replay_per_s: Range = (0.1, 4.0)
    recovery_per_h: Range = (0.0, 2.0)


class EccSbe(_GpuTarget):
    """Degrading HBM: correctable (single-bit) ECC errors at a high rate."""

    kind: Literal["ecc_sbe"]
    sbe_per_h: Range = (300.0, 3000.0)


class EccDbe(_GpuTarget):
    """Uncorrectable (double-bit) ECC errors at ``count`` moments: each
    raises the volatile and aggregate DBE counters, remaps a row (pending
    until the GPU is reset) and logs XID 48 then XID 63."""

    kind: Literal["ecc_dbe"]
    count: Range = (1.0, 3.0)


class RowRemapFailure(_GpuTarget):
    """A remap finds no spare row left: the failure flag is set (XID 64)."""

    kind: Literal["row_remap_failure"]


class PcieReplay(_GpuTarget):
    """A marginal PCIe link: the replay (retransmission) counter climbs."""

    kind: Literal["pcie_replay"]
    replays_per_min: Range = (20.0, 300.0)


class CounterReset(_GpuTarget):
    """Driver reload at ``start_s``: energy and ECC counters restart from 0.

    The agent sees no GPU for ``gap_s`` while the driver loads.
    """

    kind: Literal["counter_reset"]
    gap_s: Range = (5.0, 30.0)


class SampleGap(_Fault):
    """The node's agent is down: no GPU or host samples in the window."""

    kind: Literal["sample_gap"]
    node: str


FaultSpec = Annotated[
    StarvationCpu
    | StarvationIo
    | CheckpointStall
    | IdleAllocation
    | HungCollective
    | PowerCap
    | Thermal
    | HwSlowdown
    | PowerBrake
    | ClockLock
    | PcieDegraded
    | Xid
    | CounterReset
    | SampleGap
    | NvlinkDown
    | NvlinkFallback
    | NvlinkErrors
    | EccSbe
    | EccDbe
    | RowRemapFailure
    | PcieReplay,
    Field(discriminator="kind"),
]

#: Faults that act on GPU clocks (a subset of a synchronous run => straggler).
CLOCK_FAULTS = ("power_cap", "thermal", "hw_slowdown", "power_brake", "clock_lock")
#: Faults on NVLink and on memory/bus health (GPU-scoped, timeline-independent of runs).
NVLINK_FAULTS = ("nvlink_down", "nvlink_fallback", "nvlink_errors")
HEALTH_FAULTS = ("ecc_sbe", "ecc_dbe", "row_remap_failure", "pcie_replay")
