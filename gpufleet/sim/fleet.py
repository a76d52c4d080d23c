"""The simulated fleet: the one object the demo, tests, replay and benchmarks use.

``Fleet.from_scenario("demo")`` resolves a scenario under a seed and puts
the fleet at its start time with a first sample taken.  It then moves by
ticks (:meth:`Fleet.step`, :meth:`Fleet.ticks`) or follows a clock
(:meth:`Fleet.follow`), and hands out :class:`~gpufleet.agent.sources.base.Source`
objects per node so the real agent runtime can run on a simulated node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.agent.sources.base import GpuRow, HostRow, Source
from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS
from gpufleet.sim.engine import FleetEngine
from gpufleet.sim.labels import Labels, derive_labels
from gpufleet.sim.nodechecks import gpu_numa_node, node_check_facts
from gpufleet.sim.plan import FleetPlan, build_plan
from gpufleet.sim.scenario import MAX_INTERVAL_S, MIN_INTERVAL_S, Scenario, load_scenario
from gpufleet.sim.workload import StepTiming

#: Columns whose values are whole numbers in NVML (written without a decimal part).
INT_GPU_FIELDS = frozenset(f.name for f in GPU_FIELDS if f.kind in ("smallint", "integer", "bigint")) | {
    "util_pct"
}
INT_HOST_FIELDS = frozenset(f.name for f in HOST_FIELDS if f.kind in ("smallint", "integer", "bigint"))
#: Simulated GPU columns, in catalog order: every trace-bundle field the NVML/DCGM side has
#: (the catalog's project extensions, such as ECC and row-remap counters, are not simulated).
GPU_METRICS = tuple(
    f.name for f in GPU_FIELDS if f.bundle and f.name not in ("uuid", "mig_instance", "run_id")
)
HOST_METRICS = tuple(f.name for f in HOST_FIELDS if f.bundle)


class Fleet:
    """A seeded, deterministic simulation of GPU nodes running jobs."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.engine = FleetEngine(plan)
        self._lock = threading.RLock()
        self._clock: Callable[[], float] | None = None
        self.engine.step(plan.t0)

    @classmethod
    def from_scenario(
        cls,
        path_or_name: str | Path | Scenario,
        seed: int | None = None,
        start_time: float | datetime | None = None,
        sample_interval_s: float | None = None,
    ) -> Fleet:
        """Load a scenario (a path, a shipped name, or a parsed :class:`Scenario`).

        ``seed`` overrides the file's seed; ``start_time`` (epoch seconds or an
        aware datetime) overrides its start, e.g. "now" for a live demo;
        ``sample_interval_s`` (0.1-30 s) overrides its sampling interval.
        """
        sc = path_or_name if isinstance(path_or_name, Scenario) else load_scenario(path_or_name)
        if sample_interval_s is not None:
            if not MIN_INTERVAL_S <= sample_interval_s <= MAX_INTERVAL_S:
                raise ValueError(
                    f"sample_interval_s must be within {MIN_INTERVAL_S}-{MAX_INTERVAL_S} s, "
                    f"not {sample_interval_s}"
                )
            sc = sc.model_copy(update={"sample_interval_s": float(sample_interval_s)})
        if isinstance(start_time, datetime):
            start_time = start_time.timestamp()
        return cls(build_plan(sc, seed, start_time))

    # -- where the fleet is ---------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    @property
    def seed(self) -> int:
        return self.plan.seed

    @property
    def t(self) -> float:
        """Time of the current sample, epoch seconds."""
        return self.engine.t

    @property
    def t0(self) -> float:
        return self.plan.t0

    @property
    def t_end(self) -> float:
        return self.plan.t_end

    @property
    def interval_s(self) -> float:
        return self.plan.interval_s

    @property
    def nodes(self) -> list[str]:
        return list(self.engine.node_names)

    # -- moving ---------------------------------------------------------------------------------
    def step(self, t: float | None = None) -> float:
        """One tick, to ``t`` (default: one sampling interval on). Returns the new time."""
        with self._lock:
            self.engine.step(self.t + self.interval_s if t is None else t)
            return self.t

    def advance_to(self, t: float) -> int:
        """Ticks of at most one sampling interval until ``t``; returns how many."""
        n = 0
        with self._lock:
            while self.t < t - 1e-9:
                self.engine.step(min(t, self.t + self.interval_s))
                n += 1
        return n

    def ticks(self, duration_s: float | None = None) -> Iterator[float]:
        """Yield the current sample's time, then step and yield, up to ``duration_s`` later.

        Default: to the end of the scenario.  Sample times are exact multiples
        of the interval from the start, so long runs do not drift.
        """
        start = self.t
        end = start + (self.t_end - start if duration_s is None else duration_s)
        n = round((end - start) / self.interval_s)
        yield self.t
        for k in range(1, n + 1):
            self.step(start + k * self.interval_s)
            yield self.t

    def follow(self, clock: Callable[[], float] | None) -> None:
        """Make sources advance the fleet to ``clock()`` before each read (None: stop)."""
        self._clock = clock

    def sync(self) -> None:
        """Advance to the followed clock, if any."""
        if self._clock is not None:
            now = self._clock()
            with self._lock:
                if now > self.t:
                    self.advance_to(now)

    # -- reading --------------------------------------------------------------------------------
    def gpu_rows(self, node: str) -> list[GpuRow]:
        """Rows of the node's GPUs at the current time (missing GPUs left out)."""
        with self._lock:
            eng = self.engine
            rows: list[GpuRow] = []
            for gi in self.plan.nodes[node].gpu_idx:
                if not eng.gpu_present[gi]:
                    continue
                gp = self.plan.gpus[gi]
                row: GpuRow = {"gpu": gp.gpu, "uuid": gp.uuid, "mig_instance": None}
                for name in GPU_METRICS:
                    v = float(eng.gpu[name][gi])
                    # NaN: a reading the board does not offer (NVLink on a PCIe card), or no job's
                    # cgroup on an unallocated GPU, is NULL, never 0.
                    row[name] = None if v != v else int(v) if name in INT_GPU_FIELDS else v
                rows.append(row)
            return rows

    def host_row(self, node: str) -> HostRow | None:
        """The node's host row at the current time, None while its agent is down."""
        with self._lock:
            k = self.engine.node_index[node]
            if not self.engine.host_present[k]:
                return None
            row: HostRow = {}
            for name in HOST_METRICS:
                v = float(self.engine.host[name][k])
                row[name] = int(v) if name in INT_HOST_FIELDS else v
            return row

    def node_up(self, node: str) -> bool:
        """False while the node's agent is down (a scenario ``sample_gap``)."""
        return bool(self.engine.host_present[self.engine.node_index[node]])

    def last_xid(self, node: str, gpu: int, since: float) -> int:
        """Code of the last XID on that GPU after ``since`` (0 if none)."""
        gi = self.plan.gpu_index(node, gpu)
        with self._lock:
            return int(self.engine.last_xid_code[gi]) if self.engine.last_xid_time[gi] > since else 0

    def sources_for(self, node: str) -> list[Source]:
        """Sources implementing the agent's Source protocol, reading this node."""
        from gpufleet.sim.sources import SimGpuSource, SimHostSource

        if node not in self.plan.nodes:
            raise KeyError(f"unknown node {node!r}; nodes: {', '.join(self.nodes)}")
        return [SimGpuSource(self, node), SimHostSource(self, node)]

    def facts(self, node: str) -> dict[str, Any]:
        """Node facts with the keys the real agent reports (NVML facts + ``node_facts``)."""
        n = self.plan.nodes[node]
        prof = n.profile
        gpus = []
        for gi in n.gpu_idx:
            gp = self.plan.gpus[gi]
            gpus.append(
                {
                    "gpu": gp.gpu,
                    "uuid": gp.uuid,
                    "name": prof.name,
                    "lost": False,
                    "pci_bus_id": f"00000000:{0x18 + 0x10 * gp.gpu:02X}:00.0",
                    "sm_clock_max_mhz": prof.sm_clock_max_mhz,
                    "pcie_gen_max": prof.pcie_gen_max,
                    "pcie_width_max": prof.pcie_width_max,
                    "numa_node": gpu_numa_node(n, gp.gpu),
                    "mig_enabled": False,
                }
            )
        return {
            "hostname": node,
            "kernel": "simulated",
            "simulated": True,
            "site": n.site,
            "gpu_model": prof.name,
            "gpu_profile": prof.key,
            "driver_version": n.driver_version,
            "cuda_driver_version": n.cuda_version,
            "gpu_count": len(n.gpu_idx),
            "gpus": gpus,
            "cpu_count": n.cpu_count,
            "cpu_governor": n.cpu_governor,
            "cpu_governors": {n.cpu_governor: n.cpu_count},
            "cpu_quota_cores": n.cpu_quota_cores,
            "mem_total_mib": prof.mem_total_mib,
            "power_limit_default_w": prof.tdp_w,
            "bf16_dense_peak_flops": prof.bf16_dense_peak_flops,
            # The node checks as the agent reports them (gpufleet.agent.diagnose), from the plan.
            **node_check_facts(self.plan, node),
        }

    def labels(self) -> Labels:
        """Ground truth: expected incidents, hard negatives and events of this fleet."""
        return derive_labels(self.plan)

    def run_progress(self) -> dict[str, dict[str, float]]:
        """Per run: steps, tokens and model FLOPs done so far (for MFU checks)."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for r in self.plan.runs:
                steps = self.engine.run_steps[r.run_id]
                tokens = steps * r.workload.tokens_per_step
                out[r.run_id] = {
                    "steps": steps,
                    "tokens": tokens,
                    "flops": tokens * r.workload.flops_per_token,
                }
        return out

    def step_timing(self, run_id: str) -> StepTiming | None:
        """The last tick's step timing of a training run (None when it was not training)."""
        with self._lock:
            return self.engine.step_timing.get(run_id)

    def gpu_array(self, name: str) -> np.ndarray:
        """The current values of one GPU column over all GPUs (fleet order), a copy."""
        with self._lock:
            return np.array(self.engine.gpu[name], copy=True)
