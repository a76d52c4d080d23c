"""Checkpoint stalls: job-wide pauses while the job's state is written.

Run-scoped.  A GPU is *paused* while its activity is at most
``ckpt_pause_activity`` or its board power is at most
``ckpt_pause_power_share`` of its own busy level in the window (ranks spinning
in a collective keep GPU-Util at 100 %, and on older and consumer boards draw
half their training power: only the GPU's own levels tell, never one model's
watts).  A job-wide pause is a stretch of at least ``ckpt_min_pause_s`` (and
``ckpt_min_pause_samples`` samples) during which at least
``ckpt_min_gpu_share`` of the run's GPUs are paused together (per-GPU paused
stretches intersected with a sweep line, so GPUs sampled on different clocks
still line up).  Between pauses the job must be working
(``ckpt_min_busy_share`` of the rest busy).  Pauses are judged by what they
cost, not by their length: a job that checkpoints after every step pauses a
second or two each time and may lose a quarter of its GPU time.

What makes a pause a checkpoint, strongest first (``evidence.signature``):

* ``host_write`` (``basis = "gpu+host"``) — a host of the run writes in
  bursts during the pauses: disk or network write rate at least
  ``ckpt_write_ratio`` times the rate while busy and at least
  ``ckpt_min_write_bytes_s``.  Host write rates that show *no* burst rule a
  checkpoint out: that is an evaluation pause.
* ``writer`` (``basis = "gpu_only"``) — no host write rates, but the
  blocked-rank signature of a synchronous job: during the pauses one or a few
  ranks (at most ``ckpt_max_blocker_share`` of the run and one per node) run
  no kernel at all while the others keep one resident (NCCL spinning in the
  next collective, waiting for them), and it is the same rank in
  ``ckpt_min_same_writer`` of the pauses: the writer, commonly rank 0.
  Evaluation pauses and input waits leave no such rank.
* ``sharded_d2h`` — every rank pauses at once and none spins (FSDP or
  distributed checkpointing: each rank copies its shard out), and the ranks'
  PCIe transmit during the pauses is a one-sided device-to-host copy
  (``ckpt_d2h_ratio`` times the receive, at least ``ckpt_min_d2h_bytes_s``).
* ``sharded_sync`` — the same with no PCIe counters at all (an nvidia-smi
  loop): every rank idles at once, in a lone pause (an input stall repeats) or
  at a regular spacing slower than any input stall (``starve_max_period_s``).

A pause still under way is not yet a checkpoint (a rank that died while its
peers spin looks the same until then, and is a hang).  Pauses are reported one
or periodic: regularly spaced when there are several (MAD / median spacing at
most ``ckpt_max_period_cv``), costing at least ``ckpt_min_lost_share`` of the
run's time (median pause / period, or the pauses' share of the window when one
is in view: checkpoints are often further apart than a window).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.hosts import write_burst
from gpufleet.collector.detectors.stats import num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import CheckpointStallEvidence

KIND = "checkpoint_stall"


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    return [f for f in run_findings(fr).values() if f is not None]


def run_findings(fr: Frame) -> dict[int, Finding | None]:
    """The checkpoint finding of every run with data (None: no stall),
    computed once per frame: starvation asks it too, so that a pattern is
    claimed by one detector only."""
    if fr.shared.checkpoint_findings is not None:
        return fr.shared.checkpoint_findings
    out: dict[int, Finding | None] = {}
    fr.shared.checkpoint_findings = out
    if fr.rows == 0 or not fr.window.runs:
        return out
    cfg = fr.config
    paused = fr.pause_mask
    wreg = fr.region_weights()
    paused_s = fr.row_sum(wreg * paused)
    min_pause = min_pause_s(fr)
    lo, hi = fr.region
    for ri, rows in sorted(fr.run_rows.items()):
        rows = rows[np.isfinite(lo[rows]) & (hi[rows] > lo[rows])]
        need = max(1, math.ceil(cfg.ckpt_min_gpu_share * rows.size - 1e-9))
        if rows.size == 0 or int((paused_s[rows] >= min_pause[rows]).sum()) < need:
            continue
        out[ri] = _judge_run(fr, ri, rows, need, paused)
    return out


def min_pause_s(fr: Frame) -> np.ndarray:
    """Per row, the shortest pause counted: ``ckpt_min_pause_s`` or ``ckpt_min_pause_samples`` intervals."""
    cfg = fr.config
    return np.maximum(cfg.ckpt_min_pause_s, cfg.ckpt_min_pause_samples * fr.dt)


def paused_spans(fr: Frame, rows: np.ndarray, paused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The maximal ``paused`` stretches of ``rows`` inside their run regions, as ``(t0, t1)`` arrays
    (a gap in the data or the end of a row ends a stretch), every row's at once."""
    idx, seg, _ = fr.region_samples(rows)
    if idx.size == 0:
        return np.zeros(0), np.zeros(0)
    p = paused[idx]
    head = p.copy()
    head[1:] &= seg[1:] | ~p[:-1]
    starts = np.flatnonzero(head)
    if starts.size == 0:
        return np.zeros(0), np.zeros(0)
    # Each stretch ends at its last paused sample before a non-paused one or a new segment.
    brk = np.flatnonzero(~p | seg)
    j = np.searchsorted(brk, starts, side="right")
    ends = np.where(j < brk.size, brk[np.minimum(j, brk.size - 1)] - 1, p.size - 1)
    return fr.time(idx[starts]), fr.time(idx[ends]) + fr.w_all[idx[ends]]


def job_wide_pauses(
    fr: Frame, rows: np.ndarray, need: int, paused: np.ndarray | None = None
) -> list[tuple[float, float]]:
    """Stretches during which at least ``need`` of ``rows`` are paused together."""
    t0, t1 = paused_spans(fr, rows, fr.pause_mask if paused is None else paused)
    if t0.size == 0:
        return []
    tt = np.concatenate([t0, t1])
    dd = np.concatenate([np.ones(t0.size, dtype=np.int64), -np.ones(t1.size, dtype=np.int64)])
    order = np.lexsort((dd, tt))
    tt, dd = tt[order], dd[order]
    cover = np.cumsum(dd)
    prev = np.concatenate([[0], cover[:-1]])
    up = np.flatnonzero((cover >= need) & (prev < need))
    down = np.flatnonzero((cover < need) & (prev >= need))
    spans = [(float(tt[u]), float(tt[d])) for u, d in zip(up, down, strict=False)]
    # Unsynchronised sampling splits one pause into slivers; join them.
    tol = fr.config.edge_samples * float(np.max(fr.dt[rows]))
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a - merged[-1][1] <= tol:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def with_a_rank_idle(
    fr: Frame, rows: np.ndarray, spans: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of ``spans`` during which at least one of ``rows`` does no work by its activity.

    Power alone marks ranks spinning in a collective as paused, but every
    rank of a job working under a lowered power limit draws as little (a
    power-capped H100 runs at 100 % GPU-Util on 445 W of its 690 W): a
    checkpoint always has a rank writing rather than computing, a job held
    at a power cap has none."""
    idle = job_wide_pauses(fr, rows, 1, fr.paused)
    out: list[tuple[float, float]] = []
    j = 0
    for a, b in spans:
        while j < len(idle) and idle[j][1] <= a:
            j += 1
        k = j
        while k < len(idle) and idle[k][0] < b:
            lo, hi = max(a, idle[k][0]), min(b, idle[k][1])
            if hi > lo:
                out.append((lo, hi))
            k += 1
    return out


@dataclass
class Blocking:
    """The blocked-rank signature over a run's pauses."""

    #: Row of the rank that blocked most often (None: no signature).
    writer: int | None
    #: Share of the pauses in which the writer blocked while peers spun.
    same_share: float
    #: Rows that blocked in at least half of the pauses.
    blockers: list[int]
    #: Median number of ranks spinning in a pause.
    spinning: float


def blocking(fr: Frame, rows: np.ndarray, pauses: list[tuple[float, float]]) -> Blocking:
    """Which ranks ran no kernel at all during each pause while the others
    kept one resident (see the module doc)."""
    cfg = fr.config
    max_block = max(1, math.floor(cfg.ckpt_max_blocker_share * rows.size + 1e-9))
    node_of = [fr.keys[int(r)][0] for r in rows.tolist()]
    counts: Counter[int] = Counter()
    spinning: list[int] = []
    signed = 0
    rl = rows.tolist()
    # Per pause and rank, the share of its readable samples in [a, b) with a kernel resident
    # (NaN: none readable), from running sums: the readings are 0 or 1, so the sums are exact.
    lo = np.array([a for a, _ in pauses], dtype=np.float64)
    hi = np.array([b for _, b in pauses], dtype=np.float64)
    share = np.full((len(pauses), len(rl)), np.nan)
    for k, r in enumerate(rl):
        t = fr.row_times(r)
        res = fr.kernel_resident(r)
        ok = np.isfinite(res)
        ones = np.concatenate([[0.0], np.cumsum(np.where(ok, res, 0.0))])
        seen = np.concatenate([[0], np.cumsum(ok)])
        ia, ib = np.searchsorted(t, lo, side="left"), np.searchsorted(t, hi, side="left")
        ib = np.maximum(ia, ib)
        cnt = seen[ib] - seen[ia]
        with np.errstate(invalid="ignore", divide="ignore"):
            share[:, k] = np.where(cnt > 0, (ones[ib] - ones[ia]) / cnt, np.nan)
    for p in range(len(pauses)):
        ks = np.flatnonzero(share[p] < cfg.majority_share).tolist()
        blk = [rl[k] for k in ks]
        spin = int((share[p] >= cfg.majority_share).sum())
        spinning.append(spin)
        one_per_node = len({node_of[k] for k in ks}) == len(ks)
        if 1 <= len(blk) <= max_block and one_per_node and spin >= 1:
            signed += 1
            counts.update(blk)
    if not counts or not pauses:
        return Blocking(None, 0.0, [], float(np.median(spinning)) if spinning else 0.0)
    writer, hits = counts.most_common(1)[0]
    blockers = sorted(r for r, c in counts.items() if c >= cfg.majority_share * len(pauses))
    return Blocking(writer, hits / len(pauses), blockers, float(np.median(spinning)))


def _judge_run(fr: Frame, ri: int, rows: np.ndarray, need: int, paused: np.ndarray) -> Finding | None:
    cfg = fr.config
    window = fr.window
    lo = float(np.min(fr.region[0][rows]))
    hi = float(np.max(fr.region[1][rows]))
    edge = float(np.max(fr.dt[rows]))
    shortest = float(np.max(min_pause_s(fr)[rows]))
    pauses = [
        (a, b)
        for a, b in with_a_rank_idle(fr, rows, job_wide_pauses(fr, rows, need, paused))
        if b - a >= shortest and a > lo + edge
    ]
    if not pauses or len(pauses) < cfg.ckpt_min_pauses:
        return None
    if _busy_share_between(fr, rows, pauses) < cfg.ckpt_min_busy_share:
        return None
    starts = np.array([p[0] for p in pauses])
    lengths = np.array([p[1] - p[0] for p in pauses])
    # A pause still under way at the window's end has no known length yet.
    done = np.array([b < hi - edge for _, b in pauses])
    if not done.any():
        # A pause still under way is not yet a checkpoint: a rank that died while its peers spin
        # looks the same until the pause ends, and then it is a hang (hung_collective).
        return None
    pause_s = float(np.median(lengths[done]))
    period: float | None = None
    if len(pauses) >= 2:
        spacing = np.diff(starts)
        period = float(np.median(spacing))
        if not period > 0:
            return None
        cv = float(np.median(np.abs(spacing - period))) / period
        if cv > cfg.ckpt_max_period_cv:
            return None
        if window.t_end - float(starts[-1]) > max(
            cfg.ckpt_hold_periods * period + pause_s, cfg.active_within_s
        ):
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
    # Host write rates exist: they decide.  No burst: an evaluation pause (or an input stall),
    # and the ranks' blocking, asked of every GPU of the run, need not be worked out.
    if wb is not None and not wb.is_burst(cfg):
        return None
    blk = blocking(fr, rows, pauses)
    basis: Literal["gpu+host", "gpu_only"]
    signature: Literal["host_write", "writer", "sharded_d2h", "sharded_sync"]
    d2h: float | None = None
    if wb is not None:
        basis, signature = "gpu+host", "host_write"
    elif rows.size >= 2 and blk.writer is not None and blk.same_share >= cfg.ckpt_min_same_writer:
        basis, signature = "gpu_only", "writer"
    else:
        sharded = _sharded(fr, rows, pauses, blk, period, hi - lo)
        if sharded is None:
            return None
        basis, (signature, d2h) = "gpu_only", sharded
    writer = (
        _gpu_name(fr, blk.writer)
        if blk.writer is not None and blk.same_share >= cfg.ckpt_min_same_writer
        else None
    )
    evidence: CheckpointStallEvidence = {
        "basis": basis,
        "signature": signature,
        "d2h_bytes_s": num(d2h),
        "period_s": num(period),
        "pause_s": num(pause_s),
        "pauses": len(pauses),
        "run_time_lost_share": num(lost),
        "writer_gpu": writer,
        "blocking_gpus": [_gpu_name(fr, r) for r in blk.blockers] if writer else [],
        "writer_same_share": num(blk.same_share),
        "spinning_gpus": num(blk.spinning),
        "write_bytes_s": num(wb.pause_bytes_s) if wb else None,
        "write_bytes_s_busy": num(wb.busy_bytes_s) if wb else None,
        "write_path": wb.path if wb else None,
        "host": wb.node if wb else None,
        "gpu_count": int(rows.size),
        "activity_basis": fr.activity_basis(rows),
    }
    severity = "critical" if lost >= cfg.ckpt_critical_lost_share else "warning"
    last = float(pauses[-1][1])
    # The next checkpoint may be a period away, or out of view of this window.
    hold = cfg.ckpt_hold_periods * period if period is not None else window.t_end - window.t_start
    return Finding(
        KIND,
        None,
        severity,
        float(starts[0]),
        evidence,
        run_id=window.runs[ri].run_id,
        last_active=last,
        hold_s=hold,
    )


def _sharded(
    fr: Frame,
    rows: np.ndarray,
    pauses: list[tuple[float, float]],
    blk: Blocking,
    period: float | None,
    span_s: float,
) -> tuple[Literal["sharded_d2h", "sharded_sync"], float | None] | None:
    """Every rank idle at once, none spinning (each copies its shard out): the device-to-host copy
    where PCIe counters exist, else the regular spacing of pauses slower than any input stall."""
    cfg = fr.config
    if blk.spinning > 0 or rows.size < 2:
        return None
    copy = copy_out(fr, rows, pauses)
    if copy is not None:
        return ("sharded_d2h", copy) if copy > 0 else None
    # No PCIe counters: pauses spaced slower than any input stall, or a lone pause in a stretch of
    # work long enough that an input stall would have repeated in it (one each starve_max_period_s
    # at the slowest, on either side).
    if period is not None and period > cfg.starve_max_period_s:
        return "sharded_sync", None
    lone = len(pauses) == 1 and span_s - (pauses[0][1] - pauses[0][0]) >= 2.0 * cfg.starve_max_period_s
    return ("sharded_sync", None) if lone else None


def copy_out(fr: Frame, rows: np.ndarray, spans: list[tuple[float, float]]) -> float | None:
    """The ranks' mean PCIe transmit over ``spans`` where it is a device-to-host copy (at least
    ``ckpt_min_d2h_bytes_s`` and ``ckpt_d2h_ratio`` times the receive); 0.0 where the counters show none;
    None where no GPU of ``rows`` reports PCIe transmit."""
    cfg = fr.config
    tx = _mean_in(fr, rows, spans, "pcie_tx_bytes_s")
    if tx is None:
        return None
    rx = _mean_in(fr, rows, spans, "pcie_rx_bytes_s")
    return tx if tx >= cfg.ckpt_min_d2h_bytes_s and tx >= cfg.ckpt_d2h_ratio * (rx or 0.0) else 0.0


def _mean_in(fr: Frame, rows: np.ndarray, spans: list[tuple[float, float]], name: str) -> float | None:
    """Mean of column ``name`` over ``rows``' samples inside ``spans`` (None: never reported there)."""
    a0 = np.array([a for a, _ in spans])
    b0 = np.array([b for _, b in spans])
    vals: list[np.ndarray] = []
    for r in rows.tolist():
        x = fr.series[r].cols.get(name)
        if x is None:
            continue
        t = fr.series[r].t
        i = np.searchsorted(a0, t, side="right") - 1
        inside = (i >= 0) & (t < b0[np.maximum(i, 0)])
        v = np.asarray(x[inside], dtype=np.float64)
        vals.append(v[np.isfinite(v)])
    allv = np.concatenate(vals) if vals else np.zeros(0)
    return float(allv.mean()) if allv.size else None


def _busy_share_between(fr: Frame, rows: np.ndarray, pauses: list[tuple[float, float]]) -> float:
    """Busy share of the run's GPU time outside the pauses: a job that
    mostly idles has no checkpoint stalls, only idleness."""
    p0 = np.array([p[0] for p in pauses])
    p1 = np.array([p[1] for p in pauses])
    idx, _, _ = fr.region_samples(rows)
    t = fr.time(idx)
    i = np.searchsorted(p0, t, side="right") - 1
    w = np.where((i >= 0) & (t < p1[np.maximum(i, 0)]), 0.0, fr.w[idx].astype(np.float64))
    tot = float(w.sum())
    busy = float(w[fr.busy[idx]].sum())
    return busy / tot if tot > 0 else 0.0


def _gpu_name(fr: Frame, r: int) -> str:
    node, gpu = fr.keys[r]
    return f"{node}/{gpu}"
