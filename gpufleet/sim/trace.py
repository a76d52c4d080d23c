"""Record a fleet's samples in memory, as arrays, and hand them to detectors.

Tests, benchmarks and the detector scoring often want the telemetry without
the round trip through CSV files: a :class:`Trace` holds every column as a
(ticks x GPUs) array with NaN where a sample is missing (a gap), and
:meth:`Trace.window` builds the :class:`gpufleet.collector.detectors.window.Window`
the detectors consume, exactly as replay would from a bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpufleet.sim.fleet import GPU_METRICS, HOST_METRICS, Fleet

if TYPE_CHECKING:
    from gpufleet.collector.detectors.window import Window


@dataclass
class Trace:
    """Samples of every GPU and host over the recorded ticks."""

    t: np.ndarray
    #: (node, gpu) of each GPU column, in fleet order.
    gpu_keys: list[tuple[str, int]]
    uuids: list[str]
    nodes: list[str]
    #: column -> (ticks, GPUs); NaN where the GPU reported nothing.
    gpu: dict[str, np.ndarray]
    #: column -> (ticks, nodes); NaN where the host reported nothing.
    host: dict[str, np.ndarray]
    fleet: Fleet

    def col(self, name: str, node: str, gpu: int) -> np.ndarray:
        """One GPU's series of one column."""
        return self.gpu[name][:, self.gpu_keys.index((node, gpu))]

    def host_col(self, name: str, node: str) -> np.ndarray:
        return self.host[name][:, self.nodes.index(node)]

    def between(self, start: float, end: float) -> np.ndarray:
        """Boolean mask of the ticks in ``[start, end)`` (epoch seconds)."""
        return (self.t >= start) & (self.t < end)

    def window(self, t_start: float | None = None, t_end: float | None = None) -> Window:
        """The detector window over ``[t_start, t_end]`` (default: everything)."""
        from gpufleet.collector.detectors.window import RunInfo, Series, Window

        lo = self.t[0] if t_start is None else t_start
        hi = self.t[-1] if t_end is None else t_end
        sel = (self.t >= lo) & (self.t <= hi)
        win = Window(t_start=float(lo), t_end=float(hi))
        for j, (node, g) in enumerate(self.gpu_keys):
            present = sel & np.isfinite(self.gpu["power_w"][:, j])
            win.gpus[(node, g)] = Series(
                node,
                g,
                self.t[present],
                {c: self.gpu[c][present, j] for c in GPU_METRICS},
                uuid=self.uuids[j],
            )
        for k, node in enumerate(self.nodes):
            present = sel & np.isfinite(self.host["cpu_user_pct"][:, k])
            win.hosts[node] = Series(
                node, None, self.t[present], {c: self.host[c][present, k] for c in HOST_METRICS}
            )
        plan = self.fleet.plan
        for r in plan.runs:
            if r.start > hi or (r.end is not None and r.end < lo):
                continue
            end = r.end if r.end is not None and r.end <= hi else None
            win.runs.append(
                RunInfo(
                    r.run_id,
                    r.start,
                    end,
                    [(plan.gpus[i].node, plan.gpus[i].gpu) for i in r.gpu_idx.tolist()],
                    name=r.name,
                    site=r.site,
                )
            )
        win.node_facts = {n: self.fleet.facts(n) for n in self.nodes}
        return win


def record(fleet: Fleet, duration_s: float | None = None, columns: list[str] | None = None) -> Trace:
    """Sample ``fleet`` from its current time for ``duration_s`` (default: to the scenario end)."""
    gpu_cols = list(columns) if columns is not None else list(GPU_METRICS)
    if "power_w" not in gpu_cols:
        gpu_cols.append("power_w")  # marks which GPUs reported
    times: list[float] = []
    gbuf: dict[str, list[np.ndarray]] = {c: [] for c in gpu_cols}
    hbuf: dict[str, list[np.ndarray]] = {c: [] for c in HOST_METRICS}
    eng = fleet.engine
    for t in fleet.ticks(duration_s):
        times.append(t)
        gmask = ~eng.gpu_present
        hmask = ~eng.host_present
        for c in gpu_cols:
            v = np.array(eng.gpu[c], dtype=np.float64)
            v[gmask] = np.nan
            gbuf[c].append(v)
        for c in HOST_METRICS:
            v = np.array(eng.host[c], dtype=np.float64)
            v[hmask] = np.nan
            hbuf[c].append(v)
    plan = fleet.plan
    return Trace(
        t=np.array(times),
        gpu_keys=[(g.node, g.gpu) for g in plan.gpus],
        uuids=[g.uuid for g in plan.gpus],
        nodes=fleet.nodes,
        gpu={c: np.vstack(v) for c, v in gbuf.items()},
        host={c: np.vstack(v) for c, v in hbuf.items()},
        fleet=fleet,
    )
