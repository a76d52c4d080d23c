"""The window's GPU samples as flat arrays, shared by every detector of a sweep.

All GPU series are concatenated into one flat array per column (row-major: the
samples of GPU row 0, then row 1, ...), so that per-sample work is a handful of
numpy operations over the whole fleet and per-GPU reductions are ``bincount``
calls.  A 10,000-GPU window never loops over samples or GPUs in Python except
to gather the arrays.

Time, not sample counts: each sample carries a weight in seconds (the interval
to the next sample).  An interval longer than ``gap_factor`` typical intervals
is a gap: the sample before it weighs one typical interval, the time in the
gap counts as neither busy nor idle, and it breaks phases.  Samples with no
activity reading weigh nothing and also break phases.

Activity (0-1), per sample:

* ``max(sm_active, dram_active)`` where DCGM profiling fields are reported;
* otherwise ``min(util_pct / 100, power activity)``, power activity being
  ``power_w / power_limit_w`` mapped linearly from ``power_idle_frac`` (0) to
  ``power_busy_frac`` (1): GPU-Util says a kernel was resident, not that the
  GPU did work, and spinning collective kernels keep it at 100 %;
* ``util_pct / 100`` alone, or power activity alone, when only one exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from collector.detectors.config import DetectorConfig
from collector.detectors.stats import first_per_group, last_per_group
from collector.detectors.window import GpuKey, RunInfo, Window
from gpufleet.catalog import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)

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
class Phases:
    """Maximal stretches of one busy/idle state within contiguous data.

    Arrays are parallel, sorted by row then time.  ``t1`` is the end of the
    last sample's interval.  ``open_start`` marks a phase that begins at the
    start of the row's data or after a gap (its true start is unseen);
    ``open_end`` one that ends at a gap or at the end of the data.
    """

    row: np.ndarray
    state: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    dur: np.ndarray
    act: np.ndarray
    open_start: np.ndarray
    open_end: np.ndarray
    #: Index of the first phase of each row (length rows + 1).
    offsets: np.ndarray


@dataclass(eq=False)
class Episode:
    """Per-row result of :meth:`Frame.trailing_episode` (NaN where none)."""

    onset: np.ndarray
    seconds: np.ndarray
    share: np.ndarray
    last: np.ndarray


class Frame:
    """Flat arrays over every GPU series of a window (see the module doc)."""

    def __init__(self, window: Window, config: DetectorConfig) -> None:
        self.window = window
        self.config = config
        items = [(k, s) for k, s in window.gpus.items() if len(s) > 0]
        self.keys: list[GpuKey] = [k for k, _ in items]
        self.series = [s for _, s in items]
        self.index: dict[GpuKey, int] = {k: i for i, k in enumerate(self.keys)}
        self.rows = g = len(items)
        self.lengths = np.fromiter((len(s) for s in self.series), dtype=np.int64, count=g)
        self.offsets = np.zeros(g + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.size = n = int(self.offsets[-1])
        self._cols: dict[str, np.ndarray] = {}
        if n == 0:
            self.t = np.zeros(0)
        else:
            self.t = np.concatenate([np.asarray(s.t, dtype=np.float64) for s in self.series])
        self.row = np.repeat(np.arange(g, dtype=np.int64), self.lengths)
        first = np.zeros(n, dtype=bool)
        first[self.offsets[:-1][self.lengths > 0]] = True
        self.first = first
        self._timing()

    # --- columns --------------------------------------------------------------

    def col(self, name: str) -> np.ndarray:
        """The flat column (float64, NaN for NULL or never reported)."""
        got = self._cols.get(name)
        if got is None:
            parts = [s.cols.get(name) for s in self.series]
            if all(p is None for p in parts):
                got = np.full(self.size, np.nan)
            else:
                got = np.concatenate([
                    np.full(len(s), np.nan) if p is None else np.asarray(p, dtype=np.float64)
                    for s, p in zip(self.series, parts, strict=True)
                ]) if self.size else np.zeros(0)
            self._cols[name] = got
        return got

    def has(self, name: str) -> bool:
        return any(s.cols.get(name) is not None for s in self.series)

    def row_sum(self, x: np.ndarray) -> np.ndarray:
        return np.bincount(self.row, weights=x, minlength=self.rows)

    def row_mean(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Weighted mean of the finite values of ``x`` per row (NaN where none)."""
        ok = np.isfinite(x)
        wx = np.where(ok, weight, 0.0)
        den = self.row_sum(wx)
        num = self.row_sum(np.where(ok, x, 0.0) * wx)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    def first_time(self, mask: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(mask)
        return first_per_group(self.row[idx], self.t[idx], self.rows)

    def last_time(self, mask: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(mask)
        return last_per_group(self.row[idx], self.t[idx], self.rows)

    def row_slice(self, r: int) -> slice:
        return slice(int(self.offsets[r]), int(self.offsets[r + 1]))

    # --- time -----------------------------------------------------------------

    def _timing(self) -> None:
        cfg = self.config
        n, g = self.size, self.rows
        dt_prev = np.zeros(n)
        if n > 1:
            np.subtract(self.t[1:], self.t[:-1], out=dt_prev[1:])
        dt_prev[self.first] = 0.0
        np.maximum(dt_prev, 0.0, out=dt_prev)
        intervals = np.maximum(self.lengths - 1, 0)
        # Typical interval: a mean that drops outliers (gaps) twice over, so a
        # long gap does not inflate it; cheaper than a per-row median.
        with np.errstate(invalid="ignore", divide="ignore"):
            typ = self.row_sum(dt_prev) / intervals
            for _ in range(2):
                keep = dt_prev <= 3.0 * typ[self.row]
                keep &= ~self.first
                cnt = np.bincount(self.row, weights=keep, minlength=g)
                typ = np.where(cnt > 0, self.row_sum(dt_prev * keep) / np.where(cnt > 0, cnt, 1), typ)
        typ = np.where(np.isfinite(typ) & (typ > 0), typ, cfg.fallback_dt_s)
        self.dt = typ
        typ_s = typ[self.row]
        gap = self.first | (dt_prev > cfg.gap_factor * typ_s)
        w = np.empty(n)
        if n:
            w[:-1] = dt_prev[1:]
            nxt_gap = np.ones(n, dtype=bool)
            nxt_gap[:-1] = gap[1:]
            np.copyto(w, typ_s, where=nxt_gap)
        self.gap = gap
        self.w_all = w

    # --- activity ---------------------------------------------------------------

    @cached_property
    def power_frac(self) -> np.ndarray:
        """Board power over the enforced limit (NaN where either is missing)."""
        lim = self.col("power_limit_w")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(lim > 0, self.col("power_w") / np.where(lim > 0, lim, 1.0), np.nan)

    @cached_property
    def activity(self) -> np.ndarray:
        cfg = self.config
        sm = self.col("sm_active")
        if self.has("dram_active"):
            sm = np.fmax(sm, np.where(np.isfinite(sm), self.col("dram_active"), np.nan))
        act = sm.copy()
        need = np.flatnonzero(~np.isfinite(sm))
        if need.size:
            util = self.col("util_pct")[need] / 100.0
            pf = self.power_frac[need]
            pa = np.clip((pf - cfg.power_idle_frac) / (cfg.power_busy_frac - cfg.power_idle_frac), 0.0, 1.0)
            fb = np.fmin(np.clip(util, 0.0, 1.0), pa)
            act[need] = fb
        return act

    @cached_property
    def activity_source(self) -> list[str]:
        """Per row: ``dcgm`` (profiling fields), ``nvml`` (util/power) or ``none``."""
        out = []
        for s in self.series:
            if s.has("sm_active"):
                out.append("dcgm")
            elif s.has("util_pct") or s.has("power_w"):
                out.append("nvml")
            else:
                out.append("none")
        return out

    @cached_property
    def valid(self) -> np.ndarray:
        return np.isfinite(self.activity)

    @cached_property
    def w(self) -> np.ndarray:
        """Sample weights in seconds; zero where activity is unknown."""
        v = self.valid
        return self.w_all if v.all() else np.where(v, self.w_all, 0.0)

    @cached_property
    def seg_start(self) -> np.ndarray:
        """Sample starts a stretch of contiguous, readable data."""
        v = self.valid
        if v.all():
            return self.gap
        s = self.gap | ~v
        s[1:] |= ~v[:-1]
        return s

    @cached_property
    def busy(self) -> np.ndarray:
        return self.activity >= self.config.busy_activity

    @cached_property
    def state(self) -> np.ndarray:
        """Busy (1) / idle (0) with hysteresis: between the thresholds the
        previous state holds; a stretch of data starts from the nearer one."""
        cfg = self.config
        act = self.activity
        n = self.size
        s = np.full(n, -1, dtype=np.int8)
        s[act >= cfg.busy_activity] = 1
        s[act <= cfg.idle_activity] = 0
        need = self.seg_start & (s < 0)
        mid = 0.5 * (cfg.busy_activity + cfg.idle_activity)
        s[need] = act[need] >= mid
        idx = np.where(s >= 0, np.arange(n), 0)
        np.maximum.accumulate(idx, out=idx)
        return s[idx]

    @cached_property
    def phases(self) -> Phases:
        n = self.size
        st = self.state
        b = self.seg_start.copy()
        if n > 1:
            b[1:] |= st[1:] != st[:-1]
        starts = np.flatnonzero(b)
        ends = np.empty_like(starts)
        if starts.size:
            ends[:-1] = starts[1:] - 1
            ends[-1] = n - 1
        w = self.w
        cw = np.zeros(n + 1)
        np.cumsum(w, out=cw[1:])
        cwa = np.zeros(n + 1)
        np.cumsum(w * np.nan_to_num(self.activity), out=cwa[1:])
        dur = cw[ends + 1] - cw[starts]
        with np.errstate(invalid="ignore", divide="ignore"):
            act = np.where(dur > 0, (cwa[ends + 1] - cwa[starts]) / np.where(dur > 0, dur, 1.0), np.nan)
        open_start = self.seg_start[starts]
        open_end = np.ones(starts.size, dtype=bool)
        if starts.size:
            open_end[:-1] = self.seg_start[starts[1:]]
        prow = self.row[starts]
        offsets = np.searchsorted(prow, np.arange(self.rows + 1))
        return Phases(
            row=prow, state=st[starts], t0=self.t[starts], t1=self.t[ends] + self.w_all[ends], dur=dur,
            act=act, open_start=open_start, open_end=open_end, offsets=offsets,
        )

    # --- derived hardware signals -------------------------------------------------

    @cached_property
    def clock_ratio(self) -> np.ndarray:
        """SM clock over its maximum; the GPU's highest clock in the window
        stands in for a missing maximum."""
        clk = self.col("sm_clock_mhz")
        mx = self.col("sm_clock_max_mhz")
        miss = ~(mx > 0) & np.isfinite(clk)
        if miss.any() and self.size:
            seen = np.fmax.reduceat(np.where(np.isfinite(clk), clk, -np.inf), self.offsets[:-1][self.lengths > 0])
            row_max = np.full(self.rows, np.nan)
            row_max[self.lengths > 0] = seen
            mx = np.where(miss, row_max[self.row], mx)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(mx > 0, clk / np.where(mx > 0, mx, 1.0), np.nan)

    @cached_property
    def throttle_bits(self) -> np.ndarray:
        """Reason bits of interest (int64, 0 where none or not reported)."""
        raw = self.col("throttle_reasons")
        bits = np.where(np.isfinite(raw), raw, 0).astype(np.int64)
        return bits & THROTTLE_MASK

    @cached_property
    def pcie_degraded(self) -> np.ndarray:
        """Link generation or width below its maximum (False where unknown)."""
        gen, gen_max = self.col("pcie_gen"), self.col("pcie_gen_max")
        wid, wid_max = self.col("pcie_width"), self.col("pcie_width_max")
        return (gen < self._max_or_seen(gen, gen_max)) | (wid < self._max_or_seen(wid, wid_max))

    def _max_or_seen(self, cur: np.ndarray, mx: np.ndarray) -> np.ndarray:
        miss = ~np.isfinite(mx) & np.isfinite(cur)
        if not miss.any():
            return mx
        seen = np.fmax.reduceat(np.where(np.isfinite(cur), cur, -np.inf), self.offsets[:-1][self.lengths > 0])
        row_max = np.full(self.rows, np.nan)
        row_max[self.lengths > 0] = seen
        return np.where(miss, row_max[self.row], mx)

    # --- runs -------------------------------------------------------------------

    @cached_property
    def runs_of_row(self) -> list[list[int]]:
        """Per row, indexes into ``window.runs`` of the runs that held the GPU
        at some point of the window."""
        out: list[list[int]] = [[] for _ in range(self.rows)]
        w = self.window
        for i, run in enumerate(w.runs):
            if run.start > w.t_end or (run.end is not None and run.end < w.t_start):
                continue
            for key in run.allocations:
                r = self.index.get((key[0], int(key[1])))
                if r is not None:
                    out[r].append(i)
        return out

    @cached_property
    def run_of_row(self) -> np.ndarray:
        """Index into ``window.runs`` of the run each GPU row worked for (-1: none).

        Where several runs held the GPU during the window, the latest one.
        """
        runs = self.window.runs
        return np.fromiter(
            (max(c, key=lambda i: runs[i].start) if c else -1 for c in self.runs_of_row),
            dtype=np.int64, count=self.rows,
        )

    def run_id_at(self, r: int, at: float) -> str | None:
        """The run that held row ``r``'s GPU at time ``at`` (latest start wins)."""
        best: RunInfo | None = None
        for i in self.runs_of_row[r]:
            run = self.window.runs[i]
            if run.start <= at and (run.end is None or run.end >= at) and (best is None or run.start > best.start):
                best = run
        return best.run_id if best else None

    def run(self, i: int) -> RunInfo:
        return self.window.runs[i]

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
        the first stretch of ``warmup_busy_s`` continuously busy.
        """
        cfg = self.config
        w = self.window
        ror = self.run_of_row
        has = ror >= 0
        rstart = np.full(self.rows, np.nan)
        rend = np.full(self.rows, np.nan)
        runs = w.runs
        starts = np.array([r.start for r in runs], dtype=np.float64) if runs else np.zeros(0)
        ends = np.array([w.t_end if r.end is None else r.end for r in runs], dtype=np.float64) if runs else np.zeros(0)
        rstart[has] = starts[ror[has]]
        rend[has] = np.minimum(ends[ror[has]], w.t_end)
        ph = self.phases
        sustained = (ph.state == 1) & (ph.dur >= cfg.warmup_busy_s) & (ph.t1 > rstart[ph.row])
        idx = np.flatnonzero(sustained)
        first_busy = first_per_group(ph.row[idx], ph.t0[idx], self.rows)
        warm_end = np.fmin(rstart + cfg.warmup_max_s, np.fmax(first_busy, rstart))
        lo = np.fmax(np.fmax(rstart, warm_end), w.t_start)
        lo[~has] = np.nan
        return lo, rend

    @cached_property
    def in_region(self) -> np.ndarray:
        lo, hi = self.region
        return (self.t >= lo[self.row]) & (self.t <= hi[self.row])

    # --- episodes -----------------------------------------------------------------

    def trailing_episode(self, weight: np.ndarray, ind: np.ndarray, min_share: float) -> Episode:
        """Per row, the longest recent stretch in which ``ind`` holds for at
        least ``min_share`` of the ``weight`` (seconds).

        ``onset`` is the earliest sample with ``ind`` from which, to the end of
        the row, the condition's share is at least ``min_share``; ``seconds``
        the condition's weight from there; ``last`` the latest sample with
        ``ind``.  A condition that began inside the window is thus dated from
        its real start, and one that ended long ago is diluted away.
        """
        g = self.rows
        onset = np.full(g, np.nan)
        secs = np.full(g, np.nan)
        share = np.full(g, np.nan)
        if self.size == 0:
            return Episode(onset, secs, share, np.full(g, np.nan))
        wi = np.where(ind, weight, 0.0)
        cw = np.cumsum(weight)
        ci = np.cumsum(wi)
        end = self.offsets[1:] - 1
        ok_rows = self.lengths > 0
        row_cw = np.zeros(g)
        row_ci = np.zeros(g)
        row_cw[ok_rows] = cw[end[ok_rows]]
        row_ci[ok_rows] = ci[end[ok_rows]]
        tail_w = row_cw[self.row] - cw + weight
        tail_i = row_ci[self.row] - ci + wi
        cond = ind & (weight > 0) & (tail_i >= min_share * tail_w - 1e-9)
        idx = np.flatnonzero(cond)
        if idx.size:
            head = np.ones(idx.size, dtype=bool)
            head[1:] = self.row[idx[1:]] != self.row[idx[:-1]]
            sel = idx[head]
            r = self.row[sel]
            onset[r] = self.t[sel]
            secs[r] = tail_i[sel]
            share[r] = tail_i[sel] / np.where(tail_w[sel] > 0, tail_w[sel], 1.0)
        return Episode(onset, secs, share, self.last_time(ind & (weight > 0)))

    def recent_enough(self, last: np.ndarray) -> np.ndarray:
        """``last`` lies within ``active_within_s`` (or three sampling
        intervals) of the window's end."""
        horizon = np.maximum(self.config.active_within_s, 3.0 * self.dt)
        return last >= self.window.t_end - horizon

