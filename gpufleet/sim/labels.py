"""Ground truth of a simulated fleet: what a perfect detector would report.

Derived from the resolved plan (the drawn limits, the picked GPUs, each
stall's times), using the kinds and causes of contracts.md section 2, so a
scoring script can compute precision and recall of the real detectors:

* ``incidents``: expected findings ``{kind, cause, run_id, node, gpu, start, end}``;
* ``hard_negatives``: look-alikes that must *not* raise the listed kinds
  (warm-up, evaluation pauses, a steady lightly loaded run, a uniform power
  cap, idle unallocated GPUs);
* ``events``: counter resets, sample gaps and XIDs, for accounting checks.

Windows are those of the injected cause, clipped to the run's training time
where the symptom needs a busy GPU; ``end`` is the scenario end when the cause
lasts to the end of the trace.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.sim.physics import (
    activity_index,
    clock_ratio_for_limit,
    compute_time_factor,
    dynamic_power_w,
    target_temp_c,
    thermal_limit_power_w,
)
from gpufleet.sim.plan import FleetPlan, GpuFaultPlan, GpuPlan, RunPlan, StarvationPlan
from gpufleet.sim.profiles import pcie_link_bytes_s
from gpufleet.sim.timeline import IntervalSet
from gpufleet.timeparse import rfc3339_rounded

STARVATION = "starvation"
STRAGGLER = "straggler"
CHECKPOINT_STALL = "checkpoint_stall"
THROTTLING = "throttling"
PCIE_DEGRADED = "pcie_degraded"
HOST_MISCONFIG = "host_misconfig"
NVLINK_DEGRADED = "nvlink_degraded"
GPU_HEALTH = "gpu_health"
IDLE_ALLOCATION = "idle_allocation"
HUNG_COLLECTIVE = "hung_collective"
KINDS = (
    STARVATION,
    STRAGGLER,
    CHECKPOINT_STALL,
    THROTTLING,
    PCIE_DEGRADED,
    HOST_MISCONFIG,
    NVLINK_DEGRADED,
    GPU_HEALTH,
    IDLE_ALLOCATION,
    HUNG_COLLECTIVE,
)
#: Kinds that explain a run's lost time: on a run stopped for one reason, none of the others.
RUN_TIME_KINDS = (STARVATION, CHECKPOINT_STALL, STRAGGLER, IDLE_ALLOCATION, HUNG_COLLECTIVE)

#: Allowed causes per kind (contracts.md section 2; host_misconfig is ours).
CAUSES: dict[str, tuple[str | None, ...]] = {
    STARVATION: ("cpu", "io", "unknown"),
    THROTTLING: ("power_cap", "thermal", "hw_slowdown", "power_brake"),
    STRAGGLER: ("power_cap", "thermal", "pcie_degraded", "clocks", "network", "unknown"),
    CHECKPOINT_STALL: (None,),
    IDLE_ALLOCATION: (None,),
    HUNG_COLLECTIVE: (None,),
    PCIE_DEGRADED: (None,),
    HOST_MISCONFIG: ("cpu_governor", "cpu_quota", "numa_affinity", "nfs_stall", "repeated_xid"),
    NVLINK_DEGRADED: ("links_down", "pcie_fallback", "link_errors"),
    GPU_HEALTH: (
        "row_remap_failed",
        "uncorrectable_ecc",
        "row_remap_pending",
        "correctable_ecc",
        "pcie_replay",
    ),
}

#: XIDs that mean an uncorrectable ECC error, a row remap recorded (pending a
#: reset), and a remap that failed (the simulator's engine acts on the same).
XID_UNCORRECTABLE = (48, 94, 95)
XID_ROW_REMAP = 63
XID_REMAP_FAILURE = 64
#: Causes of each health fault kind.
_HEALTH_CAUSES: dict[str, tuple[str, str]] = {
    "nvlink_down": (NVLINK_DEGRADED, "links_down"),
    "nvlink_fallback": (NVLINK_DEGRADED, "pcie_fallback"),
    "nvlink_errors": (NVLINK_DEGRADED, "link_errors"),
    "ecc_sbe": (GPU_HEALTH, "correctable_ecc"),
    "pcie_replay": (GPU_HEALTH, "pcie_replay"),
}

#: A GPU this much slower than its peers (step compute time) is a straggler.
STRAGGLER_MIN_SLOWDOWN = 0.05
#: Idle stretches shorter than this (a GPU waiting for its run to start) are not listed.
IDLE_NEGATIVE_MIN_S = 60.0
#: XIDs on one GPU from this many on count as "repeated".
REPEATED_XID_MIN = 2
#: Injected fault kind -> (throttling cause, straggler cause).
_CLOCK_CAUSES: dict[str, tuple[str | None, str]] = {
    "power_cap": ("power_cap", "power_cap"),
    "thermal": ("thermal", "thermal"),
    "hw_slowdown": ("hw_slowdown", "clocks"),
    "power_brake": ("power_brake", "clocks"),
    "clock_lock": (None, "clocks"),
    "pcie_degraded": (None, "pcie_degraded"),
}


def rfc3339(t: float | None) -> str | None:
    """UTC RFC 3339 with ``Z``; milliseconds only when the time has a fraction."""
    return None if t is None else rfc3339_rounded(t)


def parse_time(s: str | None) -> float | None:
    if s is None:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


@dataclass
class Incident:
    kind: str
    cause: str | None
    start: float
    end: float | None
    run_id: str | None = None
    node: str | None = None
    gpu: int | None = None
    #: The injected fault (or node setting) this stands for.
    fault: str = ""
    fault_index: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class HardNegative:
    reason: str
    #: Kinds that must not be reported for this scope and window.
    not_kinds: list[str]
    start: float
    end: float | None
    run_id: str | None = None
    node: str | None = None
    gpu: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Event:
    type: str
    start: float
    end: float | None = None
    node: str | None = None
    gpu: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Labels:
    scenario: str
    seed: int
    start: float
    end: float
    sample_interval_s: float
    incidents: list[Incident] = field(default_factory=list)
    hard_negatives: list[HardNegative] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def conv(d: dict[str, Any]) -> dict[str, Any]:
            out = dict(d)
            for k in ("start", "end"):
                if k in out:
                    out[k] = rfc3339(out[k])
            return out

        return {
            "scenario": self.scenario,
            "seed": self.seed,
            "start": rfc3339(self.start),
            "end": rfc3339(self.end),
            "sample_interval_s": self.sample_interval_s,
            "incidents": [conv(asdict(i)) for i in self.incidents],
            "hard_negatives": [conv(asdict(h)) for h in self.hard_negatives],
            "events": [conv(asdict(e)) for e in self.events],
            "runs": [conv(r) for r in self.runs],
        }

    def write(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, default=_json_default) + "\n")

    @classmethod
    def load(cls, path: Path | str) -> Labels:
        d = json.loads(Path(path).read_text())

        def times(x: dict[str, Any]) -> dict[str, Any]:
            x = dict(x)
            for k in ("start", "end"):
                if k in x:
                    x[k] = parse_time(x[k])
            return x

        start, end = parse_time(d["start"]), parse_time(d["end"])
        assert start is not None and end is not None
        return cls(
            scenario=d["scenario"],
            seed=d["seed"],
            start=start,
            end=end,
            sample_interval_s=d["sample_interval_s"],
            incidents=[Incident(**times(i)) for i in d["incidents"]],
            hard_negatives=[HardNegative(**times(h)) for h in d["hard_negatives"]],
            events=[Event(**times(e)) for e in d["events"]],
            runs=[times(r) for r in d["runs"]],
        )

    def clip(self, start: float, end: float) -> Labels:
        """The labels of the part ``[start, end]`` of the timeline (what a shorter bundle holds).

        Items wholly outside are dropped, the others cut to the window; the
        episode lists of checkpoint stalls and evaluation pauses keep the
        episodes that begin inside it.
        """

        def cut(items: list[Any]) -> list[Any]:
            out = []
            for it in items:
                it_end = it.end if it.end is not None else end
                if it.start > end or it_end < start or (it.end is not None and it.start >= end):
                    continue
                c = replace(it, start=max(it.start, start), end=min(it_end, end))
                for key in ("stalls", "pauses"):
                    bag = (
                        c.evidence
                        if isinstance(c, Incident)
                        else c.detail
                        if isinstance(c, HardNegative)
                        else None
                    )
                    if bag is not None and key in bag:
                        bag = dict(bag)
                        bag[key] = [p for p in bag[key] if start <= (parse_time(p[0]) or 0.0) < end]
                        if isinstance(c, Incident):
                            c.evidence = bag
                        else:
                            c.detail = bag
                if isinstance(c, Incident) and c.kind == GPU_HEALTH and "xid_events" in c.evidence:
                    # What the cut data can show: the events up to its end (a remap
                    # failure or an uncorrectable error after it is not in the bundle).
                    seen = [
                        int(code) for at, code in c.evidence["xid_events"] if (parse_time(at) or 0.0) <= end
                    ]
                    c = replace(c, cause=memory_cause(set(seen)))
                out.append(c)
            return out

        events = [e for e in self.events if start <= e.start <= end]
        runs = [r for r in self.runs if r["start"] <= end]
        return Labels(
            self.scenario,
            self.seed,
            start,
            end,
            self.sample_interval_s,
            cut(self.incidents),
            cut(self.hard_negatives),
            events,
            runs,
        )

    def of_kind(self, kind: str) -> list[Incident]:
        return [i for i in self.incidents if i.kind == kind]


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def derive_labels(plan: FleetPlan) -> Labels:
    lab = Labels(plan.scenario.name, plan.seed, plan.t0, plan.t_end, plan.interval_s)
    _run_scoped(plan, lab)
    _gpu_faults(plan, lab)
    _node_settings(plan, lab)
    _memory_events(plan, lab)
    _negatives(plan, lab)
    _events(plan, lab)
    for r in plan.runs:
        prof = plan.gpus[int(r.gpu_idx[0])].profile
        lab.runs.append(
            {
                "run_id": r.run_id,
                "name": r.name,
                "site": r.site,
                "start": r.start,
                "end": r.end,
                "train_start": rfc3339(r.train_start),
                "workload": r.workload.kind,
                "gpu_count": len(r.gpu_idx),
                "step_s": r.workload.step_s,
                "tokens_per_step": r.workload.tokens_per_step,
                "flops_per_token": r.workload.flops_per_token,
                "bf16_dense_peak_flops": prof.bf16_dense_peak_flops,
            }
        )
    lab.incidents.sort(key=lambda i: (i.start, i.kind, i.run_id or "", i.node or "", i.gpu or -1))
    return lab


def _run_scoped(plan: FleetPlan, lab: Labels) -> None:
    for s in plan.starvations:
        if s.end > s.start and s.waits:
            lab.incidents.append(
                Incident(
                    STARVATION,
                    s.cause,
                    s.start,
                    s.end,
                    run_id=s.run_id,
                    fault=f"starvation_{s.cause}",
                    evidence={
                        "period_s": s.period_s,
                        "duty": s.duty,
                        "nodes": s.nodes,
                        **s.params,
                        "host_shows_cause": _host_shows_cause(plan, s),
                    },
                )
            )
    runs = {r.run_id: r for r in plan.runs}
    for c in plan.checkpoints:
        if c.stalls:
            pairs = c.stalls.pairs()
            run = runs.get(c.run_id)
            writer = plan.gpus[int(run.gpu_idx[0])] if run is not None and run.gpu_idx.size else None
            lab.incidents.append(
                Incident(
                    CHECKPOINT_STALL,
                    None,
                    pairs[0][0],
                    pairs[-1][1],
                    run_id=c.run_id,
                    fault="checkpoint_stall",
                    evidence={
                        "period_s": c.period_s,
                        "duration_s": c.duration_s,
                        "mode": c.mode,
                        "writer_gpu": f"{writer.node}/{writer.gpu}"
                        if writer is not None and c.mode == "writer"
                        else None,
                        "stalls": [[rfc3339(a), rfc3339(b)] for a, b in pairs],
                    },
                )
            )
            # Over a checkpoint's pauses the ranks wait on the writer: not input starvation, not a hang.
            lab.hard_negatives.append(
                HardNegative(
                    "checkpoint_pause",
                    [STARVATION, HUNG_COLLECTIVE, IDLE_ALLOCATION],
                    pairs[0][0],
                    pairs[-1][1],
                    run_id=c.run_id,
                    detail={"mode": c.mode, "duration_s": c.duration_s},
                )
            )
    for i in plan.idles:
        gpus = [{"node": plan.gpus[g].node, "gpu": plan.gpus[g].gpu} for g in i.gpu_idx.tolist()]
        lab.incidents.append(
            Incident(
                IDLE_ALLOCATION,
                None,
                i.start,
                i.end,
                run_id=i.run_id,
                fault="idle_allocation",
                fault_index=i.index,
                evidence={"gpus": gpus, "whole_run": i.whole_run, "note": i.note},
            )
        )
        lab.hard_negatives.append(
            HardNegative(
                "idle_run",
                [k for k in RUN_TIME_KINDS if k != IDLE_ALLOCATION],
                i.start,
                i.end,
                run_id=i.run_id,
                detail={"gpus": gpus},
            )
        )
    for h in plan.hangs:
        dead = [{"node": plan.gpus[g].node, "gpu": plan.gpus[g].gpu} for g in h.dead.tolist()]
        lab.incidents.append(
            Incident(
                HUNG_COLLECTIVE,
                None,
                h.start,
                h.end,
                run_id=h.run_id,
                fault="hung_collective",
                fault_index=h.index,
                evidence={"dead_gpus": dead, "note": h.note},
            )
        )
        lab.hard_negatives.append(
            HardNegative(
                "hung_run",
                [k for k in RUN_TIME_KINDS if k != HUNG_COLLECTIVE],
                h.start,
                h.end,
                run_id=h.run_id,
                detail={"dead_gpus": dead},
            )
        )


#: Host-wide user CPU at which a host counts as CPU-saturated (the detectors' default).
HOST_CPU_SATURATED_PCT = 80.0


def _host_shows_cause(plan: FleetPlan, s: StarvationPlan) -> bool:
    """Whether the host-wide figures show the cause, or only the job's own cgroup does: a CPU-bound
    loader held to a container quota leaves the host's CPUs mostly idle."""
    if s.cause != "cpu":
        return True
    for name in s.nodes:
        n = plan.nodes[name]
        if (
            n.cpu_quota_cores is not None
            and 100.0 * n.cpu_quota_cores / n.cpu_count + 1.0 < HOST_CPU_SATURATED_PCT
        ):
            return False
    return True


def _busy_windows(plan: FleetPlan, gi: int, start: float, end: float) -> list[tuple[RunPlan, float, float]]:
    """The training time of the runs holding GPU ``gi`` within ``[start, end)``."""
    out = []
    for r in plan.runs:
        if r.workload.kind != "training" or gi not in r.gpu_idx:
            continue
        s, e = max(start, r.train_start), min(end, r.end_or(plan.t_end))
        if e > s:
            out.append((r, s, e))
    return out


def busy_dynamic_power_w(gp: GpuPlan, r: RunPlan) -> float:
    w = r.workload
    act = activity_index(w.sm_active, w.tensor_active, w.dram_active)
    return float(dynamic_power_w(gp.profile.tdp_w, gp.profile.idle_w, gp.efficiency, act))


def slowdown(plan: FleetPlan, f: GpuFaultPlan, gp: GpuPlan, r: RunPlan) -> tuple[float, bool]:
    """(step compute-time increase, whether the fault throttles at all) for a busy GPU."""
    prof, w = gp.profile, r.workload
    dyn = busy_dynamic_power_w(gp, r)
    ratio, bw = 1.0, 1.0
    p = f.params
    if f.kind == "power_cap":
        ratio = float(clock_ratio_for_limit(p["limit_w"], prof.idle_w, dyn))
    elif f.kind == "thermal":
        r_th, rise = prof.thermal_resistance_c_per_w, p["temp_rise_c"]
        if float(target_temp_c(gp.inlet_c, r_th, prof.idle_w + dyn, rise)) > prof.temp_sw_limit_c:
            allowed = thermal_limit_power_w(prof.temp_sw_limit_c, gp.inlet_c, r_th, rise)
            ratio = min(float(clock_ratio_for_limit(allowed, prof.idle_w, dyn)), 0.999)
    elif f.kind in ("hw_slowdown", "power_brake"):
        ratio = p["clock_factor"]
    elif f.kind == "clock_lock":
        ratio = p["clock_fraction"]
    elif f.kind == "pcie_degraded":
        gen = p["gen"] or prof.pcie_gen_max
        width = p["width"] or prof.pcie_width_max
        bw = pcie_link_bytes_s(gen, width) / pcie_link_bytes_s(prof.pcie_gen_max, prof.pcie_width_max)
    ratio = max(ratio, prof.sm_clock_min_mhz / prof.sm_clock_max_mhz)
    factor = float(compute_time_factor(ratio, w.mem_bound_share, w.pcie_share, bw))
    throttles = ratio < 0.999 or f.kind in ("hw_slowdown", "power_brake")
    return factor - 1.0, throttles


def _gpu_faults(plan: FleetPlan, lab: Labels) -> None:
    for f in plan.gpu_faults:
        if f.kind in ("xid", "ecc_dbe", "row_remap_failure"):
            _xids(plan, lab, f)
            continue
        if f.kind in _HEALTH_CAUSES:
            _health_fault(plan, lab, f)
            continue
        causes = _CLOCK_CAUSES[f.kind]
        targeted = set(f.gpu_idx.tolist())
        evidence = {k: v for k, v in f.params.items() if v is not None}
        for gi in f.gpu_idx.tolist():
            gp = plan.gpus[gi]
            for r, s, e in _busy_windows(plan, gi, f.start, f.end):
                slow, throttles = slowdown(plan, f, gp, r)
                common = {
                    "run_id": r.run_id,
                    "node": gp.node,
                    "gpu": gp.gpu,
                    "fault": f.kind,
                    "fault_index": f.index,
                }
                if f.kind == "pcie_degraded":
                    lab.incidents.append(
                        Incident(PCIE_DEGRADED, None, s, e, evidence=dict(evidence), **common)
                    )
                elif causes[0] is not None and throttles:
                    lab.incidents.append(
                        Incident(THROTTLING, causes[0], s, e, evidence=dict(evidence), **common)
                    )
                run_gpus = set(r.gpu_idx.tolist())
                if len(run_gpus) > 1 and not run_gpus <= targeted and slow >= STRAGGLER_MIN_SLOWDOWN:
                    lab.incidents.append(
                        Incident(
                            STRAGGLER,
                            causes[1],
                            s,
                            e,
                            evidence={**evidence, "slowdown": round(slow, 4)},
                            **common,
                        )
                    )
        for r in plan.runs:
            if len(r.gpu_idx) > 1 and set(r.gpu_idx.tolist()) <= targeted:
                s, e = max(f.start, r.train_start), min(f.end, r.end_or(plan.t_end))
                if e > s:
                    lab.hard_negatives.append(
                        HardNegative(
                            f"uniform_{f.kind}",
                            [STRAGGLER],
                            s,
                            e,
                            run_id=r.run_id,
                            detail={"fault_index": f.index, **evidence},
                        )
                    )


def _xids(plan: FleetPlan, lab: Labels, f: GpuFaultPlan) -> None:
    per_gpu: dict[int, list[float]] = {}
    for x in plan.xids:
        if x.fault_index == f.index:
            per_gpu.setdefault(x.gpu_idx, []).append(x.time)
    for gi, times in sorted(per_gpu.items()):
        if len(times) >= REPEATED_XID_MIN:
            gp = plan.gpus[gi]
            codes = sorted({x.code for x in plan.xids if x.fault_index == f.index and x.gpu_idx == gi})
            run = next(
                (
                    r.run_id
                    for r in plan.runs
                    if gi in r.gpu_idx and r.start <= times[0] < r.end_or(plan.t_end)
                ),
                None,
            )
            lab.incidents.append(
                Incident(
                    HOST_MISCONFIG,
                    "repeated_xid",
                    min(times),
                    max(times),
                    run_id=run,
                    node=gp.node,
                    gpu=gp.gpu,
                    fault="xid",
                    fault_index=f.index,
                    evidence={"count": len(times), "codes": codes},
                )
            )


def _health_fault(plan: FleetPlan, lab: Labels, f: GpuFaultPlan) -> None:
    """NVLink and memory/bus faults: GPU-scoped, whatever runs on the GPU, for the
    fault's window; a fallback to PCIe shows only while a multi-GPU run trains."""
    kind, cause = _HEALTH_CAUSES[f.kind]
    evidence = {k: v for k, v in f.params.items() if v is not None}
    end = min(f.end, plan.t_end)
    for gi in f.gpu_idx.tolist():
        gp = plan.gpus[gi]
        if f.kind == "nvlink_fallback":
            for r, s, e in _busy_windows(plan, gi, f.start, f.end):
                if np.count_nonzero(np.isin(r.gpu_idx, plan.nodes[gp.node].gpu_idx)) > 1:
                    lab.incidents.append(
                        Incident(
                            kind,
                            cause,
                            s,
                            e,
                            run_id=r.run_id,
                            node=gp.node,
                            gpu=gp.gpu,
                            fault=f.kind,
                            fault_index=f.index,
                            evidence=dict(evidence),
                        )
                    )
            continue
        lab.incidents.append(
            Incident(
                kind,
                cause,
                f.start,
                end,
                node=gp.node,
                gpu=gp.gpu,
                fault=f.kind,
                fault_index=f.index,
                evidence=dict(evidence),
            )
        )


def _memory_events(plan: FleetPlan, lab: Labels) -> None:
    """Uncorrectable ECC errors, remaps and remap failures from the XIDs that
    carry them, whichever fault logged them: one ``gpu_health`` incident per GPU
    from the first such event while a remap is pending (until a driver reload)
    or a failure is flagged (for good), with the most serious cause."""
    per_gpu: dict[int, list[tuple[float, int]]] = {}
    first_fault: dict[int, int] = {}
    for x in plan.xids:
        if x.code in XID_UNCORRECTABLE or x.code in (XID_ROW_REMAP, XID_REMAP_FAILURE):
            per_gpu.setdefault(x.gpu_idx, []).append((x.time, x.code))
            first_fault.setdefault(x.gpu_idx, x.fault_index)
    kinds = {f.index: f.kind for f in plan.gpu_faults}
    for gi, events in sorted(per_gpu.items()):
        gp = plan.gpus[gi]
        t0 = min(t for t, _ in events)
        codes = {c for _, c in events}
        failed = XID_REMAP_FAILURE in codes
        resets = sorted(ev.time for ev in plan.resets if gi in ev.gpu_idx.tolist() and ev.time > t0)
        end = plan.t_end if failed or not resets else resets[0]
        fi = first_fault[gi]
        lab.incidents.append(
            Incident(
                GPU_HEALTH,
                memory_cause(codes),
                t0,
                end,
                node=gp.node,
                gpu=gp.gpu,
                fault=kinds.get(fi, "xid"),
                fault_index=fi,
                evidence={
                    "xids": sorted(codes),
                    "events": len(events),
                    "xid_events": [[rfc3339(t), c] for t, c in sorted(events)],
                },
            )
        )


def memory_cause(codes: set[int]) -> str:
    """The most serious GPU-health cause the memory XIDs logged so far imply."""
    if XID_REMAP_FAILURE in codes:
        return "row_remap_failed"
    return "uncorrectable_ecc" if codes & set(XID_UNCORRECTABLE) else "row_remap_pending"


def _node_settings(plan: FleetPlan, lab: Labels) -> None:
    for n in plan.nodes.values():
        if n.cpu_governor == "powersave":
            lab.incidents.append(
                Incident(
                    HOST_MISCONFIG,
                    "cpu_governor",
                    plan.t0,
                    plan.t_end,
                    node=n.name,
                    fault="cpu_governor",
                    evidence={"cpu_governor": n.cpu_governor},
                )
            )
        # The quota of each job's cgroup against the GPUs it feeds on this node (one core per GPU);
        # a node no run uses is judged as a whole.
        held = [[gi for gi in r.gpu_idx.tolist() if plan.gpus[gi].node == n.name] for r in plan.runs]
        held = [h for h in held if h]
        short = [len(h) for h in held] if held else [len(n.gpu_idx)]
        if n.cpu_quota_cores is not None and any(n.cpu_quota_cores < k for k in short):
            lab.incidents.append(
                Incident(
                    HOST_MISCONFIG,
                    "cpu_quota",
                    plan.t0,
                    plan.t_end,
                    node=n.name,
                    fault="cpu_quota",
                    evidence={"cpu_quota_cores": n.cpu_quota_cores, "gpus": max(short)},
                )
            )
        if n.job_cpus == "remote" and held:
            lab.incidents.append(
                Incident(
                    HOST_MISCONFIG,
                    "numa_affinity",
                    plan.t0,
                    plan.t_end,
                    node=n.name,
                    fault="numa_affinity",
                    evidence={"job_cpus": n.job_cpus},
                )
            )
        if n.nfs == "stalled":
            lab.incidents.append(
                Incident(
                    HOST_MISCONFIG,
                    "nfs_stall",
                    plan.t0,
                    plan.t_end,
                    node=n.name,
                    fault="nfs_stall",
                    evidence={"nfs": n.nfs},
                )
            )


def _negatives(plan: FleetPlan, lab: Labels) -> None:
    for r in plan.runs:
        end = r.end_or(plan.t_end)
        if r.train_start > r.start:
            lab.hard_negatives.append(
                HardNegative(
                    "warmup",
                    [STARVATION, CHECKPOINT_STALL, STRAGGLER, IDLE_ALLOCATION, HUNG_COLLECTIVE],
                    r.start,
                    min(r.train_start, end),
                    run_id=r.run_id,
                    detail={"warmup_s": r.workload.warmup_s},
                )
            )
        if r.evals:
            pairs = r.evals.pairs()
            lab.hard_negatives.append(
                HardNegative(
                    "eval_pause",
                    [STARVATION, CHECKPOINT_STALL, IDLE_ALLOCATION, HUNG_COLLECTIVE],
                    pairs[0][0],
                    pairs[-1][1],
                    run_id=r.run_id,
                    detail={
                        "period_s": r.workload.eval_period_s,
                        "pauses": [[rfc3339(a), rfc3339(b)] for a, b in pairs],
                    },
                )
            )
        if r.workload.kind == "serving":
            lab.hard_negatives.append(
                HardNegative(
                    "steady_low_utilisation",
                    [STARVATION, STRAGGLER],
                    r.train_start,
                    end,
                    run_id=r.run_id,
                    detail={"busy_fraction": r.workload.busy_fraction},
                )
            )
        prof = plan.gpus[int(r.gpu_idx[0])].profile if r.gpu_idx.size else None
        if prof is not None and len(r.gpu_idx) > 1:
            # Collectives over PCIe on a board without NVLink are how it works, not a fault;
            # GPUs that serve independently move nothing over NVLink.
            if prof.nvlink_links == 0:
                lab.hard_negatives.append(
                    HardNegative(
                        "no_nvlink",
                        [NVLINK_DEGRADED],
                        r.start,
                        end,
                        run_id=r.run_id,
                        detail={"gpu_model": prof.key},
                    )
                )
            elif r.workload.kind == "serving":
                lab.hard_negatives.append(
                    HardNegative("no_collectives", [NVLINK_DEGRADED], r.start, end, run_id=r.run_id)
                )
    for gp in plan.gpus:
        held = IntervalSet((r.start, r.end_or(plan.t_end)) for r in plan.runs if gp.idx in r.gpu_idx)
        for s, e in IntervalSet([(plan.t0, plan.t_end)]).minus(held).pairs():
            if e - s < IDLE_NEGATIVE_MIN_S:
                continue
            lab.hard_negatives.append(
                HardNegative(
                    "idle_unallocated",
                    [STARVATION, STRAGGLER, THROTTLING, PCIE_DEGRADED],
                    s,
                    e,
                    node=gp.node,
                    gpu=gp.gpu,
                )
            )


def _events(plan: FleetPlan, lab: Labels) -> None:
    for ev in plan.resets:
        for gi in ev.gpu_idx.tolist():
            gp = plan.gpus[gi]
            lab.events.append(
                Event(
                    "counter_reset",
                    ev.time,
                    ev.time + ev.gap_s,
                    node=gp.node,
                    gpu=gp.gpu,
                    detail={"gap_s": ev.gap_s},
                )
            )
    for node, gaps in plan.node_gaps.items():
        for s, e in gaps.pairs():
            lab.events.append(Event("sample_gap", s, e, node=node))
    for x in plan.xids:
        gp = plan.gpus[x.gpu_idx]
        lab.events.append(Event("xid", x.time, None, node=gp.node, gpu=gp.gpu, detail={"code": x.code}))
    lab.events.sort(key=lambda e: (e.start, e.type, e.node or "", e.gpu or -1))
