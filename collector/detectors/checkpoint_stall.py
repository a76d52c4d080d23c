"""Checkpoint stalls: periodic job-wide pauses while the job writes its state.

Run-scoped.  A job-wide pause is a stretch of at least ``ckpt_min_pause_s``
during which at least ``ckpt_min_gpu_share`` of the run's GPUs are idle
together (intervals of the idle phases intersected with a sweep line, so
GPUs sampled on different clocks still line up).  Reported when there are at
least ``ckpt_min_pauses`` such pauses, regularly spaced when there are
several (MAD / median spacing at most ``ckpt_max_period_cv``), costing at
least ``ckpt_min_lost_share`` of the run's time (median pause / period, or
the pause's share of the window when only one is in view: checkpoints are
often further apart than a window), and a host of the run writes in bursts
during them: disk or network write rate at least ``ckpt_write_ratio`` times
the rate while busy and at least ``ckpt_min_write_bytes_s``.

Without host write rates nothing is reported: a periodic pause alone may be
an evaluation, and the write burst is what makes it a checkpoint.
"""

from __future__ import annotations

import math

import numpy as np

from collector.detectors.config import DetectorConfig
from collector.detectors.frame import Frame
from collector.detectors.hosts import write_burst
from collector.detectors.stats import num
from collector.detectors.window import Finding, Window

KIND = "checkpoint_stall"


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not window.runs:
        return []
    cfg = config
    ph = fr.phases
    lo, hi = fr.region
    c0 = np.fmax(ph.t0, lo[ph.row])
    c1 = np.fmin(ph.t1, hi[ph.row])
    long_idle = (ph.state == 0) & (ph.dur > 0) & (c1 - c0 >= cfg.ckpt_min_pause_s) & (ph.t0 >= lo[ph.row])
    n_long = np.bincount(ph.row[long_idle], minlength=fr.rows)
    cand = (n_long >= cfg.ckpt_min_pauses) & (fr.run_of_row >= 0)
    out = []
    for ri in sorted(set(fr.run_of_row[cand].tolist())):
        rows = fr.run_rows[ri]
        rows = rows[np.isfinite(lo[rows]) & (hi[rows] > lo[rows])]
        need = max(1, math.ceil(cfg.ckpt_min_gpu_share * rows.size - 1e-9))
        if rows.size == 0 or int(cand[rows].sum()) < need:
            continue
        f = _judge_run(fr, ri, rows, need)
        if f is not None:
            out.append(f)
    return out


def job_wide_idle(fr: Frame, rows: np.ndarray, need: int) -> list[tuple[float, float]]:
    """Stretches during which at least ``need`` of ``rows`` are idle together."""
    starts, ends = [], []
    for r in rows:
        ph = fr.region_phases(int(r))
        idle = ph.state == 0
        starts.append(ph.t0[idle])
        ends.append(ph.t1[idle])
    t0 = np.concatenate(starts) if starts else np.zeros(0)
    t1 = np.concatenate(ends) if ends else np.zeros(0)
    if t0.size == 0:
        return []
    tt = np.concatenate([t0, t1])
    dd = np.concatenate([np.ones(t0.size, dtype=np.int64), -np.ones(t1.size, dtype=np.int64)])
    order = np.lexsort((dd, tt))
    tt, dd = tt[order], dd[order]
    cover = np.cumsum(dd)
    up = np.flatnonzero((cover >= need) & (np.concatenate([[0], cover[:-1]]) < need))
    down = np.flatnonzero((cover < need) & (np.concatenate([[0], cover[:-1]]) >= need))
    spans = [(float(tt[u]), float(tt[d])) for u, d in zip(up, down, strict=False)]
    # Unsynchronised sampling splits one pause into slivers; join them.
    tol = 2.0 * float(np.max(fr.dt[rows]))
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a - merged[-1][1] <= tol:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _judge_run(fr: Frame, ri: int, rows: np.ndarray, need: int) -> Finding | None:
    cfg = fr.config
    window = fr.window
    lo = float(np.min(fr.region[0][rows]))
    hi = float(np.max(fr.region[1][rows]))
    edge = float(np.max(fr.dt[rows]))
    pauses = [
        (a, b) for a, b in job_wide_idle(fr, rows, need)
        if b - a >= cfg.ckpt_min_pause_s and a > lo + edge
    ]
    if not pauses or len(pauses) < cfg.ckpt_min_pauses:
        return None
    starts = np.array([p[0] for p in pauses])
    lengths = np.array([p[1] - p[0] for p in pauses])
    # A pause still under way at the window's end has no known length yet.
    done = np.array([b < hi - edge for _, b in pauses])
    pause_s = float(np.median(lengths[done] if done.any() else lengths))
    period: float | None = None
    if len(pauses) >= 2:
        spacing = np.diff(starts)
        period = float(np.median(spacing))
        if not period > 0:
            return None
        cv = float(np.median(np.abs(spacing - period))) / period
        if cv > cfg.ckpt_max_period_cv:
            return None
        if window.t_end - float(starts[-1]) > max(1.5 * period + pause_s, cfg.active_within_s):
            return None
        lost = min(pause_s / period, 1.0)
    else:
        # One pause in view (checkpoints further apart than the window): its
        # share of the run's time in the window.
        lost = min(float(lengths.sum()) / max(hi - lo, 1e-9), 1.0)
    if lost < cfg.ckpt_min_lost_share:
        return None
    nodes = sorted({fr.keys[int(r)][0] for r in rows})
    wb = write_burst(window, nodes, pauses, lo, hi)
    if wb is None or not wb.is_burst(cfg):
        return None
    evidence = {
        "period_s": num(period),
        "pause_s": num(pause_s),
        "pauses": len(pauses),
        "run_time_lost_share": num(lost),
        "write_bytes_s": num(wb.pause_bytes_s),
        "write_bytes_s_busy": num(wb.busy_bytes_s),
        "write_path": wb.path,
        "host": wb.node,
        "gpu_count": int(rows.size),
    }
    severity = "critical" if lost >= 0.25 else "warning"
    last = float(pauses[-1][1])
    # The next checkpoint may be a period away, or out of view of this window.
    hold = 1.5 * period if period is not None else window.t_end - window.t_start
    return Finding(KIND, None, severity, float(starts[0]), evidence, run_id=window.runs[ri].run_id,
                   last_active=last, hold_s=hold)
