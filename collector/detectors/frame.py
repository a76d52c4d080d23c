"""The frame a sweep's detectors share: one window's GPU samples as flat arrays
(:mod:`~gpufleet.collector.detectors.flat`), judged for activity
(:mod:`~gpufleet.collector.detectors.activity`), tied to the runs that held
the GPUs, and the results detectors pass to one another (:class:`Shared`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpufleet.catalog import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)
from gpufleet.collector.detectors.activity import Activity, Phases
from gpufleet.collector.detectors.flat import hysteresis, segment_sums
from gpufleet.collector.detectors.window import Finding, RunInfo, Window
from gpufleet.detectconfig import DetectorConfig

#: Reason bits that mean "held down", in the order a cause is preferred when
#: several are set (HW Slowdown 0x8 is the umbrella of HW thermal and brake).
THROTTLE_CAUSES: tuple[tuple[str, int], ...] = (
    ("thermal", THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL),
    ("power_brake", THROTTLE_HW_POWER_BRAKE),
    ("hw_slowdown", THROTTLE_HW_SLOWDOWN),
    ("power_cap", THROTTLE_SW_POWER_CAP),
)
THROTTLE_MASK = 0
for _name, _bits in THROTTLE_CAUSES:
    THROTTLE_MASK |= _bits


@dataclass(eq=False)
class Shared:
    """What one detector works out once per sweep for others (or its own later calls) to read.

    Named, typed fields rather than a dict of names, so that a detector reading
    another's result is checked like any call.  None: not worked out yet.
    """

    #: Per run with data, its checkpoint finding (None: no stall): starvation
    #: reads it so that a pattern is claimed by one detector only
    #: (:func:`~gpufleet.collector.detectors.checkpoint_stall.run_findings`).
    checkpoint_findings: dict[int, Finding | None] | None = None
    #: Per row, whether any sample carries the job's cgroup, and the row's last
    #: reported CPU quota (host_misconfig asks once per node).
    job_columns: tuple[np.ndarray, np.ndarray] | None = None


class Frame(Activity):
    """One window's GPU samples as the detectors of a sweep see them (see the module doc)."""

    def __init__(self, window: Window, config: DetectorConfig) -> None:
        self.window = window
        self.config = config
        items = [(k, s) for k, s in window.gpus.items() if len(s) > 0]
        super().__init__(
            [k for k, _ in items], [s for _, s in items], config.gap_factor, config.fallback_dt_s
        )
        self.shared = Shared()

    # --- derived hardware signals -------------------------------------------------

    def clock_ratio(self, idx: np.ndarray) -> np.ndarray:
        """SM clock over its maximum at flat indexes ``idx`` (NaN if unknown);
        the GPU's highest clock in the window stands in for a missing maximum."""
        clk = self.at("sm_clock_mhz", idx)
        mx = self.at("sm_clock_max_mhz", idx)
        miss = ~(mx > 0) & np.isfinite(clk)
        if miss.any():
            rows = self.row_of(idx[miss])
            seen = {
                int(r): float(np.nanmax(self.series_col(int(r), "sm_clock_mhz"))) for r in np.unique(rows)
            }
            mx[miss] = [seen[int(r)] for r in rows]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = clk / mx
        ratio[~(mx > 0)] = np.nan
        return ratio

    @cached_property
    def throttle_bits(self) -> np.ndarray:
        """Reason bits of interest (int16): 0 where none, -1 where no bitmask
        was reported."""
        raw = self.col("throttle_reasons", out=self._scratch[0])
        out = np.zeros(self.size, dtype=np.int16)
        nz = np.flatnonzero(~(raw <= 0))
        val = raw[nz]
        out[nz] = np.where(np.isnan(val), -1, np.nan_to_num(val).astype(np.int64) & THROTTLE_MASK)
        return out

    @cached_property
    def pcie_degraded(self) -> np.ndarray:
        """Link generation or width below its maximum (False where unknown)."""
        a, b = self._scratch
        deg = self.col("pcie_gen", out=a) < self._max_or_seen(a, self.col("pcie_gen_max", out=b))
        deg |= self.col("pcie_width", out=a) < self._max_or_seen(a, self.col("pcie_width_max", out=b))
        return deg

    def _max_or_seen(self, cur: np.ndarray, mx: np.ndarray) -> np.ndarray:
        miss = ~(mx > 0) & np.isfinite(cur)
        if not miss.any():
            return mx
        seen = np.fmax.reduceat(cur, self.starts)
        return np.where(miss, self.per_sample(seen), mx)

    # --- runs -------------------------------------------------------------------

    @cached_property
    def runs_of_row(self) -> list[list[int]]:
        """Per row, indexes into ``window.runs`` of the runs that held the GPU
        at some point of the window."""
        out: list[list[int]] = [[] for _ in range(self.rows)]
        w = self.window
        for i, run in enumerate(w.runs):
            if not run.overlaps(w.t_start, w.t_end):
                continue
            for key in run.allocations:
                r = self.index.get((key[0], int(key[1])))
                if r is not None:
                    out[r].append(i)
        return out

    @cached_property
    def rows_by_node(self) -> dict[str, np.ndarray]:
        """Rows of each node's GPUs."""
        out: dict[str, list[int]] = {}
        for r, (node, _gpu) in enumerate(self.keys):
            out.setdefault(node, []).append(r)
        return {n: np.array(rs, dtype=np.int64) for n, rs in out.items()}

    @cached_property
    def run_of_row(self) -> np.ndarray:
        """Index into ``window.runs`` of the run each GPU row worked for (-1: none).

        Where several runs held the GPU during the window, the latest one.
        """
        runs = self.window.runs
        return np.fromiter(
            (max(c, key=lambda i: runs[i].start) if c else -1 for c in self.runs_of_row),
            dtype=np.int64,
            count=self.rows,
        )

    def run_id_at(self, r: int, at: float) -> str | None:
        """The run that held row ``r``'s GPU at time ``at`` (latest start wins)."""
        best: RunInfo | None = None
        for i in self.runs_of_row[r]:
            run = self.window.runs[i]
            if run.state_at(at) == "running" and (best is None or run.start > best.start):
                best = run
        return best.run_id if best else None

    @cached_property
    def run_rows(self) -> dict[int, np.ndarray]:
        """Rows of each run that has data in the window."""
        ror = self.run_of_row
        order = np.argsort(ror, kind="stable")
        sr = ror[order]
        cut = np.flatnonzero(np.diff(sr)) + 1
        out: dict[int, np.ndarray] = {}
        for part in np.split(order, cut):
            if part.size and ror[part[0]] >= 0:
                out[int(ror[part[0]])] = part
        return out

    @cached_property
    def region(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row ``(start, end)`` of the run's span inside the window after
        warm-up (NaN for a row without a run).

        Warm-up lasts ``warmup_max_s`` from the run start, or ends earlier at
        the first stretch of ``warmup_busy_s`` continuously busy on any GPU of
        the run (the same end for every GPU of a run).
        """
        cfg = self.config
        w = self.window
        ror = self.run_of_row
        has = ror >= 0
        rstart = np.full(self.rows, np.nan)
        rend = np.full(self.rows, np.nan)
        runs = w.runs
        if runs and has.any():
            starts = np.array([r.start for r in runs], dtype=np.float64)
            ends = np.array([w.t_end if r.end is None else r.end for r in runs], dtype=np.float64)
            rstart[has] = starts[ror[has]]
            rend[has] = np.minimum(ends[ror[has]], w.t_end)
        ph = self.phases
        sustained = (ph.state == 1) & (ph.dur >= cfg.warmup_busy_s) & (ph.t1 > rstart[ph.row])
        idx = np.flatnonzero(sustained)
        first_busy = np.full(self.rows, np.nan)
        if idx.size:
            rows = ph.row[idx]
            head = np.ones(idx.size, dtype=bool)
            head[1:] = rows[1:] != rows[:-1]
            first_busy[rows[head]] = ph.t0[idx[head]]
        busy_from = np.where(np.isnan(first_busy), np.inf, np.maximum(first_busy, rstart))
        warm_end = np.minimum(rstart + cfg.warmup_max_s, busy_from)
        # Warm-up is the run's, not each GPU's: it ends for every rank when the first has worked a
        # sustained stretch.  A writer rank that pauses every few seconds never works 30 s on end,
        # and judging it from later than its peers would hide the very pauses they wait on.
        if has.any():
            run_end = np.full(len(runs), np.inf)
            np.minimum.at(run_end, ror[has], warm_end[has])
            warm_end[has] = run_end[ror[has]]
        lo = np.fmax(np.fmax(rstart, warm_end), w.t_start)
        lo[~has] = np.nan
        return lo, rend

    @cached_property
    def region_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the flat index range ``[a, b)`` of :attr:`region`."""
        lo, hi = self.region
        a = self.index_at(lo, "left")
        b = self.index_at(hi, "right")
        return a, np.maximum(a, b)

    def region_weights(self) -> np.ndarray:
        """Sample weights inside each row's run region, zero elsewhere (shared: read, never write)."""
        return self._region_weights

    @cached_property
    def _region_weights(self) -> np.ndarray:
        # Starvation and the checkpoint analysis both weigh by it: built once per sweep.
        return self.w * self.range_mask(*self.region_index)

    def recent_enough(self, last: np.ndarray) -> np.ndarray:
        """``last`` lies within ``active_within_s`` (or three sampling
        intervals) of the window's end."""
        horizon = np.maximum(self.config.active_within_s, self.config.active_within_samples * self.dt)
        return last >= self.window.t_end - horizon

    def region_samples(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The samples of ``rows``' run regions, end to end: their flat indexes, whether each
        starts a stretch of contiguous data (a gap, an unreadable sample, or the start of a
        row's region), and each row's count."""
        a0, b0 = self.region_index
        a, b = a0[rows], b0[rows]
        n = np.maximum(b - a, 0)
        idx = self.take(a, b)
        seg = self.seg_start[idx]
        seg[(np.cumsum(n) - n)[n > 0]] = True
        return idx, seg, n

    def rows_phases(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Phases:
        """The phases of ``rows`` inside their run regions, each row with its own hysteresis
        thresholds ``lo[i]`` / ``hi[i]`` (activity); ``offsets`` index the phases of ``rows[i]``
        (those without readable data are dropped)."""
        idx, seg, n = self.region_samples(rows)
        act = self.activity[idx]
        st = hysteresis(act, seg, np.repeat(lo, n), np.repeat(hi, n))
        bnd = seg.copy()
        bnd[1:] |= st[1:] != st[:-1]
        starts = np.flatnonzero(bnd)
        ends = np.empty_like(starts)
        if starts.size:
            ends[:-1] = starts[1:] - 1
            ends[-1] = st.size - 1
            w = self.w[idx]
            dur = segment_sums(w, starts)
            asum = segment_sums(w * (act if self.all_valid else np.nan_to_num(act)), starts)
        else:
            dur = asum = np.zeros(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = asum / dur
        open_end = np.ones(starts.size, dtype=bool)
        if starts.size:
            open_end[:-1] = seg[starts[1:]]
        keep = np.flatnonzero(dur > 0)
        k0, k1 = starts[keep], ends[keep]
        # Which of ``rows`` each kept phase belongs to: rows' samples lie end to end in ``idx``.
        owner = np.searchsorted(np.cumsum(n), k0, side="right")
        return Phases(
            row=rows[owner],
            state=st[k0].astype(np.int8),
            t0=self.time(idx[k0]),
            t1=self.time(idx[k1]) + self.w_all[idx[k1]],
            dur=dur[keep],
            act=mean[keep],
            open_start=seg[k0],
            open_end=open_end[keep],
            offsets=np.searchsorted(owner, np.arange(rows.size + 1)),
        )

    def region_phases(self, r: int) -> Phases:
        """Row ``r``'s phases clipped to its run region (see :attr:`region`).

        A phase cut by the region's start is marked ``open_start``; one cut by
        its end ``open_end``.  Phases without readable data are dropped.
        """
        ph = self.phases
        a, b = int(ph.offsets[r]), int(ph.offsets[r + 1])
        lo, hi = self.region[0][r], self.region[1][r]
        t0 = ph.t0[a:b]
        t1 = ph.t1[a:b]
        c0 = np.fmax(t0, lo)
        c1 = np.fmin(t1, hi)
        keep = (c1 > c0) & (ph.dur[a:b] > 0)
        span = np.where(t1 > t0, t1 - t0, 1.0)
        dur = ph.dur[a:b] * np.clip((c1 - c0) / span, 0.0, 1.0)
        k = np.flatnonzero(keep)
        return Phases(
            row=ph.row[a:b][k],
            state=ph.state[a:b][k],
            t0=c0[k],
            t1=c1[k],
            dur=dur[k],
            act=ph.act[a:b][k],
            open_start=(ph.open_start[a:b] | (t0 < lo))[k],
            open_end=(ph.open_end[a:b] | (t1 > hi))[k],
            offsets=np.array([0, k.size]),
        )
