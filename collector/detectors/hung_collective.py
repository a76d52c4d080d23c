"""Hung collectives: every working rank of a run spins in a collective that never completes.

Run-scoped.  When one rank of a synchronous job dies or blocks (a crashed
process, a stuck data loader, a deadlock), every other rank enters the next
collective and spins in it until NCCL's timeout, often 10 to 30 minutes:
GPU-Util reads ~100 % (a kernel is resident) while SM activity and board
power sit at their idle levels and the job makes no progress.  GPU-Util alone
calls that full use; it is the costliest waste to miss because every GPU of
the job is held.

A sample *spins* when a kernel is resident (``hung_util_pct``), SM activity is
near zero where reported (``hung_max_sm_active``) and power is at the GPU's
idle level (``hung_max_power_frac`` of its reference; see
:mod:`.held`).  The run is hung when, for ``hung_min_s`` up to now, each of its
GPUs spins or runs nothing (``hung_min_share`` of the stretch), at least
``hung_min_spinning_share`` of them spin, and the run reported no tokens over
the stretch where it reports progress at all.  The ranks that run nothing
among the spinners are named: the rank that died or blocked.

A checkpoint's waiting ranks spin for seconds to a couple of minutes, well
below ``hung_min_s``; a run whose GPUs all run nothing is idle
(:mod:`.idle_allocation`), not hung.
"""

from __future__ import annotations

import math

import numpy as np

from gpufleet.collector.detectors.fabric import collective_network_cause
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.held import kernel_resident, no_kernel, no_work, run_spans, spin_power
from gpufleet.collector.detectors.stats import num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import HungCollectiveEvidence, SpinningGpu
from gpufleet.timeparse import rfc3339

KIND = "hung_collective"


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not window.runs:
        return []
    cfg = config
    a, b = run_spans(fr)
    in_span = fr.range_mask(a, b)
    weight = fr.w * in_span
    nk = no_kernel(fr)
    cand = np.flatnonzero(kernel_resident(fr) & in_span)
    spin = np.zeros(fr.size, dtype=bool)
    power_known = np.zeros(fr.size, dtype=bool)
    if cand.size:
        idle_power, known = spin_power(fr, cand)
        # Where power cannot be judged against a reference the sample stays a candidate: the
        # run-level check below compares it with the run's dead ranks instead.
        spin[cand] = no_work(fr, cand) & (idle_power | ~known)
        power_known[cand] = known
    stopped = nk | spin
    ep = fr.trailing_episode(weight, stopped, cfg.hung_min_share)
    has = b > a
    last_t = np.full(fr.rows, np.nan)
    last_end = np.full(fr.rows, np.nan)
    last_t[has] = fr.time(b[has] - 1)
    last_end[has] = last_t[has] + fr.w_all[b[has] - 1]
    slop = cfg.edge_samples * fr.dt
    now = has & np.isfinite(ep.onset) & (ep.last >= last_t - slop)
    out: list[Finding] = []
    for ri, rows in sorted(fr.run_rows.items()):
        rows = rows[has[rows]]
        if rows.size == 0 or not now[rows].all():
            continue
        onset = float(np.max(ep.onset[rows]))
        hung_s = float(np.min(last_end[rows])) - onset
        if hung_s < cfg.hung_min_s - float(np.max(slop[rows])):
            continue
        f = _judge(fr, ri, rows, onset, hung_s, a, b, nk, spin, power_known)
        if f is not None:
            out.append(f)
    return out


def _judge(
    fr: Frame,
    ri: int,
    rows: np.ndarray,
    onset: float,
    hung_s: float,
    a: np.ndarray,
    b: np.ndarray,
    nk: np.ndarray,
    spin: np.ndarray,
    power_known: np.ndarray,
) -> Finding | None:
    cfg = fr.config
    run = fr.window.runs[ri]
    start = fr.index_at(np.full(fr.rows, onset), "left")
    spinners: list[int] = []
    dead: list[int] = []
    unjudged: list[int] = []
    for r in rows.tolist():
        sl = slice(int(max(a[r], start[r])), int(b[r]))
        n = max(sl.stop - sl.start, 1)
        if float(spin[sl].sum()) / n >= cfg.majority_share:
            spinners.append(r)
            if float(power_known[sl].sum()) / n < cfg.majority_share:
                unjudged.append(r)
        elif float(nk[sl].sum()) / n >= cfg.majority_share:
            dead.append(r)
    need = max(1, math.ceil(cfg.hung_min_spinning_share * rows.size - 1e-9))
    if len(spinners) < need:
        return None
    basis = "power_frac"
    if unjudged:
        # No reference for these spinners' power: idle-level only next to the dead ranks' idle power.
        dead_w = _median_power(fr, dead, start, a, b)
        spin_w = _median_power(fr, unjudged, start, a, b)
        if dead_w is None or spin_w is None or spin_w > cfg.hung_idle_power_ratio * dead_w:
            return None
        basis = "dead_rank_power"
    tokens = run.tokens_between(onset, fr.window.t_end)
    if tokens is not None and tokens > 0:
        return None
    spinning: list[SpinningGpu] = []
    for r in sorted(spinners, key=lambda r: fr.keys[r]):
        sl = slice(int(max(a[r], start[r])), int(b[r]))
        idx = np.arange(sl.start, sl.stop)
        node, gpu = fr.keys[r]
        spinning.append(
            {
                "node": node,
                "gpu": int(gpu),
                "util_pct": _med(fr.at("util_pct", idx)),
                "power_w": _med(fr.at("power_w", idx)),
                "power_frac": _med(fr.power_frac(idx)),
                "sm_active": _med(fr.at("sm_active", idx)),
            }
        )
    evidence: HungCollectiveEvidence = {
        "hung_s": round(hung_s, 1),
        "since": rfc3339(onset),
        "spinning_gpus": spinning,
        "dead_gpus": [f"{fr.keys[r][0]}/{fr.keys[r][1]}" for r in sorted(dead, key=lambda r: fr.keys[r])],
        "gpu_count": int(rows.size),
        "power_basis": basis,
        "progress_tokens": num(tokens),
        "activity_basis": fr.activity_basis(rows),
    }
    nf = collective_network_cause(
        {k[0] for k in run.allocations}, fr.window.hosts, onset, fr.window.t_end, cfg
    )
    if nf is not None:
        evidence["network_reason"] = nf.reason
        evidence["network_nodes"] = nf.nodes
    last = float(np.max(fr.time(b[rows] - 1)))
    return Finding(KIND, None, "critical", onset, evidence, run_id=run.run_id, last_active=last)


def _med(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return num(float(np.median(x))) if x.size else None


def _median_power(
    fr: Frame, rows: list[int], start: np.ndarray, a: np.ndarray, b: np.ndarray
) -> float | None:
    if not rows:
        return None
    parts = [fr.at("power_w", np.arange(int(max(a[r], start[r])), int(b[r]))) for r in rows]
    return _med(np.concatenate(parts)) if parts else None
