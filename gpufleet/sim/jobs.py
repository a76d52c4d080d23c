"""Each job's own cgroup on each node: the ``job_*`` GPU columns.

A run's processes on a node live in one cgroup (the job's container), whose
figures the agent puts on every GPU that cgroup feeds
(:mod:`gpufleet.agent.jobstats`).  The numbers follow from what the run asks
of the node this tick (:class:`JobDemand`, laid out by
:mod:`gpufleet.sim.workload`) and from the node's container CPU
quota (``cpu_quota_cores``):

* CPU used is the demand, held to the quota where there is one; a loader
  that wants more than its quota is throttled in most CFS periods and its
  tasks wait for CPU (pressure), while the host-wide CPU stays low;
* a CPU-bound loader without a quota wants more than the whole host: some
  of its tasks always wait (pressure), none is throttled (no quota);
* an I/O-bound loader's tasks wait on the disk (I/O pressure, about as high
  as the iowait it causes), and checkpoint writes add I/O pressure while
  they last.

GPUs no run holds have no processes and so no cgroup: NULL.  The noise has a
random stream of its own, so the other columns of a scenario stay the same
numbers whether or not these are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.sim.plan import NodePlan

#: A CPU-bound loader without a quota asks for this many times the host's CPUs.
CPU_BOUND_DEMAND = 1.6
#: A loader held to its quota uses this share of it (CFS enforces per period).
QUOTA_USED_SHARE = 0.985
#: Throttled share of CFS periods at a given demand-to-quota ratio: none
#: below LO, rising to MAX at HI (a loader well over its quota).
THROTTLE_LO, THROTTLE_HI, THROTTLE_MAX = 0.85, 1.25, 0.93
#: CPU and I/O pressure of a job that is not short of either, %.
BASE_CPU_PRESSURE_PCT = 0.4
BASE_IO_PRESSURE_PCT = 0.2
#: I/O pressure per % of iowait an I/O-bound loader causes.
IO_PRESSURE_PER_IOWAIT = 1.5
#: I/O pressure while a checkpoint is written, %.
CKPT_IO_PRESSURE_PCT = 45.0

JOB_COLUMNS = (
    "job_cpu_cores",
    "job_cpu_quota_cores",
    "job_cpu_throttled_share",
    "job_cpu_pressure_pct",
    "job_io_pressure_pct",
)


@dataclass
class JobDemand:
    """What one run asked of one node this tick."""

    node: int
    #: The run's GPUs on that node (fleet GPU indexes).
    gpu_idx: np.ndarray
    #: CPU the loader would use if nothing held it back, cores.
    cpu_cores: float
    #: ``cpu`` or ``io`` while the loader starves the GPUs, else None.
    starving: str | None = None
    #: iowait the starving I/O-bound loader causes, % (starving == "io").
    iowait_pct: float = 0.0
    #: Share of the tick a checkpoint was written.
    ckpt_share: float = 0.0


class JobModel:
    """Per-node quotas and a noise stream of their own."""

    def __init__(self, nodes: list[NodePlan], seed: int) -> None:
        self.quota = np.array([np.nan if n.cpu_quota_cores is None else n.cpu_quota_cores for n in nodes])
        self.cpu_count = np.array([n.cpu_count for n in nodes], dtype=np.float64)
        self._noise = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, 0x10B5]))

    def metrics(self, jobs: list[JobDemand], n_gpus: int) -> dict[str, np.ndarray]:
        out = {c: np.full(n_gpus, np.nan) for c in JOB_COLUMNS}
        for job in jobs:
            z = self._noise.standard_normal(4)
            k = job.node
            quota = float(self.quota[k])
            host = float(self.cpu_count[k])
            demand = job.cpu_cores
            if job.starving == "cpu":
                demand = CPU_BOUND_DEMAND * host
            supply = min(quota, host) if np.isfinite(quota) else host
            used = min(demand, QUOTA_USED_SHARE * supply) * (1.0 + 0.004 * z[0])
            throttled = np.nan
            if np.isfinite(quota):
                ratio = demand / quota
                throttled = THROTTLE_MAX * float(
                    np.clip((ratio - THROTTLE_LO) / (THROTTLE_HI - THROTTLE_LO), 0, 1)
                )
                throttled = float(np.clip(throttled + (0.01 * abs(z[1]) if throttled > 0 else 0.0), 0.0, 1.0))
            short = max(0.0, 1.0 - supply / demand) if demand > 0 else 0.0
            cpu_pressure = BASE_CPU_PRESSURE_PCT + 100.0 * short + 0.3 * abs(z[2])
            io_pressure = BASE_IO_PRESSURE_PCT + CKPT_IO_PRESSURE_PCT * job.ckpt_share + 0.1 * abs(z[3])
            if job.starving == "io":
                io_pressure = max(io_pressure, IO_PRESSURE_PER_IOWAIT * job.iowait_pct * (1.0 + 0.03 * z[3]))
            i = job.gpu_idx
            out["job_cpu_cores"][i] = round(max(used, 0.0), 3)
            out["job_cpu_quota_cores"][i] = quota
            out["job_cpu_throttled_share"][i] = round(throttled, 4) if np.isfinite(throttled) else np.nan
            out["job_cpu_pressure_pct"][i] = round(float(np.clip(cpu_pressure, 0.0, 100.0)), 2)
            out["job_io_pressure_pct"][i] = round(float(np.clip(io_pressure, 0.0, 100.0)), 2)
        return out
