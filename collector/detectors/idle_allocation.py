"""Idle allocations: a run holds GPUs that do no work.

Run-scoped.  The commonest waste of a GPU fleet: a notebook left open, a job
whose data loader died while the process lives on, a job that asked for eight
GPUs and uses six.  A GPU of a run is *idle* while no kernel runs on it
(:func:`gpufleet.collector.detectors.held.no_kernel`) for at least
``idle_min_share`` of a stretch that reaches the present (a monitoring probe
waking it for a sample does not end it).  Reported when:

* ``scope = "all"``: every GPU of the run has idled for ``idle_min_s``;
* ``scope = "some"``: some GPUs have idled for ``idle_min_s`` since the start
  of the run (or of the window, when the run began before it) while the
  others work.  GPUs that stop mid-run while their peers spin in a collective
  are a hang (:mod:`.hung_collective`), not this.

The idle stretch is counted over the run's own span, warm-up included: a run
that never computes idles from its start.  Model loading, evaluation and
checkpoint pauses last seconds to minutes and stay below ``idle_min_s``.
GPUs that no run holds are the fleet's spare capacity, never an incident.  The
incident ends when work resumes or the run ends (the run's span ends there).
"""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.held import no_kernel, run_spans
from gpufleet.collector.detectors.stats import num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import IdleAllocationEvidence, IdleGpu
from gpufleet.timeparse import rfc3339

KIND = "idle_allocation"


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not window.runs:
        return []
    cfg = config
    a, b = run_spans(fr)
    weight = fr.w * fr.range_mask(a, b)
    idle = no_kernel(fr)
    ep = fr.trailing_episode(weight, idle, cfg.idle_min_share)
    # What the row's span holds: its first and last sample, for "since the start" and "now".
    has = b > a
    first_t = np.full(fr.rows, np.nan)
    last_t = np.full(fr.rows, np.nan)
    first_t[has] = fr.time(a[has])
    last_end = np.full(fr.rows, np.nan)
    last_t[has] = fr.time(b[has] - 1)
    last_end[has] = last_t[has] + fr.w_all[b[has] - 1]
    slop = cfg.edge_samples * fr.dt
    idle_s = last_end - ep.onset
    # The stretch reaches the present (work resumed ends it at once) and lasted long enough.
    now_idle = has & np.isfinite(ep.onset) & (ep.last >= last_t - slop)
    long_enough = now_idle & (idle_s >= cfg.idle_min_s - slop)
    from_start = now_idle & (ep.onset <= first_t + slop)
    busy_s = fr.row_sum(fr.w_busy * (weight > 0))
    out: list[Finding] = []
    for ri, rows in sorted(fr.run_rows.items()):
        rows = rows[has[rows]]
        if rows.size == 0:
            continue
        idle_rows = rows[long_enough[rows]]
        if idle_rows.size == 0:
            continue
        if idle_rows.size == rows.size:
            scope = "all"
        else:
            idle_rows = idle_rows[from_start[idle_rows]]
            working = rows[~now_idle[rows]]
            # The others must work, not spin: peers of a dead rank that spin are a hang.
            if idle_rows.size == 0 or not _working(fr, working, idle_rows, busy_s, a, b):
                continue
            scope = "some"
        out.append(_finding(fr, ri, rows, idle_rows, scope, ep.onset, idle_s, ep.last, a, b))
    return out


def _working(
    fr: Frame, working: np.ndarray, idle_rows: np.ndarray, busy_s: np.ndarray, a: np.ndarray, b: np.ndarray
) -> bool:
    """Whether the run's other GPUs work while ``idle_rows`` idle: busy for a good part of the
    stretch, and, where power is reported, drawing clearly more than the idle GPUs (GPUs spinning in
    a collective read busy by GPU-Util alone, at their idle power)."""
    cfg = fr.config
    busy = working[busy_s[working] >= cfg.majority_share * cfg.idle_min_s]
    if busy.size == 0:
        return False
    idle_w = _median_power(fr, idle_rows, a, b)
    work_w = _median_power(fr, busy, a, b)
    return idle_w is None or work_w is None or work_w > cfg.hung_idle_power_ratio * idle_w


def _median_power(fr: Frame, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> float | None:
    parts = [fr.at("power_w", np.arange(int(a[r]), int(b[r]))) for r in rows.tolist()]
    x = np.concatenate(parts) if parts else np.zeros(0)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else None


def _finding(
    fr: Frame,
    ri: int,
    rows: np.ndarray,
    idle_rows: np.ndarray,
    scope: str,
    onset: np.ndarray,
    idle_s: np.ndarray,
    last: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
) -> Finding:
    w = fr.window
    gpus: list[IdleGpu] = []
    for r in sorted(idle_rows.tolist(), key=lambda r: fr.keys[r]):
        node, gpu = fr.keys[r]
        sl = slice(int(a[r]), int(b[r]))
        t = fr.time(sl)
        since = t >= onset[r]

        def med(name: str, r: int = r, sl: slice = sl, since: np.ndarray = since) -> float | None:
            x = fr.series[r].get(name)[sl.start - int(fr.offsets[r]) : sl.stop - int(fr.offsets[r])][since]
            x = x[np.isfinite(x)]
            return num(float(np.median(x))) if x.size else None

        gpus.append(
            {
                "node": node,
                "gpu": int(gpu),
                "since": rfc3339(float(onset[r])),
                "idle_s": round(float(idle_s[r]), 1),
                "util_pct": med("util_pct"),
                "power_w": med("power_w"),
                "mem_used_mib": med("mem_used_mib"),
            }
        )
    start = float(np.min(onset[idle_rows]))
    evidence: IdleAllocationEvidence = {
        "scope": "all" if scope == "all" else "some",
        "gpus": gpus,
        "idle_gpus": int(idle_rows.size),
        "gpu_count": int(rows.size),
        "idle_s": round(float(np.max(idle_s[idle_rows])), 1),
        "since_before_window": bool(
            start <= w.t_start + fr.config.edge_samples * float(np.max(fr.dt[idle_rows]))
        ),
        "activity_basis": fr.activity_basis(idle_rows),
    }
    lasts = last[idle_rows]
    return Finding(
        KIND,
        None,
        "warning",
        start,
        evidence,
        run_id=w.runs[ri].run_id,
        last_active=float(np.max(lasts)) if np.isfinite(lasts).any() else None,
    )
