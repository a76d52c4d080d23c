"""GPU memory and bus health: uncorrectable ECC errors, row remaps, correctable-error storms, PCIe replays.

GPU-scoped, whatever runs on the GPU (a bad board is bad when idle too), one
finding per GPU with every issue in its evidence; ``cause`` is the most
serious one present:

* ``row_remap_failed`` (critical): the row remapper's failure flag is set: a
  faulty row could not be replaced, the memory is no longer protected.
* ``uncorrectable_ecc`` (critical): the volatile double-bit ECC counter or
  the uncorrectable remapped-row count rose in the window.  The counter rises
  once per error, so the incident is held open ``uncorrectable_hold_s`` after
  the last one.
* ``row_remap_pending`` (warning): a remap waits for a GPU reset to take
  effect; until then the row is retired only for new allocations.
* ``correctable_ecc`` (warning): single-bit errors at ``ecc_sbe_per_h`` or
  more, at least ``ecc_sbe_min_errors`` in the window: memory degrading.
* ``pcie_replay`` (warning): PCIe replays at ``pcie_replay_per_min`` or more,
  at least ``pcie_replay_min_count`` in the window: a marginal link (riser,
  seating, signal integrity), which also costs bandwidth.

Static non-zero counts (the lifetime counters of a board with a history, a
few correctable remaps done long ago) are never findings: only rises and
flags set now.  The XIDs the GPU logged in the window are decoded in the
evidence (:mod:`gpufleet.xid`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from gpufleet.collector.detectors.counters import rises, trailing_on
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import GpuHealthEvidence
from gpufleet.xid import meanings

KIND = "gpu_health"
COLUMNS = (
    "ecc_sbe_vol",
    "ecc_dbe_vol",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "pcie_replay_count",
)
#: Causes in order of seriousness, and their severity.
CAUSES: tuple[tuple[str, str], ...] = (
    ("row_remap_failed", "critical"),
    ("uncorrectable_ecc", "critical"),
    ("row_remap_pending", "warning"),
    ("correctable_ecc", "warning"),
    ("pcie_replay", "warning"),
)


class _RemapFailed(TypedDict):
    remapped_rows_failed: int


class _RemapPending(TypedDict):
    remapped_rows_pending: int


class _Uncorrectable(TypedDict):
    dbe_errors: int
    dbe_total: float | None
    uncorrectable_remaps: int


class _Correctable(TypedDict):
    sbe_errors: int
    sbe_per_h: float | None
    sbe_total: float | None


class _PcieReplay(TypedDict):
    pcie_replays: int
    pcie_replays_per_min: float | None
    pcie_replay_total: float | None


_Part = _RemapFailed | _RemapPending | _Uncorrectable | _Correctable | _PcieReplay
_FLAGS: tuple[tuple[str, str, _Part], ...] = (
    ("remapped_rows_failed", "row_remap_failed", _RemapFailed(remapped_rows_failed=1)),
    ("remapped_rows_pending", "row_remap_pending", _RemapPending(remapped_rows_pending=1)),
)


@dataclass
class _Issue:
    """One cause on one GPU: its first and last sign and its evidence."""

    start: float
    last: float
    evidence: _Part


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not any(fr.has(c) for c in COLUMNS):
        return []
    cfg = config
    found: dict[int, dict[str, _Issue]] = {}

    def add(r: int, cause: str, start: float, last: float, evidence: _Part) -> None:
        found.setdefault(r, {})[cause] = _Issue(start, last, evidence)

    t_end = fr.window.t_end
    for flag, cause, part in _FLAGS:
        if not fr.has(flag):
            continue
        state = rises(fr, flag)
        for r in np.flatnonzero(state.latest >= 0.5).tolist():
            start = trailing_on(fr.row_times(r), fr.series_col(r, flag))
            add(r, cause, start if math.isfinite(start) else fr.window.t_start, t_end, part)

    dbe, unc = rises(fr, "ecc_dbe_vol"), rises(fr, "remapped_rows_uncorrectable")
    for r in np.flatnonzero((dbe.total > 0) | (unc.total > 0)).tolist():
        add(
            r,
            "uncorrectable_ecc",
            float(np.fmin(dbe.first[r], unc.first[r])),
            float(np.fmax(dbe.last[r], unc.last[r])),
            {
                "dbe_errors": int(dbe.total[r]),
                "dbe_total": num(dbe.latest[r]),
                "uncorrectable_remaps": int(unc.total[r]),
            },
        )

    sbe = rises(fr, "ecc_sbe_vol")
    rate = sbe.per_minute() * 60.0
    for r in np.flatnonzero((sbe.total >= cfg.ecc_sbe_min_errors) & (rate >= cfg.ecc_sbe_per_h)).tolist():
        add(
            r,
            "correctable_ecc",
            float(sbe.first[r]),
            float(sbe.last[r]),
            {"sbe_errors": int(sbe.total[r]), "sbe_per_h": num(rate[r]), "sbe_total": num(sbe.latest[r])},
        )

    rep = rises(fr, "pcie_replay_count")
    per_min = rep.per_minute()
    for r in np.flatnonzero(
        (rep.total >= cfg.pcie_replay_min_count) & (per_min >= cfg.pcie_replay_per_min)
    ).tolist():
        add(
            r,
            "pcie_replay",
            float(rep.first[r]),
            float(rep.last[r]),
            {
                "pcie_replays": int(rep.total[r]),
                "pcie_replays_per_min": num(per_min[r]),
                "pcie_replay_total": num(rep.latest[r]),
            },
        )

    horizon = t_end - np.maximum(cfg.active_within_s, cfg.active_within_samples * fr.dt)
    hold = {"uncorrectable_ecc": cfg.uncorrectable_hold_s}
    out = []
    for r, issues in sorted(found.items()):
        # A rise seen long ago in the window still counts for an uncorrectable error (held), not for a rate.
        live = {
            c: i
            for c, i in issues.items()
            if c in ("uncorrectable_ecc", "row_remap_failed", "row_remap_pending") or i.last >= horizon[r]
        }
        if not live:
            continue
        cause, severity = next((c, s) for c, s in CAUSES if c in live)
        evidence: GpuHealthEvidence = {"issues": [c for c, _ in CAUSES if c in live]}
        for c, _ in CAUSES:
            if c in live:
                evidence.update(live[c].evidence)
        codes = _xids(fr, r)
        if codes:
            evidence["xid_codes"] = codes
            evidence["xid_meanings"] = meanings(codes)
        node, gpu = fr.keys[r]
        start = min(i.start for i in live.values())
        last = max(i.last for i in live.values())
        out.append(
            Finding(
                KIND,
                cause,
                severity,
                start,
                evidence,
                run_id=fr.run_id_at(r, min(last, t_end)),
                node=node,
                gpu=gpu,
                last_active=last,
                hold_s=max((hold.get(c, 0.0) for c in live), default=0.0) or None,
            )
        )
    return out


def _xids(fr: Frame, r: int) -> list[int]:
    x = fr.series_col(r, "xid")
    return sorted({int(v) for v in x[np.isfinite(x) & (x > 0)].tolist()})
