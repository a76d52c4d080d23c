"""Resolve a scenario and a seed into a concrete plan: every range drawn.

The plan is what both the simulation engine and the ground-truth labels
read, so the labels describe exactly the faults that were injected (the
drawn power limit, the picked GPU, each checkpoint stall's start).  All
times are absolute epoch seconds.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.sim import faults as fs
from gpufleet.sim.profiles import GpuProfile, profile
from gpufleet.sim.ranges import draw, draw_int, stream
from gpufleet.sim.scenario import RunSpec, Scenario, WorkloadSpec
from gpufleet.sim.timeline import IntervalSet

#: XIDs the driver logs for an uncorrectable ECC error, the row remap it records,
#: and a remap that failed (see gpufleet.xid).
XID_DBE = 48
XID_ROW_REMAP = 63
XID_REMAP_FAILURE = 64
#: Share of a run's warm-up spent loading (GPU idle); the rest ramps up.
WARMUP_LOAD_SHARE = 0.6
#: Relative jitter of each checkpoint stall's length around the drawn one.
STALL_LENGTH_JITTER = 0.1
_UUID_NAMESPACE = uuidlib.UUID("6f1c1f0e-6a55-4c1b-9a8e-2f5d3f5b9a11")


@dataclass
class GpuPlan:
    idx: int
    node: str
    gpu: int
    uuid: str
    profile: GpuProfile
    #: Board-to-board spread of dynamic power (silicon lottery), ~1.
    efficiency: float
    inlet_c: float
    #: Energy counter value at the start, mJ (boards have run before).
    energy0_mj: float


@dataclass
class NodePlan:
    name: str
    site: str
    profile: GpuProfile
    gpu_idx: list[int]
    cpu_count: int
    cpu_governor: str
    cpu_quota_cores: float | None
    driver_version: str
    cuda_version: str
    host_idle_w: float
    host_cpu_w: float
    disk_read_bytes_s_max: float
    net_rx_bytes_s: float
    net_tx_bytes_s: float
    job_cpus: str = "all"
    nfs: str = "none"


@dataclass
class Workload:
    """A run's drawn workload parameters (see ``WorkloadSpec`` for meanings)."""

    kind: str
    step_s: float
    comm_share: float
    pcie_share: float
    mem_bound_share: float
    sm_active: float
    tensor_active: float
    dram_active: float
    mem_used_fraction: float
    loader_cpu_pct: float
    disk_read_bytes_s: float
    warmup_s: float
    eval_period_s: float | None
    eval_duration_s: float
    busy_fraction: float
    tokens_per_step: float
    flops_per_token: float


@dataclass
class RunPlan:
    run_id: str
    name: str
    site: str
    team: str | None
    start: float
    #: None: open (runs past the end of the scenario).
    end: float | None
    nodes: list[str]
    gpu_idx: np.ndarray
    workload: Workload
    load: IntervalSet
    ramp: IntervalSet
    evals: IntervalSet = field(default_factory=IntervalSet)
    stalls: IntervalSet = field(default_factory=IntervalSet)

    @property
    def train_start(self) -> float:
        return self.start + self.workload.warmup_s

    def end_or(self, horizon: float) -> float:
        return self.end if self.end is not None else horizon


@dataclass
class StarvationPlan:
    run_id: str
    #: ``cpu`` or ``io``.
    cause: str
    start: float
    end: float
    period_s: float
    duty: float
    #: GPUs whose node's loader starves (the rest of the run waits for them).
    gpu_idx: np.ndarray
    nodes: list[str]
    #: Times the starved GPUs wait for input (excluding the run's pauses).
    waits: IntervalSet
    params: dict[str, float]


@dataclass
class CheckpointPlan:
    run_id: str
    start: float
    end: float
    period_s: float
    duration_s: float
    stalls: IntervalSet
    disk_write_bytes_s: float
    net_tx_bytes_s: float
    #: ``writer`` (rank 0 writes, the others spin) or ``sharded`` (every rank copies its shard out).
    mode: str = "writer"


@dataclass
class IdlePlan:
    """GPUs of a run that do no work over ``[start, end)`` (all of the run's, or a pick)."""

    run_id: str
    start: float
    end: float
    gpu_idx: np.ndarray
    #: Every GPU of the run: the run makes no progress at all.
    whole_run: bool
    note: str | None = None
    #: Index of the fault in the scenario.
    index: int | None = None


@dataclass
class HangPlan:
    """A run stuck in a collective over ``[start, end)``: ``dead`` ranks run nothing, the others spin."""

    run_id: str
    start: float
    end: float
    dead: np.ndarray
    note: str | None = None
    #: Index of the fault in the scenario.
    index: int | None = None


@dataclass
class GpuFaultPlan:
    """A fault acting on GPU state for ``[start, end)`` (``end`` may be ``inf``)."""

    index: int
    kind: str
    start: float
    end: float
    gpu_idx: np.ndarray
    #: Drawn parameters (limit_w, temp_rise_c, clock_factor, gen, width...).
    params: dict[str, Any]
    run_id: str | None = None
    note: str | None = None


@dataclass
class XidEvent:
    time: float
    gpu_idx: int
    code: int
    fault_index: int


@dataclass
class ResetEvent:
    time: float
    gpu_idx: np.ndarray
    gap_s: float
    fault_index: int


@dataclass
class FleetPlan:
    scenario: Scenario
    seed: int
    t0: float
    t_end: float
    interval_s: float
    gpus: list[GpuPlan]
    nodes: dict[str, NodePlan]
    runs: list[RunPlan]
    starvations: list[StarvationPlan]
    checkpoints: list[CheckpointPlan]
    gpu_faults: list[GpuFaultPlan]
    xids: list[XidEvent]
    resets: list[ResetEvent]
    #: Per node: when its agent is down.
    node_gaps: dict[str, IntervalSet]
    #: Per GPU index: when it is missing (driver reload).
    gpu_gaps: dict[int, IntervalSet]
    idles: list[IdlePlan] = field(default_factory=list)
    hangs: list[HangPlan] = field(default_factory=list)

    def gpu_index(self, node: str, gpu: int) -> int:
        return self.nodes[node].gpu_idx[gpu]


def build_plan(sc: Scenario, seed: int | None = None, start_time: float | None = None) -> FleetPlan:
    seed = sc.seed if seed is None else int(seed)
    t0 = float(start_time) if start_time is not None else sc.start_time.timestamp()
    t_end = t0 + sc.duration_s
    gpus, nodes = _build_nodes(sc, seed)
    runs = [_build_run(sc, r, seed, t0, t_end, nodes) for r in sc.runs]
    by_run = {r.run_id: r for r in runs}
    plan = FleetPlan(sc, seed, t0, t_end, sc.sample_interval_s, gpus, nodes, runs, [], [], [], [], [], {}, {})
    for i, f in enumerate(sc.faults):
        _add_fault(plan, i, f, by_run, seed)
    _finish_runs(plan)
    return plan


def _build_nodes(sc: Scenario, seed: int) -> tuple[list[GpuPlan], dict[str, NodePlan]]:
    gpus: list[GpuPlan] = []
    nodes: dict[str, NodePlan] = {}
    for g in sc.nodes:
        prof = profile(g.gpu_model)
        for name in g.node_names():
            rng = stream(seed, "node", name)
            inlet = draw(rng, g.inlet_temp_c)
            idx = []
            for k in range(g.gpus):
                grng = stream(seed, "gpu", name, k)
                gp = GpuPlan(
                    idx=len(gpus),
                    node=name,
                    gpu=k,
                    uuid="GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{name}/{k}")),
                    profile=prof,
                    efficiency=float(np.clip(grng.normal(1.0, 0.025), 0.94, 1.06)),
                    inlet_c=inlet + float(grng.uniform(-1.5, 1.5)),
                    energy0_mj=float(grng.uniform(1e9, 5e10)),
                )
                idx.append(gp.idx)
                gpus.append(gp)
            nodes[name] = NodePlan(
                name=name,
                site=g.site,
                profile=prof,
                gpu_idx=idx,
                cpu_count=g.cpu_count,
                cpu_governor=g.cpu_governor,
                cpu_quota_cores=g.cpu_quota_cores,
                driver_version=g.driver_version,
                cuda_version=g.cuda_version,
                host_idle_w=draw(rng, g.host_idle_w),
                host_cpu_w=draw(rng, g.host_cpu_w),
                disk_read_bytes_s_max=draw(rng, g.disk_read_bytes_s_max),
                net_rx_bytes_s=draw(rng, g.net_rx_bytes_s),
                net_tx_bytes_s=draw(rng, g.net_tx_bytes_s),
                job_cpus=g.job_cpus,
                nfs=g.nfs,
            )
    return gpus, nodes


def _draw_workload(w: WorkloadSpec, rng: np.random.Generator) -> Workload:
    return Workload(
        kind=w.kind,
        step_s=draw(rng, w.step_s),
        comm_share=draw(rng, w.comm_share),
        pcie_share=draw(rng, w.pcie_share),
        mem_bound_share=draw(rng, w.mem_bound_share),
        sm_active=draw(rng, w.sm_active),
        tensor_active=draw(rng, w.tensor_active),
        dram_active=draw(rng, w.dram_active),
        mem_used_fraction=draw(rng, w.mem_used_fraction),
        loader_cpu_pct=draw(rng, w.loader_cpu_pct),
        disk_read_bytes_s=draw(rng, w.disk_read_bytes_s),
        warmup_s=draw(rng, w.warmup_s),
        eval_period_s=draw(rng, w.eval_period_s) if w.eval_period_s is not None else None,
        eval_duration_s=draw(rng, w.eval_duration_s),
        busy_fraction=draw(rng, w.busy_fraction),
        tokens_per_step=draw(rng, w.tokens_per_step),
        flops_per_token=draw(rng, w.flops_per_token),
    )


def _build_run(
    sc: Scenario, r: RunSpec, seed: int, t0: float, t_end: float, nodes: dict[str, NodePlan]
) -> RunPlan:
    wl = _draw_workload(r.workload, stream(seed, "run", r.run_id))
    start = t0 + r.start_s
    end = start + r.duration_s if r.duration_s is not None else None
    horizon = end if end is not None else t_end
    wl.warmup_s = min(wl.warmup_s, horizon - start)
    idx = [nodes[n].gpu_idx[g] for n in r.nodes for g in (r.gpus or range(len(nodes[n].gpu_idx)))]
    load_end = start + WARMUP_LOAD_SHARE * wl.warmup_s
    site = r.site or nodes[r.nodes[0]].site
    return RunPlan(
        run_id=r.run_id,
        name=r.name or r.run_id,
        site=site,
        team=r.team,
        start=start,
        end=end,
        nodes=list(r.nodes),
        gpu_idx=np.array(idx, dtype=np.intp),
        workload=wl,
        load=IntervalSet([(start, load_end)]),
        ramp=IntervalSet([(load_end, start + wl.warmup_s)]),
    )


def _window(plan: FleetPlan, f: fs._Fault) -> tuple[float, float]:
    """Absolute window; a fault without ``end_s`` lasts as long as the fleet runs (``inf``)."""
    start = plan.t0 + f.start_s
    return start, plan.t0 + f.end_s if f.end_s is not None else float("inf")


def _target_gpus(
    plan: FleetPlan, f: fs._GpuTarget, by_run: dict[str, RunPlan], rng: np.random.Generator
) -> np.ndarray:
    if f.run_id is not None:
        pool = by_run[f.run_id].gpu_idx
    else:
        assert f.node is not None
        node = plan.nodes[f.node]
        pool = np.array(
            [node.gpu_idx[g] for g in f.gpus] if f.gpus is not None else node.gpu_idx, dtype=np.intp
        )
    if f.pick is not None:
        pool = np.sort(rng.choice(pool, size=f.pick, replace=False))
    return np.asarray(pool, dtype=np.intp)


def _add_fault(plan: FleetPlan, i: int, f: Any, by_run: dict[str, RunPlan], seed: int) -> None:
    rng = stream(seed, "fault", i, f.kind)
    start, end = _window(plan, f)
    if isinstance(f, fs.StarvationCpu | fs.StarvationIo):
        _add_starvation(plan, f, by_run[f.run_id], rng, start, end)
    elif isinstance(f, fs.CheckpointStall):
        _add_checkpoint(plan, f, by_run[f.run_id], rng, start, end)
    elif isinstance(f, fs.IdleAllocation):
        run = by_run[f.run_id]
        pool = run.gpu_idx
        if f.pick is not None and f.pick < pool.size:
            pool = np.sort(rng.choice(pool, size=f.pick, replace=False))
        s0, e0 = max(start, run.start), min(end, run.end_or(plan.t_end), plan.t_end)
        if e0 > s0:
            plan.idles.append(
                IdlePlan(
                    run.run_id,
                    s0,
                    e0,
                    np.asarray(pool, dtype=np.intp),
                    pool.size == run.gpu_idx.size,
                    f.note,
                    i,
                )
            )
    elif isinstance(f, fs.HungCollective):
        run = by_run[f.run_id]
        dead = np.sort(rng.choice(run.gpu_idx, size=min(f.dead_ranks, run.gpu_idx.size), replace=False))
        s0, e0 = max(start, run.train_start), min(end, run.end_or(plan.t_end), plan.t_end)
        if e0 > s0:
            plan.hangs.append(HangPlan(run.run_id, s0, e0, np.asarray(dead, dtype=np.intp), f.note, i))
    elif isinstance(f, fs.SampleGap):
        end = min(end, plan.t_end)
        plan.node_gaps[f.node] = plan.node_gaps.get(f.node, IntervalSet()).union(IntervalSet([(start, end)]))
    elif isinstance(f, fs.Xid):
        idx = _target_gpus(plan, f, by_run, rng)
        for _ in range(draw_int(rng, f.count)):
            plan.xids.append(
                XidEvent(
                    float(rng.uniform(start, min(end, plan.t_end))),
                    int(rng.choice(idx)),
                    int(rng.choice(f.codes)),
                    i,
                )
            )
        plan.xids.sort(key=lambda x: x.time)
        plan.gpu_faults.append(
            GpuFaultPlan(i, f.kind, start, end, idx, {"codes": list(f.codes)}, f.run_id, f.note)
        )
    elif isinstance(f, fs.EccDbe | fs.RowRemapFailure):
        # Discrete events: an uncorrectable error (XID 48, then the remap's XID 63),
        # or a remap that failed (XID 64); the engine sets the counters and flags.
        idx = _target_gpus(plan, f, by_run, rng)
        n = draw_int(rng, f.count) if isinstance(f, fs.EccDbe) else 1
        codes = (XID_DBE, XID_ROW_REMAP) if isinstance(f, fs.EccDbe) else (XID_REMAP_FAILURE,)
        for _ in range(n):
            t = float(rng.uniform(start, min(end, plan.t_end)))
            g = int(rng.choice(idx))
            # The remap's XID follows two samples later, so both are seen.
            for k, code in enumerate(codes):
                plan.xids.append(XidEvent(t + 2.0 * plan.interval_s * k, g, code, i))
        plan.xids.sort(key=lambda x: x.time)
        plan.gpu_faults.append(GpuFaultPlan(i, f.kind, start, end, idx, {}, f.run_id, f.note))
    elif isinstance(f, fs.CounterReset):
        idx = _target_gpus(plan, f, by_run, rng)
        gap = draw(rng, f.gap_s)
        plan.resets.append(ResetEvent(start, idx, gap, i))
        for g in idx.tolist():
            plan.gpu_gaps[g] = plan.gpu_gaps.get(g, IntervalSet()).union(IntervalSet([(start, start + gap)]))
    else:
        idx = _target_gpus(plan, f, by_run, rng)
        plan.gpu_faults.append(
            GpuFaultPlan(i, f.kind, start, end, idx, _gpu_params(f, idx, plan, rng), f.run_id, f.note)
        )


def _gpu_params(f: Any, idx: np.ndarray, plan: FleetPlan, rng: np.random.Generator) -> dict[str, Any]:
    prof = plan.gpus[int(idx[0])].profile
    if isinstance(f, fs.PowerCap):
        limit = draw(rng, f.limit_w) if f.limit_w is not None else draw(rng, f.limit_fraction) * prof.tdp_w
        return {"limit_w": round(max(limit, prof.min_power_limit_w))}
    if isinstance(f, fs.Thermal):
        return {"temp_rise_c": draw(rng, f.temp_rise_c)}
    if isinstance(f, fs.HwSlowdown | fs.PowerBrake):
        return {"clock_factor": draw(rng, f.clock_factor)}
    if isinstance(f, fs.ClockLock):
        return {"clock_fraction": draw(rng, f.clock_fraction)}
    if isinstance(f, fs.NvlinkDown):
        return {
            "links_down": min(draw_int(rng, f.links_down), prof.nvlink_links),
            "links_max": prof.nvlink_links,
        }
    if isinstance(f, fs.NvlinkFallback):
        return {}
    if isinstance(f, fs.NvlinkErrors):
        return {
            "crc_per_s": draw(rng, f.crc_per_s),
            "replay_per_s": draw(rng, f.replay_per_s),
            "recovery_per_h": draw(rng, f.recovery_per_h),
        }
    if isinstance(f, fs.EccSbe):
        return {"sbe_per_h": draw(rng, f.sbe_per_h)}
    if isinstance(f, fs.RowRemapFailure):
        return {}
    if isinstance(f, fs.PcieReplay):
        return {"replays_per_min": draw(rng, f.replays_per_min)}
    if isinstance(f, fs.PcieDegraded):
        gen: int | None = f.gen
        width: int | None = f.width
        if gen is None and width is None:
            if rng.random() < 0.5:
                gen = max(1, prof.pcie_gen_max - 2)
            else:
                width = prof.pcie_width_max // 2
        return {"gen": gen, "width": width}
    raise AssertionError(f"unhandled fault kind {f.kind}")


def _add_starvation(
    plan: FleetPlan,
    f: fs.StarvationCpu | fs.StarvationIo,
    run: RunPlan,
    rng: np.random.Generator,
    start: float,
    end: float,
) -> None:
    start, end = max(start, run.train_start), min(end, run.end_or(plan.t_end))
    period, duty = draw(rng, f.period_s), draw(rng, f.duty)
    first = start + float(rng.uniform(0, period)) - period + duty * period
    waits = IntervalSet.periodic(start, end, period, (1 - duty) * period, first)
    nodes = f.nodes or run.nodes
    idx = np.array([g for g in run.gpu_idx.tolist() if plan.gpus[g].node in nodes], dtype=np.intp)
    if isinstance(f, fs.StarvationCpu):
        params = {"cpu_user_pct": draw(rng, f.cpu_user_pct), "offload": 1.0 if f.offload else 0.0}
        cause = "cpu"
    else:
        params = {
            "cpu_iowait_pct": draw(rng, f.cpu_iowait_pct),
            "disk_await_ms": draw(rng, f.disk_await_ms),
            "disk_util_pct": draw(rng, f.disk_util_pct),
        }
        cause = "io"
    plan.starvations.append(
        StarvationPlan(run.run_id, cause, start, end, period, duty, idx, list(nodes), waits, params)
    )


def _add_checkpoint(
    plan: FleetPlan, f: fs.CheckpointStall, run: RunPlan, rng: np.random.Generator, start: float, end: float
) -> None:
    start, end = max(start, run.train_start), min(end, run.end_or(plan.t_end))
    period, length = draw(rng, f.period_s), draw(rng, f.duration_s)
    first = start + (draw(rng, f.first_after_s) if f.first_after_s is not None else period)
    stalls = []
    t = first
    while t < end:
        d = length * float(rng.uniform(1 - STALL_LENGTH_JITTER, 1 + STALL_LENGTH_JITTER))
        stalls.append((t, min(t + d, end)))
        t += period
    plan.checkpoints.append(
        CheckpointPlan(
            run.run_id,
            start,
            end,
            period,
            length,
            IntervalSet(stalls),
            draw(rng, f.disk_write_bytes_s),
            draw(rng, f.net_tx_bytes_s),
            f.mode,
        )
    )


def _finish_runs(plan: FleetPlan) -> None:
    """Lay out each run's pauses without overlaps: warm-up > checkpoint > eval > input waits."""
    for run in plan.runs:
        end = run.end_or(plan.t_end)
        warm = run.load.union(run.ramp)
        stalls = IntervalSet()
        for c in plan.checkpoints:
            if c.run_id == run.run_id:
                stalls = stalls.union(c.stalls)
        run.stalls = stalls.minus(warm).clip(run.start, end)
        wl = run.workload
        if wl.eval_period_s is not None:
            rng = stream(plan.seed, "eval", run.run_id)
            first = run.train_start + wl.eval_period_s * float(rng.uniform(0.5, 1.0))
            evals = IntervalSet.periodic(run.train_start, end, wl.eval_period_s, wl.eval_duration_s, first)
            run.evals = evals.minus(run.stalls)
        for c in plan.checkpoints:
            if c.run_id == run.run_id:
                c.stalls = c.stalls.intersect(run.stalls)
        paused = warm.union(run.stalls).union(run.evals)
        for s in plan.starvations:
            if s.run_id == run.run_id:
                s.waits = s.waits.minus(paused)
