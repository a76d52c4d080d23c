"""Throttling: a busy GPU whose clocks are held down, and why.

GPU-scoped.  A busy sample is throttled when its SM clock is below
``throttle_clock_ratio`` of the maximum (or the clock is not reported) and a
clocks-event reason bit says why: SW power cap (0x4) -> ``power_cap``, SW/HW
thermal (0x20, 0x40) -> ``thermal``, HW power brake (0x80) -> ``power_brake``,
HW slowdown (0x8) -> ``hw_slowdown``.  Where a GPU reports no bitmask at all,
the reason is inferred: power within ``throttle_infer_power_frac`` of the limit
(enforced, else the model's board power; never one taken from the power's
own history, which the power would meet by construction) is a power cap, a temperature at ``throttle_infer_temp_c`` thermal.

Idle GPUs are never throttled: they carry the idle bit and drop their clocks
by design.  Reported when, since the episode began, at least
``throttle_min_share`` of busy time was throttled, for ``throttle_min_s``, and
the condition was seen within ``active_within_s``.

GPUs of one run throttled for one reason are one finding, run-scoped with the
reason in its scope (``throttling|run|<run>|<cause>``): ``evidence.gpus``
lists each GPU (``node``, ``gpu`` and that GPU's own evidence), the top-level
evidence summarises them (medians of shares, ratios and clocks; the longest
throttled and busy time; the hottest temperature; the union of reasons),
``node`` is set when they are all on one node and ``gpu`` is null.  A run's
GPUs throttled for different reasons are one finding per reason.  GPUs no run
holds stay one finding each, GPU-scoped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np

from gpufleet.collector.detectors.frame import THROTTLE_CAUSES, Frame
from gpufleet.collector.detectors.stats import median_of, num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import ThrottledGpu, ThrottlingEvidence, ThrottlingGpuEvidence
from gpufleet.timeparse import rfc3339

_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
#: Evidence summarised over a group's GPUs by their median, and by their maximum.
_Median = Literal[
    "throttled_share", "clock_ratio", "sm_clock_mhz", "sm_clock_max_mhz", "cause_share", "power_frac"
]
_Max = Literal["throttled_s", "busy_s", "temp_c_max"]

KIND = "throttling"
#: Causes whose slowdown is severe by nature (the hardware protecting itself).
SEVERE = frozenset({"power_brake", "hw_slowdown"})


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0:
        return []
    cfg = config
    busy = fr.busy
    bits = fr.throttle_bits
    reason = bits > 0
    unreported = np.flatnonzero((bits < 0) & busy)
    if unreported.size:
        reason[unreported] = _inferred(fr, cfg, unreported)
    cand = np.flatnonzero(busy & reason)
    # Clock unknown: the reason bit alone decides.
    held = ~(fr.clock_ratio(cand) >= cfg.throttle_clock_ratio)
    ind = np.zeros(fr.size, dtype=bool)
    ind[cand[held]] = True
    wb = fr.w_busy
    ep = fr.trailing_episode(wb, ind, cfg.throttle_min_share)
    hit = (
        (ep.seconds >= cfg.throttle_min_s) & (ep.share >= cfg.throttle_min_share) & fr.recent_enough(ep.last)
    )
    out: list[tuple[Finding, ThrottlingGpuEvidence]] = []
    for r in np.flatnonzero(hit):
        out.append(
            _finding(
                fr,
                int(r),
                float(ep.onset[r]),
                float(ep.seconds[r]),
                float(ep.share[r]),
                float(ep.last[r]),
                ind,
                wb,
            )
        )
    return group(out)


def group(findings: list[tuple[Finding, ThrottlingGpuEvidence]]) -> list[Finding]:
    """One finding per (run, reason) listing its GPUs; GPUs without a run stay one finding each.

    ``findings``: each GPU's finding with its own evidence (the finding's, as this module built it)."""
    by: dict[tuple[str, str | None], list[tuple[Finding, ThrottlingGpuEvidence]]] = {}
    out: list[Finding] = []
    for f, ev in findings:
        if f.run_id is None:
            out.append(f)
        else:
            by.setdefault((f.run_id, f.cause), []).append((f, ev))
    for (run_id, cause), pairs in by.items():
        pairs.sort(key=lambda p: (p[0].node or "", p[0].gpu if p[0].gpu is not None else -1))
        fs = [f for f, _ in pairs]
        evs = [ev for _, ev in pairs]
        nodes = {f.node for f in fs}
        gpus: list[ThrottledGpu] = [
            {"node": f.node, "gpu": f.gpu, "since": rfc3339(f.start), **ev} for f, ev in pairs
        ]
        reasons: list[str] = []
        for ev in evs:
            reasons += [r for r in ev["reasons"] if r not in reasons]
        order = [name for name, _ in THROTTLE_CAUSES]
        sources = {ev["reason_source"] for ev in evs}
        evidence: ThrottlingEvidence = {
            "gpu_count": len(fs),
            "gpus": gpus,
            "throttled_share": _median(evs, "throttled_share"),
            "clock_ratio": _median(evs, "clock_ratio"),
            "sm_clock_mhz": _median(evs, "sm_clock_mhz"),
            "sm_clock_max_mhz": _median(evs, "sm_clock_max_mhz"),
            "cause_share": _median(evs, "cause_share"),
            "power_frac": _median(evs, "power_frac"),
            "throttled_s": _max(evs, "throttled_s"),
            "busy_s": _max(evs, "busy_s"),
            "temp_c_max": _max(evs, "temp_c_max"),
            "reasons": sorted(reasons, key=lambda r: order.index(r) if r in order else len(order)),
            "reasons_mask": hex(_or_masks(ev["reasons_mask"] for ev in evs)),
            "reason_source": sources.pop() if len(sources) == 1 else "mixed",
        }
        worst = max(fs, key=lambda f: _SEVERITY_RANK.get(f.severity, 1))
        lasts = [f.last_active for f in fs if f.last_active is not None]
        out.append(
            Finding(
                KIND,
                cause,
                worst.severity,
                min(f.start for f in fs),
                evidence,
                run_id=run_id,
                node=next(iter(nodes)) if len(nodes) == 1 else None,
                gpu=None,
                last_active=max(lasts) if lasts else None,
                qualifier=cause or "unknown",
            )
        )
    return out


def _median(evs: list[ThrottlingGpuEvidence], key: _Median) -> float | None:
    vals = [float(v) for ev in evs if (v := ev[key]) is not None]
    return num(float(np.median(vals))) if vals else None


def _max(evs: list[ThrottlingGpuEvidence], key: _Max) -> float | None:
    vals = [float(v) for ev in evs if (v := ev[key]) is not None]
    return num(max(vals)) if vals else None


def _or_masks(masks: Iterable[object]) -> int:
    seen = 0
    for m in masks:
        if isinstance(m, str):
            try:
                seen |= int(m, 16)
            except ValueError:
                continue
    return seen


def _inferred(fr: Frame, cfg: DetectorConfig, idx: np.ndarray) -> np.ndarray:
    """Reason inferred where no bitmask is reported: at the power limit, or hot."""
    hot = fr.at("temp_c", idx) >= cfg.throttle_infer_temp_c
    return (fr.power_frac(idx, history=False) >= cfg.throttle_infer_power_frac) | hot


def _finding(
    fr: Frame, r: int, onset: float, secs: float, share: float, last: float, ind: np.ndarray, wb: np.ndarray
) -> tuple[Finding, ThrottlingGpuEvidence]:
    """One GPU's finding, and its evidence (the same object, as its own type)."""
    cfg = fr.config
    sl = fr.row_slice(r)
    ix = np.arange(sl.start, sl.stop)
    t = fr.row_times(r)
    since = t >= onset
    hit = ind[sl] & since
    w = fr.w[sl]
    bits = np.maximum(fr.throttle_bits[sl], 0)
    raw = fr.series_col(r, "throttle_reasons")
    inferred = not np.isfinite(raw[hit]).any()
    shares: dict[str, float] = {}
    if inferred:
        pf = fr.power_frac(ix, history=False)[hit]
        temp = fr.series_col(r, "temp_c")[hit]
        ww = w[hit]
        tot = max(float(ww.sum()), 1e-9)
        shares["thermal"] = float(ww[temp >= cfg.throttle_infer_temp_c].sum()) / tot
        shares["power_cap"] = float(ww[pf >= cfg.throttle_infer_power_frac].sum()) / tot
    else:
        tot = max(float(w[hit].sum()), 1e-9)
        for name, mask in THROTTLE_CAUSES:
            shares[name] = float(w[hit & ((bits & mask) != 0)].sum()) / tot
    order = [name for name, _ in THROTTLE_CAUSES]
    cause = max(order, key=lambda c: (shares.get(c, 0.0), -order.index(c)))
    seen = int(np.bitwise_or.reduce(bits[hit])) if hit.any() else 0
    ratio = median_of(fr.clock_ratio(ix), hit)
    temp_hit = fr.series_col(r, "temp_c")[hit]
    busy_s = float(wb[sl][since].sum())
    evidence: ThrottlingGpuEvidence = {
        "throttled_share": num(share),
        "throttled_s": num(secs),
        "busy_s": num(busy_s),
        "clock_ratio": num(ratio),
        "sm_clock_mhz": num(median_of(fr.series_col(r, "sm_clock_mhz"), hit)),
        "sm_clock_max_mhz": num(median_of(fr.series_col(r, "sm_clock_max_mhz"), hit)),
        "reasons": [name for name, mask in THROTTLE_CAUSES if seen & mask] if not inferred else [cause],
        "reasons_mask": hex(seen),
        "reason_source": "inferred" if inferred else "bitmask",
        "cause_share": num(shares.get(cause, 0.0)),
        "temp_c_max": num(np.max(temp_hit[np.isfinite(temp_hit)]) if np.isfinite(temp_hit).any() else None),
        "power_frac": num(median_of(fr.power_frac(ix), hit)),
    }
    severe = cause in SEVERE or (np.isfinite(ratio) and ratio < cfg.throttle_critical_clock_ratio)
    key = fr.keys[r]
    return Finding(
        KIND,
        cause,
        "critical" if severe else "warning",
        onset,
        evidence,
        run_id=fr.run_id_at(r, last),
        node=key[0],
        gpu=key[1],
        last_active=last,
    ), evidence
