"""NVLink degradation: links down, collectives moving over PCIe, or a link logging errors.

GPU-scoped, one finding per GPU with every issue in its evidence; ``cause`` is
the most serious one:

* ``links_down``: fewer links up than the GPU has (``nvlink_links_max``;
  without it, than the most any GPU of the node shows) for
  ``nvlink_down_min_s``.  Link state is read sparsely (every ~10 s), so a
  reading holds until the next one.  Critical with every link down, else a
  warning (the run's every all-reduce now waits on this GPU's narrower path).
* ``pcie_fallback``: a busy GPU of a run holding several GPUs of its node
  moves next to nothing over NVLink -- on average at most
  ``nvlink_floor_bytes_s``, or at most ``nvlink_peer_ratio`` of its run peers
  on the node -- while its PCIe carries collective-like traffic (transmit and
  receive each at least ``nvlink_fallback_pcie_bytes_s``), over at least
  ``nvlink_min_busy_s`` of busy time after warm-up.  That is NCCL moving the
  collective over PCIe and host memory: the fabric manager is down, peer
  access is off, or every link of the GPU failed.  Only GPUs that have NVLink
  count (links reported, or NVLink traffic on the node), so PCIe-only boards
  and GPUs that never talk to each other (inference replicas) stay silent.
  Critical.
* ``link_errors``: CRC plus replay errors rising by ``nvlink_errors_per_min``
  and at least ``nvlink_min_errors`` in the window, or ``nvlink_min_recoveries``
  link recoveries: a marginal link.  A warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from gpufleet.collector.detectors.counters import forward_fill, rises
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import group_loo_median, num, trailing_onset
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import NvlinkDegradedEvidence

KIND = "nvlink_degraded"
COLUMNS = (
    "nvlink_links_up",
    "nvlink_tx_bytes_s",
    "nvlink_rx_bytes_s",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
)
#: Order of seriousness of the causes (the first present names the finding).
CAUSES = ("links_down", "pcie_fallback", "link_errors")


class _LinksDown(TypedDict):
    links_up: int
    links_expected: int
    links_down: int
    down_s: float | None


class _PcieFallback(TypedDict):
    nvlink_bytes_s: float | None
    peers_nvlink_bytes_s: float | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    busy_s: float | None
    nvlink_threshold_bytes_s: float | None


class _LinkErrors(TypedDict):
    crc_errors: int
    replay_errors: int
    recoveries: int
    errors_per_min: float | None
    crc_errors_total: float | None


@dataclass
class _Issue:
    """One cause on one GPU: start, last, severity and its evidence."""

    start: float
    last: float
    severity: str
    evidence: _LinksDown | _PcieFallback | _LinkErrors


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not any(fr.has(c) for c in COLUMNS):
        return []
    found: dict[int, dict[str, _Issue]] = {}
    links = _LinkCounts(fr)
    _links_down(fr, config, found, links)
    _fallback(fr, config, found, links)
    _errors(fr, config, found)
    out = []
    for r, issues in sorted(found.items()):
        cause = next(c for c in CAUSES if c in issues)
        evidence: NvlinkDegradedEvidence = {"issues": [c for c in CAUSES if c in issues]}
        for c in CAUSES:
            if c in issues:
                evidence.update(issues[c].evidence)
        severity = "critical" if any(i.severity == "critical" for i in issues.values()) else "warning"
        start = min(i.start for i in issues.values())
        last = max(i.last for i in issues.values())
        node, gpu = fr.keys[r]
        out.append(
            Finding(
                KIND,
                cause,
                severity,
                start,
                evidence,
                run_id=fr.run_id_at(r, last),
                node=node,
                gpu=gpu,
                last_active=last,
            )
        )
    return out


class _LinkCounts:
    """Per row: the fewest and most links seen up and the most reported present (NaN: never read)."""

    def __init__(self, fr: Frame) -> None:
        nan = np.full(fr.rows, np.nan)
        self.up_min, self.up_max, self.max = nan, nan.copy(), nan.copy()
        if fr.rows and fr.has("nvlink_links_up"):
            up = fr.transient("nvlink_links_up")
            self.up_min = np.fmin.reduceat(up, fr.starts).astype(np.float64)
            self.up_max = np.fmax.reduceat(up, fr.starts).astype(np.float64)
        if fr.rows and fr.has("nvlink_links_max"):
            self.max = np.fmax.reduceat(fr.transient("nvlink_links_max"), fr.starts).astype(np.float64)

    def expected(self, fr: Frame) -> np.ndarray:
        """Links each GPU has: its reported maximum, else the most any GPU of its node showed up."""
        node_max = np.full(fr.rows, np.nan)
        for rows in fr.rows_by_node.values():
            vals = self.up_max[rows]
            if np.isfinite(vals).any():
                node_max[rows] = np.nanmax(vals)
        return np.where(np.isfinite(self.max), self.max, node_max)

    def present(self) -> np.ndarray:
        return (self.max > 0) | (self.up_max > 0)


def _links_down(
    fr: Frame, cfg: DetectorConfig, found: dict[int, dict[str, _Issue]], links: _LinkCounts
) -> None:
    if not np.isfinite(links.up_min).any():
        return
    expected = links.expected(fr)
    low = links.up_min
    horizon = fr.window.t_end - np.maximum(cfg.active_within_s, cfg.active_within_samples * fr.dt)
    for r in np.flatnonzero((expected > 0) & (low < expected)).tolist():
        t = fr.row_times(r)
        raw = fr.series_col(r, "nvlink_links_up")
        ok = np.isfinite(raw)
        gaps = np.diff(t[ok])
        cadence = float(np.median(gaps)) if gaps.size else float(fr.dt[r])
        up = forward_fill(raw, t, max(60.0, 3.0 * cadence))
        down = np.isfinite(up) & (up < expected[r])
        w = fr.w_all[fr.row_slice(r)].astype(np.float64)
        onset = trailing_onset(t, w, down, cfg.nvlink_down_min_share)
        if math.isnan(onset):
            continue
        secs = float(w[down & (t >= onset)].sum())
        last = float(t[down][-1])
        if secs < cfg.nvlink_down_min_s or last < horizon[r]:
            continue
        now_up = float(raw[ok][-1])
        found.setdefault(r, {})["links_down"] = _Issue(
            start=onset,
            last=last,
            severity="critical" if now_up == 0 else "warning",
            evidence={
                "links_up": int(now_up),
                "links_expected": int(expected[r]),
                "links_down": int(expected[r] - now_up),
                "down_s": num(secs),
            },
        )


def _mean_over(fr: Frame, name: str, w: np.ndarray) -> np.ndarray:
    """Per row, the ``w``-weighted mean of column ``name`` over its finite samples."""
    x = fr.transient(name)
    ok = np.isfinite(x)
    ww = np.where(ok, w, 0.0)
    tot = fr.row_sum(ww)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, fr.row_sum(ww * np.where(ok, x, 0.0)) / np.where(tot > 0, tot, 1.0), np.nan)


def _nvlink_rate(fr: Frame) -> np.ndarray:
    """Per sample, NVLink bytes/s (float32): transmit and receive averaged, either alone where one is missing."""
    tx = fr.col("nvlink_tx_bytes_s")
    rx = fr.col("nvlink_rx_bytes_s")
    both = np.isfinite(tx) & np.isfinite(rx)
    mean = np.add(tx, rx, out=tx, where=both)
    mean *= np.where(both, np.float32(0.5), np.float32(1.0))
    return np.where(both, mean, np.fmax(tx, rx))


def _fallback(
    fr: Frame, cfg: DetectorConfig, found: dict[int, dict[str, _Issue]], links: _LinkCounts
) -> None:
    if not (fr.has("nvlink_tx_bytes_s") or fr.has("nvlink_rx_bytes_s")) or not fr.has("pcie_tx_bytes_s"):
        return
    ror = fr.run_of_row
    if not (ror >= 0).any():
        return
    # Runs holding two GPUs or more of a node: their collectives should cross NVLink.
    group = np.full(fr.rows, -1, dtype=np.int64)
    sizes: dict[tuple[int, str], list[int]] = {}
    for r in np.flatnonzero(ror >= 0).tolist():
        sizes.setdefault((int(ror[r]), fr.keys[r][0]), []).append(r)
    for g, rows in enumerate(rs for rs in sizes.values() if len(rs) > 1):
        group[rows] = g
    if not (group >= 0).any():
        return
    nv = _nvlink_rate(fr)
    seen = np.isfinite(nv)
    if not seen.any():
        return
    # Only GPUs of such runs, inside their run region, while busy.
    in_group = fr.per_sample(group >= 0)
    wb = fr.w_busy * (fr.range_mask(*fr.region_index) & seen & in_group)
    busy_s = fr.row_sum(wb)
    nv[~seen] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        nv_mean = np.where(busy_s > 0, fr.row_sum(wb * nv) / np.where(busy_s > 0, busy_s, 1.0), np.nan)
    nv[~seen] = np.nan
    tx = _mean_over(fr, "pcie_tx_bytes_s", wb)
    rx = _mean_over(fr, "pcie_rx_bytes_s", wb)
    has_links = links.present()
    node_traffic = np.zeros(fr.rows, dtype=bool)
    for node_rows in fr.rows_by_node.values():
        node_traffic[node_rows] = bool(
            np.nanmax(np.append(nv_mean[node_rows], -1.0)) > cfg.nvlink_floor_bytes_s
        )
    ok = group >= 0
    peer = np.full(fr.rows, np.nan)
    peer[ok] = group_loo_median(nv_mean[ok], group[ok], int(group.max()) + 1)
    thr = np.fmax(cfg.nvlink_floor_bytes_s, cfg.nvlink_peer_ratio * np.nan_to_num(peer))
    hit = (
        ok
        & (has_links | node_traffic)
        & (busy_s >= cfg.nvlink_min_busy_s)
        & (nv_mean <= thr)
        & (np.fmin(tx, rx) >= cfg.nvlink_fallback_pcie_bytes_s)
    )
    horizon = fr.window.t_end - np.maximum(cfg.active_within_s, cfg.active_within_samples * fr.dt)
    for r in np.flatnonzero(hit).tolist():
        sl = fr.row_slice(r)
        t = fr.row_times(r)
        w = wb[sl].astype(np.float64)
        low = (nv[sl] <= thr[r]) & (w > 0)
        onset = trailing_onset(t, w, low, cfg.majority_share)
        if math.isnan(onset) or not low.any() or float(t[low][-1]) < horizon[r]:
            continue
        found.setdefault(r, {})["pcie_fallback"] = _Issue(
            start=onset,
            last=float(t[low][-1]),
            severity="critical",
            evidence={
                "nvlink_bytes_s": num(nv_mean[r]),
                "peers_nvlink_bytes_s": num(peer[r]),
                "pcie_tx_bytes_s": num(tx[r]),
                "pcie_rx_bytes_s": num(rx[r]),
                "busy_s": num(busy_s[r]),
                "nvlink_threshold_bytes_s": num(thr[r]),
            },
        )


def _errors(fr: Frame, cfg: DetectorConfig, found: dict[int, dict[str, _Issue]]) -> None:
    names = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
    if not any(fr.has(n) for n in names):
        return
    crc, rep, rec = (rises(fr, n) for n in names)
    errs = crc.total + rep.total
    span = np.fmax(crc.span_s, rep.span_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(span > 0, 60.0 * errs / span, np.nan)
    hit = ((errs >= cfg.nvlink_min_errors) & (rate >= cfg.nvlink_errors_per_min)) | (
        rec.total >= cfg.nvlink_min_recoveries
    )
    last = np.fmax(np.fmax(crc.last, rep.last), rec.last)
    first = np.fmin(np.fmin(crc.first, rep.first), rec.first)
    horizon = fr.window.t_end - np.maximum(cfg.active_within_s, cfg.active_within_samples * fr.dt)
    for r in np.flatnonzero(hit & (last >= horizon)).tolist():
        found.setdefault(r, {})["link_errors"] = _Issue(
            start=float(first[r]),
            last=float(last[r]),
            severity="warning",
            evidence={
                "crc_errors": int(crc.total[r]),
                "replay_errors": int(rep.total[r]),
                "recoveries": int(rec.total[r]),
                "errors_per_min": num(rate[r]),
                "crc_errors_total": num(crc.latest[r]),
            },
        )
