"""What the hosts of a run were doing: CPU and I/O pressure, write bursts.

Host series are per node (``window.hosts``), sampled on their own clock; a
rate sample at time ``t`` describes the interval that ends at ``t``.

The job's own cgroup on each of those hosts (the GPU rows' ``job_*``
columns: the processes on the GPU) says more than the host does: a loader
starving eight GPUs on a 192-core host saturates its quota, never 80 % of the
host.  :func:`job_pressure` reads it; the host-wide thresholds of
:func:`host_pressure` are the fallback where the job's cgroup is not
reported or shows no shortage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import num
from gpufleet.collector.detectors.window import Series, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import JobEvidence

#: The GPU columns of the job's cgroup (the same figures on every GPU it feeds).
JOB_COLUMNS = (
    "job_cpu_cores",
    "job_cpu_quota_cores",
    "job_cpu_throttled_share",
    "job_cpu_pressure_pct",
    "job_io_pressure_pct",
)


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


def host_pressure(
    window: Window, nodes: Iterable[str], t0: float, t1: float, cfg: DetectorConfig
) -> HostPressure:
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
class JobPressure:
    """The most pressured of a run's job cgroups (one per node) over a time span."""

    #: ``cpu`` (at its quota, throttled or waiting for CPU), ``io`` (waiting for I/O) or ``unknown``.
    cause: str
    #: Node whose cgroup is reported (None: no job cgroup figures at all).
    node: str | None = None
    cpu_cores: float = math.nan
    quota_cores: float = math.nan
    throttled_share: float = math.nan
    cpu_pressure_pct: float = math.nan
    io_pressure_pct: float = math.nan
    #: Which figure decided: ``quota``, ``throttled``, ``cpu_pressure``, ``io_pressure`` (None: nothing did).
    basis: str | None = None

    @property
    def covered(self) -> bool:
        return self.node is not None

    def evidence(self) -> JobEvidence:
        return {
            "job_node": self.node,
            "job_cpu_cores": num(self.cpu_cores),
            "job_cpu_quota_cores": num(self.quota_cores),
            "job_cpu_throttled_share": num(self.throttled_share),
            "job_cpu_pressure_pct": num(self.cpu_pressure_pct),
            "job_io_pressure_pct": num(self.io_pressure_pct),
        }


def job_pressure(fr: Frame, rows: Iterable[int], t0: float, t1: float, cfg: DetectorConfig) -> JobPressure:
    """Mean figures of the job's cgroup on each node of ``rows`` over ``[t0, t1]``; the worst node wins.

    ``cpu``: CPU used at ``job_at_quota_share`` of the quota or more, or
    throttled in ``job_throttled_high_share`` of the CFS periods, or CPU
    pressure at ``job_cpu_pressure_high_pct``.  ``io``: I/O pressure at
    ``job_io_pressure_high_pct``.  The larger of the two (each relative to its
    threshold) decides when both are reached.
    """
    by_node: dict[str, list[int]] = {}
    for r in rows:
        by_node.setdefault(fr.keys[int(r)][0], []).append(int(r))
    best = JobPressure("unknown")
    best_score = -math.inf
    for node, node_rows in sorted(by_node.items()):
        sums = {c: [0.0, 0] for c in JOB_COLUMNS}
        for r in node_rows:
            s = fr.series[r]
            if not any(c in s.cols for c in JOB_COLUMNS):
                continue
            m = _span(s, t0, t1)
            if not m.any():
                continue
            for c in JOB_COLUMNS:
                col = s.cols.get(c)
                if col is None:
                    continue
                x = np.asarray(col[m], dtype=np.float64)
                x = x[np.isfinite(x)]
                sums[c][0] += float(x.sum())
                sums[c][1] += int(x.size)
        mean = {c: (v[0] / v[1] if v[1] else math.nan) for c, v in sums.items()}
        if all(math.isnan(v) for v in mean.values()):
            continue
        used, quota = mean["job_cpu_cores"], mean["job_cpu_quota_cores"]
        cpu_parts = {
            "quota": used / (cfg.job_at_quota_share * quota) if quota > 0 and not math.isnan(used) else 0.0,
            "throttled": _ratio(mean["job_cpu_throttled_share"], cfg.job_throttled_high_share),
            "cpu_pressure": _ratio(mean["job_cpu_pressure_pct"], cfg.job_cpu_pressure_high_pct),
        }
        io_score = _ratio(mean["job_io_pressure_pct"], cfg.job_io_pressure_high_pct)
        cpu_basis = max(cpu_parts, key=lambda k: cpu_parts[k])
        cpu_score = cpu_parts[cpu_basis]
        score = max(cpu_score, io_score)
        if score <= best_score:
            continue
        best_score = score
        cause, basis = "unknown", None
        if score >= 1.0:
            cause, basis = ("cpu", cpu_basis) if cpu_score >= io_score else ("io", "io_pressure")
        best = JobPressure(
            cause,
            node,
            used,
            quota,
            mean["job_cpu_throttled_share"],
            mean["job_cpu_pressure_pct"],
            mean["job_io_pressure_pct"],
            basis,
        )
    return best


def _ratio(x: float, threshold: float) -> float:
    if math.isnan(x):
        return 0.0
    return x / threshold if threshold > 0 else (math.inf if x > 0 else 0.0)


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
