"""What the hosts of a run were doing: CPU and I/O pressure, write bursts.

Host series are per node (``window.hosts``), sampled on their own clock; a
rate sample at time ``t`` describes the interval that ends at ``t``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.collector.detectors.config import DetectorConfig
from gpufleet.collector.detectors.window import Series, Window


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else math.nan


def _span(h: Series, t0: float, t1: float) -> np.ndarray:
    return (h.t >= t0) & (h.t <= t1)


@dataclass
class HostPressure:
    """The most pressured host of a set over a time span."""

    #: ``cpu`` (user CPU saturated), ``io`` (iowait or disk saturated) or ``unknown``.
    cause: str
    #: Node whose numbers are reported (None: no host data at all).
    node: str | None = None
    cpu_user_pct: float = math.nan
    iowait_pct: float = math.nan
    disk_util_pct: float = math.nan
    disk_await_ms: float = math.nan

    @property
    def covered(self) -> bool:
        return self.node is not None


def host_pressure(window: Window, nodes: Iterable[str], t0: float, t1: float, cfg: DetectorConfig) -> HostPressure:
    """Mean CPU and I/O pressure of each node over ``[t0, t1]``; the worst wins.

    ``cpu``: user CPU at or above ``cpu_saturated_pct``.  ``io``: iowait at or
    above ``iowait_high_pct``, or the busiest disk at ``disk_util_high_pct``
    with await at ``disk_await_high_ms`` (await not reported: %util alone).
    """
    best: HostPressure = HostPressure("unknown")
    best_score = -math.inf
    for node in sorted(set(nodes)):
        h = window.hosts.get(node)
        if h is None or len(h) == 0:
            continue
        m = _span(h, t0, t1)
        if not m.any():
            continue
        cpu = _mean(h.get("cpu_user_pct")[m])
        iow = _mean(h.get("cpu_iowait_pct")[m])
        du = _mean(h.get("disk_util_pct")[m])
        aw = _mean(h.get("disk_await_ms")[m])
        if all(math.isnan(v) for v in (cpu, iow, du, aw)):
            continue
        cpu_score = cpu / cfg.cpu_saturated_pct if not math.isnan(cpu) else 0.0
        disk_score = du / cfg.disk_util_high_pct if not math.isnan(du) else 0.0
        if not math.isnan(aw):
            disk_score = min(disk_score, aw / cfg.disk_await_high_ms)
        io_score = max(iow / cfg.iowait_high_pct if not math.isnan(iow) else 0.0, disk_score)
        score = max(cpu_score, io_score)
        if score <= best_score:
            continue
        best_score = score
        cause = "unknown"
        if score >= 1.0:
            cause = "cpu" if cpu_score >= io_score else "io"
        best = HostPressure(cause, node, cpu, iow, du, aw)
    return best


@dataclass
class WriteBurst:
    """Write rates of the node and path (disk or network) that burst most."""

    node: str
    #: ``disk`` (disk_write_bytes_s) or ``network`` (net_tx_bytes_s).
    path: str
    pause_bytes_s: float
    busy_bytes_s: float

    def is_burst(self, cfg: DetectorConfig) -> bool:
        """Writes during pauses are high, and a multiple of those while busy
        (no busy-time sample to compare with: no evidence of a burst)."""
        if not self.pause_bytes_s >= cfg.ckpt_min_write_bytes_s or not math.isfinite(self.busy_bytes_s):
            return False
        return self.pause_bytes_s >= cfg.ckpt_write_ratio * self.busy_bytes_s


def write_burst(
    window: Window, nodes: Iterable[str], pauses: Sequence[tuple[float, float]], t0: float, t1: float
) -> WriteBurst | None:
    """Mean write rate during ``pauses`` against the rest of ``[t0, t1]``.

    None when no node reports a write rate there.  A host sample belongs to a
    pause when it falls inside it or within one host interval after its end
    (the sample that reports the pause's last interval).
    """
    if not pauses:
        return None
    p0 = np.array([p[0] for p in pauses])
    p1 = np.array([p[1] for p in pauses])
    best: WriteBurst | None = None
    for node in sorted(set(nodes)):
        h = window.hosts.get(node)
        if h is None or len(h) == 0:
            continue
        m = _span(h, t0, t1)
        if not m.any():
            continue
        ht = h.t[m]
        dt = float(np.median(np.diff(h.t))) if len(h) > 1 else 0.0
        i = np.searchsorted(p0, ht, side="right") - 1
        inside = (i >= 0) & (ht <= p1[np.maximum(i, 0)] + dt)
        for col, path in (("disk_write_bytes_s", "disk"), ("net_tx_bytes_s", "network")):
            x = h.get(col)[m]
            if not np.isfinite(x).any():
                continue
            cand = WriteBurst(node, path, _mean(x[inside]), _mean(x[~inside]))
            if best is None or _rank(cand) > _rank(best):
                best = cand
    return best


def _rank(b: WriteBurst) -> float:
    p = b.pause_bytes_s if math.isfinite(b.pause_bytes_s) else 0.0
    q = b.busy_bytes_s if math.isfinite(b.busy_bytes_s) else 0.0
    return p - q
