"""Every detector threshold in one place, with the reasoning behind each default.

Durations are seconds of wall-clock time, never sample counts: fleets sample
anywhere from every 100 ms to every 30 s.  "Activity" is the 0-1 busy signal of
:mod:`gpufleet.collector.detectors.frame`: ``max(sm_active, dram_active)`` where DCGM
profiling fields exist, else ``min(util, power-derived activity)`` on
NVML-only GPUs.

Every field is a setting of the one settings model
(:class:`gpufleet.config.DetectSettings` extends this class), so a deployment
sets any threshold in its YAML under ``detect:`` or as
``GPUFLEET_DETECT__<FIELD>``, checked at start with an error naming the field;
the live sweep and ``gpufleet replay --config`` use the same values.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A share or fraction, 0-1.
Share = Annotated[float, Field(ge=0.0, le=1.0)]
#: A strictly positive amount (seconds, MHz, bytes/s, a ratio above zero).
Positive = Annotated[float, Field(gt=0.0)]
#: A non-negative amount.
NonNegative = Annotated[float, Field(ge=0.0)]
#: A percentage, 0-100.
Percent = Annotated[float, Field(ge=0.0, le=100.0)]
Count = Annotated[int, Field(ge=1)]


class DetectorConfig(BaseModel):
    """Detector thresholds (immutable: one instance serves a whole sweep)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- activity signal --------------------------------------------------
    #: Activity at or above this counts as busy (a kernel workload is running).
    busy_activity: Share = 0.3
    #: Activity at or below this counts as idle.  Between the two the previous
    #: state holds (hysteresis), so noise around one level is not a cycle.
    idle_activity: Share = 0.15
    #: NVML-only GPUs: board power as a fraction of the enforced limit that
    #: maps to activity 0.  An idle H100 draws ~70 W of 700 W with no context,
    #: but ~145 W with a job's memory resident and ~150-160 W while NCCL spins
    #: waiting for a peer (measured on 8xH100 DDP traces): still no work.
    power_idle_frac: Share = 0.2
    #: ... and to activity 1.  ``util_pct`` is capped by this power activity,
    #: because GPU-Util stays at 100 % while collective kernels merely spin.
    power_busy_frac: Share = 0.6
    #: Without an enforced limit or a known model, a GPU's reference power is
    #: this percentile of its power in the window (median over its run's GPUs).
    power_ref_percentile: Percent = 98.0
    #: ... trusted only when it is at least this many times the idle level
    #: (5th percentile): power that never rose cannot tell spinning from work.
    power_ref_min_ratio: Positive = 1.8
    #: An interval longer than this many typical sampling intervals is a gap:
    #: it is not counted as time of either state and breaks phases.
    gap_factor: Positive = 3.0
    #: Sampling interval assumed for a series with a single sample, seconds.
    fallback_dt_s: Positive = 1.0
    #: A GPU-scoped condition is reported only while seen this recently
    #: (or within ``active_within_samples`` sampling intervals, whichever is longer), seconds.
    active_within_s: Positive = 60.0
    active_within_samples: Count = 3
    #: Slack at a stretch's edges, in sampling intervals: samples of GPUs on
    #: different clocks, and a stretch's first or last sample, are this far off.
    edge_samples: Positive = 2.0
    #: Share of a stretch's samples that puts a GPU in a role (spinning, blocked,
    #: degraded): the majority.
    majority_share: Share = 0.5

    # --- runs ---------------------------------------------------------------
    #: Run start-up (model load, compilation, first batches) is ignored for at
    #: most this long after the run starts, seconds ...
    warmup_max_s: NonNegative = 300.0
    #: ... or until a GPU has been busy continuously this long, seconds.
    warmup_busy_s: Positive = 30.0

    # --- starvation ---------------------------------------------------------
    #: Oscillation needs at least this many complete idle phases in a row.
    starve_min_cycles: Count = 3
    #: Longest cycle still called starvation, seconds.  Slower periodic pauses
    #: are checkpoints or evaluations, not a data pipeline falling behind.
    starve_max_period_s: Positive = 90.0
    #: Highest busy share (duty cycle) of an oscillating GPU still starving;
    #: short evaluation pauses leave the duty cycle above it.
    starve_max_duty: Share = 0.8
    #: Lowest duty cycle of an oscillation: below it the GPUs are mostly idle
    #: with brief bursts, which is reported only as a steady-low pattern.
    starve_min_duty: Share = 0.1
    #: Smallest busy-minus-idle activity difference of an oscillation.
    starve_min_depth: Share = 0.3
    #: Cycle lengths may vary by this much (median absolute deviation over
    #: median) and still count as one oscillation.
    starve_max_period_cv: Positive = 0.5
    #: Smallest share of GPU time lost to idling worth reporting.
    starve_min_lost_share: Share = 0.2
    #: Steady pattern: mean activity at or below this counts as starved ...
    starve_low_activity: Share = 0.5
    #: ... over at least this long, seconds.  Without a saturated host a
    #: steady low-activity job is simply a small job and is not reported.
    starve_min_duration_s: Positive = 120.0
    #: The episode is dated from the earliest time after which activity was
    #: below ``starve_low_activity`` for this share of the time.
    starve_low_share: Share = 0.6
    #: Share of the run's GPUs that must show the pattern.
    starve_min_gpu_share: Share = 0.75
    #: A GPU of the run busy at least this share of the time holds the others
    #: back (straggler) rather than all of them waiting for input.
    starve_busy_gpu_share: Share = 0.9
    #: Reference activity of a well-fed GPU, for ``gpu_time_lost_share``.
    nominal_activity: Share = 0.8
    #: Busy and idle phases of an oscillation are told apart within each GPU's own
    #: activity range (5th to 95th percentile): idle at or below this share of it,
    #: busy at or above ``starve_phase_hi`` (coarse samples average a short idle
    #: phase with busy time, so an idle sample at 10 s may read 0.2, not 0).
    starve_phase_lo: Share = 0.3
    starve_phase_hi: Share = 0.7
    #: Cycles of one chain follow one another at half to twice its period ...
    starve_chain_ratio: Positive = 2.0
    #: ... and the last began at most this many periods before the window's end.
    starve_recent_periods: Positive = 2.0
    #: Lost share at which starvation is critical.
    starve_critical_lost_share: Share = 0.5

    # --- host pressure (starvation cause) ----------------------------------
    #: All-CPU user time at or above this is a saturated CPU, percent.
    cpu_saturated_pct: Percent = 80.0
    #: iowait at or above this is an I/O-bound host, percent.
    iowait_high_pct: Percent = 15.0
    #: Busiest disk %util at or above this ...
    disk_util_high_pct: Percent = 80.0
    #: ... together with await at or above this is a saturated disk, ms.
    disk_await_high_ms: NonNegative = 20.0

    # --- the job's own cgroup (starvation cause, before the host-wide figures) --
    #: CPU used at or above this share of the job's quota is a loader at its quota.
    job_at_quota_share: Share = 0.9
    #: Throttled in at least this share of CFS periods: the quota holds the job back.
    job_throttled_high_share: Share = 0.25
    #: Some task of the job waiting for CPU at least this share of the time, percent.
    job_cpu_pressure_high_pct: Percent = 30.0
    #: Some task of the job waiting for I/O at least this share of the time, percent.
    job_io_pressure_high_pct: Percent = 20.0

    # --- checkpoint stall -----------------------------------------------------
    #: Shortest job-wide pause counted, seconds, or ``ckpt_min_pause_samples``
    #: sampling intervals where that is longer.  Pauses are judged by what they
    #: cost, not by their length: a job that checkpoints every few steps pauses
    #: for 1-5 s at a time and may lose a quarter of its GPU time that way.
    ckpt_min_pause_s: Positive = 1.0
    #: ... a pause must span at least this many samples (one idle sample is noise).
    ckpt_min_pause_samples: Count = 2
    #: A GPU whose board power falls to at most this share of its own busy level
    #: (the mean of the upper half of its power while busy, in this window) is
    #: paused, whatever its GPU-Util says: ranks spinning in a collective keep
    #: GPU-Util at 100 %, and on many boards (older and consumer cards) they
    #: draw half their training power, far above the idle fraction of the limit.
    ckpt_pause_power_share: Share = 0.65
    #: Job-wide pauses with a write burst needed in the window.  One suffices
    #: by default: checkpoints every 10-30 min rarely show twice in a window,
    #: and the write burst is what tells them from evaluation pauses.
    ckpt_min_pauses: Count = 1
    #: Share of the run's GPUs that must be paused together for a job-wide pause.
    ckpt_min_gpu_share: Share = 0.75
    #: A GPU at or below this activity is paused (idle, or spinning in a
    #: collective: NCCL keeps ~0.18 of the SMs "active" doing no work).
    ckpt_pause_activity: Share = 0.25
    #: Busy share of the run's time between pauses: a job that mostly idles
    #: has no checkpoint stalls to find.
    ckpt_min_busy_share: Share = 0.5
    #: Blocked-rank signature: a kernel is resident at GPU-Util at least this ...
    ckpt_spin_util_pct: Percent = 50.0
    #: ... or, without GPU-Util, SM activity at least this.
    ckpt_spin_sm_active: Share = 0.05
    #: At most this share of the run's ranks may block (one at least), and at
    #: most one per node (a writer is rank 0, or local rank 0 of each node; a
    #: whole node that blocks is a node's loader starving, not a writer) ...
    ckpt_max_blocker_share: Share = 0.25
    #: ... and the same rank must block in this share of the pauses.
    ckpt_min_same_writer: Share = 0.6
    #: Write rate during pauses at least this many times the rate while busy ...
    ckpt_write_ratio: Positive = 3.0
    #: ... and at least this high, bytes/s.
    ckpt_min_write_bytes_s: NonNegative = 20e6
    #: Pause spacing may vary by this much (MAD over median).
    ckpt_max_period_cv: Positive = 0.35
    #: Sharded checkpoints (every rank copies its shard to the host at once, no
    #: rank spinning): the ranks' PCIe transmit during the pauses at least this
    #: many times their receive (a device-to-host copy is one-sided; input
    #: loading and optimizer offload receive as much or more) ...
    ckpt_d2h_ratio: Positive = 3.0
    #: ... and at least this much per GPU, bytes/s (a checkpoint moves
    #: gigabytes; idle GPUs move kilobytes).
    ckpt_min_d2h_bytes_s: NonNegative = 50e6
    #: Smallest share of the run's time lost to pauses worth reporting.
    ckpt_min_lost_share: Share = 0.03
    #: Lost share at which a checkpoint stall is critical.
    ckpt_critical_lost_share: Share = 0.25
    #: The next checkpoint is expected within this many periods (its incident's
    #: hold-off, and how long after the last pause a periodic pattern still counts).
    ckpt_hold_periods: Positive = 1.5

    # --- idle allocation --------------------------------------------------------
    #: A run's GPUs doing no work this long are an idle allocation, seconds: past
    #: any model load, evaluation or checkpoint pause, and a notebook or a dead
    #: loader worth a person's look (Slurm job monitors flag GPUs idle for 10 min+).
    idle_min_s: Positive = 600.0
    #: No work: GPU-Util at most this (no kernel ran in the driver's sample
    #: period; a monitoring probe's blips stay below it), percent ...
    idle_util_pct: Percent = 5.0
    #: ... or, without GPU-Util, SM activity at most this.
    idle_sm_active: Share = 0.02
    #: Share of the stretch that must read idle: an ``nvidia-smi`` or a probe
    #: waking the GPU for a sample does not end an idle allocation.
    idle_min_share: Share = 0.95

    # --- hung collective ---------------------------------------------------------
    #: Every working rank spinning with no progress this long is a hang, seconds:
    #: a checkpoint's waiting ranks spin for seconds to a couple of minutes, and
    #: NCCL's own watchdog waits 10 to 30 minutes before it aborts.
    hung_min_s: Positive = 300.0
    #: Spinning: a kernel resident (GPU-Util at least this, percent) ...
    hung_util_pct: Percent = 90.0
    #: ... doing no work: SM activity at most this where DCGM reports it (NCCL
    #: keeps ~0.18 of the SMs "active" while it polls) ...
    hung_max_sm_active: Share = 0.3
    #: ... and board power at most this fraction of the GPU's reference (its
    #: limit, its model's board power, or its run's busy level): an H100
    #: spinning draws ~110-160 W of 700 W, a V100 ~60 W of 300 W.
    hung_max_power_frac: Share = 0.3
    #: Where no reference exists (no limit, model or busy history), power at most
    #: this many times the idle power of the run's ranks that run nothing is
    #: idle-level (spinning: 1.3-1.8 times idle on H100, A100, V100 and A10;
    #: training: 3 times and more); an idle allocation's peers must draw more
    #: than this to count as working.
    hung_idle_power_ratio: Positive = 2.0
    #: Share of the stretch each rank must read spinning (or dead).
    hung_min_share: Share = 0.9
    #: At least this share of the run's GPUs must spin (one at least): a run
    #: whose GPUs all run nothing is idle, not hung.
    hung_min_spinning_share: Share = 0.5

    # --- straggler ------------------------------------------------------------
    #: Features are compared over the last this many seconds of the run.
    straggler_eval_s: Positive = 180.0
    #: The GPU must have been busy at least this long in that span, seconds.
    straggler_min_busy_s: NonNegative = 60.0
    #: Robust z-score (median / 1.4826 MAD of the run's GPUs) of an outlier.
    straggler_z: Positive = 3.5
    #: ... and the relative gap to the peers' median it must also reach
    #: (power limit, SM clock), so silicon variation is not flagged.
    straggler_min_rel: Share = 0.07
    #: Peers are waiting when the straggler's activity or power fraction
    #: exceeds theirs by at least this much.
    straggler_wait_gap: Share = 0.05
    #: Without an enforced limit, a GPU's busy power plateau is this
    #: percentile of its power while busy; a cap shows as a lower plateau.
    straggler_plateau_percentile: Percent = 90.0
    #: A plateau at least this much below the peers', at GPU-Util within
    #: ``straggler_same_util_pct`` of theirs, is a capped straggler even
    #: where the peers' waits do not show (coarse samples average them away).
    straggler_plateau_min_rel: Share = 0.1
    #: ... and only while at most this share of the run's GPUs (one at least)
    #: sits at such a low plateau: many low GPUs are the run's spread (a node
    #: throttled as a whole, the faster GPUs waiting), not one capped GPU.
    straggler_plateau_max_share: Share = 0.2
    straggler_same_util_pct: Percent = 5.0
    #: Reason bits the peers show at most this share of their busy time are the straggler's own.
    straggler_peer_bits_share: Share = 0.05
    #: Gap of activity or power fraction over the peers at which a straggler is critical.
    straggler_critical_gap: Share = 0.3
    #: Unexplained straggler: activity above the peers' by at least this much.
    straggler_unknown_gap: Share = 0.25
    #: Out of the peers' wait rhythm: mean power this robust z above the
    #: peers' (a weaker outlier than ``straggler_z``, confirmed by timing).  At
    #: 2.0 the busiest GPU of a healthy real 8-GPU run (z 2.15, its peers' power
    #: rising and falling with their shared compute phases) was called one ...
    straggler_decoupled_z: Positive = 3.0
    #: ... while the peers' power moves together (median correlation of each
    #: peer with the mean of the others at least this: they all wait on one
    #: GPU, for as long as it takes) ...
    straggler_peer_corr: Share = 0.25
    #: ... and the GPU's own correlation with them at least this much lower
    #: and at most ``straggler_max_corr``: it does not move with them (a
    #: GPU swinging with the whole run, only less deeply, is not out of it).
    straggler_corr_gap: Share = 0.25
    straggler_max_corr: Share = 0.15
    #: ... and, where samples resolve the waits (the peers dip, a kernel resident at
    #: power at most ``straggler_dip_power_share`` of their own busy level, at least
    #: this share of the time), it dips that much less than they do: the waits
    #: themselves, not only their rhythm.  A healthy run's busiest GPU dips as
    #: often as the others.
    straggler_peer_wait_excess: Share = 0.05
    straggler_dip_power_share: Share = 0.85
    #: Share of busy time with thermal bits that marks a hot GPU.
    straggler_thermal_share: Share = 0.2
    #: A mean temperature at or above this (and robustly above peers) is hot, degC.
    straggler_hot_temp_c: NonNegative = 80.0

    # --- the network (a cause for stragglers and slow or hung collectives) -----
    #: Packets dropped or discarded on a node's links in the window that implicate them.
    fabric_min_lost_packets: Count = 100
    #: A link is saturated when its median utilisation over the window is at least this, percent ...
    fabric_saturated_pct: Percent = 80.0
    #: ... and saturated links implicate a run's collectives when this share of its nodes has one.
    fabric_saturated_nodes_share: Share = 0.5

    # --- throttling -----------------------------------------------------------
    #: SM clock below this fraction of the maximum counts as held down.
    throttle_clock_ratio: Share = 0.9
    #: Share of busy time since the episode began that must be throttled.
    throttle_min_share: Share = 0.5
    #: Throttled busy time needed to report, seconds.
    throttle_min_s: Positive = 60.0
    #: Without a reason bitmask: power within this fraction of the limit is a
    #: power cap ...
    throttle_infer_power_frac: Share = 0.95
    #: ... and a temperature at or above this a thermal limit, degC.
    throttle_infer_temp_c: NonNegative = 85.0
    #: A clock held below this fraction of its maximum makes throttling critical.
    throttle_critical_clock_ratio: Share = 0.6

    # --- PCIe -------------------------------------------------------------------
    #: Share of busy time since the episode began with a degraded link.
    pcie_min_share: Share = 0.5
    #: Degraded busy time needed to report, seconds.
    pcie_min_s: Positive = 60.0

    # --- NVLink -----------------------------------------------------------------
    #: Links counted down: fewer up than the GPU has (``nvlink_links_max``; without
    #: it, than the most any GPU of its node shows) for at least this long, seconds.
    #: A link that retrains after an error is back within seconds; one down for a
    #: minute stays down until someone resets or reseats it.
    nvlink_down_min_s: Positive = 60.0
    #: ... and for at least this share of the time since the episode began.
    nvlink_down_min_share: Share = 0.5
    #: A busy GPU of a multi-GPU run whose NVLink traffic averages at most this
    #: (bytes/s, transmit and receive averaged) moves next to nothing over NVLink.
    #: Healthy data-parallel training on H100/A100 averages tens of GB/s per GPU
    #: even at a 5 % communication share; 1 GB/s is ten times below the lowest
    #: healthy level and far above the idle trickle.
    nvlink_floor_bytes_s: NonNegative = 1e9
    #: ... or at most this share of its run peers' on the same node (median).
    nvlink_peer_ratio: Share = 0.2
    #: Either counts only while its PCIe carries collective-like traffic, transmit
    #: AND receive each averaging at least this (bytes/s): an all-reduce moves as
    #: much in as out, several GB/s when it crosses PCIe, while input loading
    #: (mostly receive) and checkpoints (mostly transmit) are one-sided and far
    #: slower.  Without it, GPUs that simply do not talk (inference replicas)
    #: would read as a broken fabric.
    nvlink_fallback_pcie_bytes_s: NonNegative = 1e9
    #: Busy time in the run region needed for the bandwidth judgement, seconds.
    nvlink_min_busy_s: Positive = 120.0
    #: NVLink CRC plus replay errors per minute (over the window's readings) that
    #: mark a marginal link: healthy links count none for days ...
    nvlink_errors_per_min: Positive = 1.0
    #: ... and at least this many in the window, so one burst is not a trend.
    nvlink_min_errors: Count = 10
    #: Link recoveries (a link retrained under traffic) in the window that count on their own.
    nvlink_min_recoveries: Count = 1

    # --- GPU memory and bus health -----------------------------------------------
    #: Correctable (single-bit) ECC errors per hour that mark degrading memory.
    #: Healthy HBM logs a handful a month; the driver's own "high single-bit
    #: error rate" event (XID 92) fires far above this.
    ecc_sbe_per_h: Positive = 60.0
    #: ... and at least this many in the window.
    ecc_sbe_min_errors: Count = 10
    #: PCIe replays per minute that mark a marginal link (DCGM's PCIe health
    #: watch uses 8 per minute) ...
    pcie_replay_per_min: Positive = 8.0
    #: ... and at least this many in the window (two minutes at that rate).
    pcie_replay_min_count: Count = 16
    #: An uncorrectable error keeps its incident open this long after the last
    #: one, seconds: the counter rises once, the board stays suspect.
    uncorrectable_hold_s: NonNegative = 3600.0

    # --- host misconfiguration ------------------------------------------------
    #: CPU frequency governors that cap a training host.
    bad_governors: tuple[str, ...] = ("powersave",)
    #: CPU cores of quota needed per GPU on the node.
    min_cores_per_gpu: NonNegative = 1.0
    #: NFS: an RPC retransmitted or timed out (a TCP mount waits ``timeo``, 60 s, for each),
    #: or a mean backlog wait per RPC at least this long, is a stalling mount, ms ...
    nfs_stall_queue_ms: NonNegative = 50.0
    #: ... or a mean round trip at least this long, ms ...
    nfs_stall_rtt_ms: NonNegative = 100.0
    #: ... judged only over an interval with at least this many RPCs.
    nfs_min_ops: Count = 10
    #: XID events on one GPU within the window that count as repeated.
    xid_min_events: Count = 2
    #: XID codes never counted.
    xid_ignore: tuple[int, ...] = ()

    @model_validator(mode="after")
    def _ordered(self) -> DetectorConfig:
        if not self.idle_activity < self.busy_activity:
            raise ValueError("idle_activity must be below busy_activity (the hysteresis band)")
        if not self.power_idle_frac < self.power_busy_frac:
            raise ValueError("power_idle_frac must be below power_busy_frac")
        if self.gap_factor <= 1:
            raise ValueError("gap_factor must exceed 1 (a gap is longer than the typical interval)")
        if not self.starve_min_duty < self.starve_max_duty:
            raise ValueError("starve_min_duty must be below starve_max_duty")
        return self
