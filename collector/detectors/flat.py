"""GPU series as flat arrays: the mechanics every detector's judgement is written in.

All GPU series are concatenated into one flat array per column (row-major: the
samples of GPU row 0, then row 1, ...), so per-sample work is a handful of
numpy operations over the whole fleet and per-GPU reductions are
``np.add.reduceat`` over each row's contiguous segment.  A 10,000-GPU window
never loops over samples in Python; loops over GPUs only gather arrays or
examine the few GPUs a cheap vectorised screen has singled out.

Per-sample arrays are float32, times included (seconds since the earliest
sample: sub-millisecond over a day; :meth:`FlatArrays.time` gives epoch
seconds back): half the memory traffic, and a sweep's fresh memory, which is
what costs most at 10,000 GPUs, stays small.

Time, not sample counts: each sample carries a weight in seconds (the interval
to the next sample).  An interval longer than ``gap_factor`` typical intervals
is a gap: the sample before it weighs one typical interval, the time in the
gap counts as neither busy nor idle, and it breaks phases.

Nothing here knows what a busy GPU or a run is: that is
:mod:`~gpufleet.collector.detectors.activity` and
:mod:`~gpufleet.collector.detectors.frame`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpufleet.collector.detectors.stats import last_per_group
from gpufleet.collector.detectors.window import GpuKey, Series

F32 = np.float32


@dataclass(eq=False)
class Episode:
    """Per-row result of :meth:`FlatArrays.trailing_episode` (NaN where none)."""

    onset: np.ndarray
    seconds: np.ndarray
    share: np.ndarray
    last: np.ndarray


def hysteresis(
    act: np.ndarray, seg_start: np.ndarray, lo: float | np.ndarray, hi: float | np.ndarray
) -> np.ndarray:
    """Busy (True) / idle with hysteresis: at or above ``hi`` busy, at or
    below ``lo`` idle, in between the previous state holds; a stretch of data
    (``seg_start``) starts from the nearer threshold.  ``lo`` and ``hi`` are
    numbers or one per sample, compared in ``act``'s own float type either way."""
    lo64, hi64 = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    st = act >= (0.5 * (lo64 + hi64)).astype(act.dtype)
    amb = np.flatnonzero((act > lo64.astype(act.dtype)) & (act < hi64.astype(act.dtype)))
    if amb.size:
        new = np.ones(amb.size, dtype=bool)
        new[1:] = amb[1:] - amb[:-1] != 1
        new |= seg_start[amb]
        heads = amb[new]
        # A run of in-between samples keeps the state before it, unless it
        # opens a stretch of data (then the nearer threshold decides).
        fill = np.where(seg_start[heads], st[heads], st[np.maximum(heads - 1, 0)])
        st[amb] = fill[np.cumsum(new) - 1]
    return st


def segment_sums(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of ``x`` over the segments beginning at ``starts`` (non-empty,
    increasing), as float64.  Accumulates in ``x``'s own float type: casting
    a whole float32 array to float64 first costs more than it is worth."""
    if x.dtype.kind != "f":
        x = x.astype(F32)
    return np.add.reduceat(x, starts).astype(np.float64)


class FlatArrays:
    """Flat arrays over GPU series, one row a series (see the module doc).

    ``gap_factor`` and ``fallback_dt_s`` set the time base: an interval longer
    than ``gap_factor`` typical intervals is a gap, and a row with no interval
    to measure is taken to be sampled every ``fallback_dt_s``.
    """

    def __init__(
        self, keys: list[GpuKey], series: list[Series], gap_factor: float, fallback_dt_s: float
    ) -> None:
        self.keys = keys
        self.series = series
        self.index: dict[GpuKey, int] = {k: i for i, k in enumerate(self.keys)}
        self.rows = g = len(series)
        self.lengths = np.fromiter((len(s) for s in self.series), dtype=np.int64, count=g)
        self.offsets = np.zeros(g + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.starts = self.offsets[:-1]
        self.size = n = int(self.offsets[-1])
        #: Times are float32 seconds since ``base`` (sub-millisecond over a
        #: day); :meth:`time` gives epoch seconds back.
        self.base = min((float(s.t[0]) for s in self.series), default=0.0)
        self.t = np.empty(n, dtype=F32)
        # In slices of rows: one float64 copy of a slice at a time, not one temporary per row.
        for k in range(0, g, 1024):
            part = np.concatenate([s.t for s in self.series[k : k + 1024]])
            np.subtract(part, self.base, out=part)
            self.t[self.offsets[k] : self.offsets[min(k + 1024, g)]] = part
        self._timing(gap_factor, fallback_dt_s)

    # --- layout -----------------------------------------------------------------

    def time(self, idx: np.ndarray | slice | int) -> np.ndarray:
        """Epoch seconds (float64) of flat samples."""
        return self.base + np.asarray(self.t[idx], dtype=np.float64)

    def rel(self, at: np.ndarray | float) -> np.ndarray:
        """Epoch seconds as this frame's relative float32 time."""
        return np.asarray(np.asarray(at, dtype=np.float64) - self.base, dtype=F32)

    def row_times(self, r: int) -> np.ndarray:
        """Row ``r``'s own epoch times (float64)."""
        return np.asarray(self.series[r].t, dtype=np.float64)

    def row_of(self, idx: np.ndarray) -> np.ndarray:
        """Row of each flat index."""
        return np.searchsorted(self.offsets, idx, side="right") - 1

    def per_sample(self, per_row: np.ndarray) -> np.ndarray:
        """A per-row value repeated over the row's samples."""
        return np.repeat(per_row, self.lengths)

    def row_sum(self, x: np.ndarray) -> np.ndarray:
        """Sum of ``x`` over each row (float64)."""
        if self.size == 0:
            return np.zeros(self.rows)
        return segment_sums(x, self.starts)

    def row_slice(self, r: int) -> slice:
        return slice(int(self.offsets[r]), int(self.offsets[r + 1]))

    def last_time(self, mask: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(mask)
        return last_per_group(self.row_of(idx), self.time(idx), self.rows)

    def take(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Flat indexes of the ranges ``[a[r], b[r])`` of every row, concatenated."""
        n = np.maximum(b - a, 0)
        tot = int(n.sum())
        if tot == 0:
            return np.zeros(0, dtype=np.int64)
        it = np.int32 if self.size < 2**31 else np.int64
        before = np.cumsum(n) - n
        return np.repeat((a - before).astype(it), n) + np.arange(tot, dtype=it)

    def range_mask(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Boolean mask of the ranges ``[a[r], b[r])`` of every row."""
        d = np.zeros(self.size + 1, dtype=np.int8)
        ok = b > a
        np.add.at(d, a[ok], 1)
        np.add.at(d, b[ok], -1)
        return np.cumsum(d[:-1], dtype=np.int8).view(bool)

    def index_at(self, at: np.ndarray, side: str = "left") -> np.ndarray:
        """Per row, the flat index of the first sample at or after ``at``
        (``side="right"``: after); NaN ``at`` gives the row's end."""
        g = self.rows
        out = np.empty(g, dtype=np.int64)
        if g == 0:
            return out
        at = self.rel(at)
        t0 = self.t[self.starts]
        t1 = self.t[self.offsets[1:] - 1]
        before = (at < t0) | ((side == "left") & (at == t0))
        after = ~(at < t1) if side == "right" else ~(at <= t1)
        out[:] = np.where(before, self.starts, self.offsets[1:])
        inner = np.flatnonzero(~before & ~after & np.isfinite(at))
        if inner.size:
            # Vectorised bisection over the rows' own segments.
            lo = self.offsets[inner].copy()
            hi = self.offsets[inner + 1].copy()
            target = at[inner]
            while True:
                open_ = lo < hi
                if not open_.any():
                    break
                mid = (lo + hi) // 2
                tm = self.t[np.minimum(mid, self.size - 1)]
                go_right = (tm <= target) if side == "right" else (tm < target)
                lo = np.where(open_ & go_right, mid + 1, lo)
                hi = np.where(open_ & ~go_right, mid, hi)
            out[inner] = lo
        return out

    # --- columns ----------------------------------------------------------------

    def col(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The flat column (float32, NaN for NULL or never reported), into
        ``out`` when given.

        Not cached: callers derive what they need and let it go, and the
        frame's own transient columns go into two reused scratch buffers, so a
        sweep's memory stays small (fresh memory is what costs most here)."""
        if out is None:
            out = np.empty(self.size, dtype=F32)
        if not self.size or name not in self._names:
            out.fill(np.nan)
            return out
        if name in self._names_everywhere:  # most columns of most fleets: no gaps to fill
            return np.concatenate([s.cols[name] for s in self.series], out=out, casting="same_kind")
        return np.concatenate(
            [np.full(len(s), np.nan) if (p := s.cols.get(name)) is None else p for s in self.series],
            out=out,
            casting="same_kind",
        )

    def transient(self, name: str) -> np.ndarray:
        """:meth:`col` into a reused buffer: valid until the frame's next use
        of it (any other column access), so consume it at once."""
        return self.col(name, out=self._scratch[0])

    @cached_property
    def _scratch(self) -> tuple[np.ndarray, np.ndarray]:
        return np.empty(self.size, dtype=F32), np.empty(self.size, dtype=F32)

    def at(self, name: str, idx: np.ndarray) -> np.ndarray:
        """Column ``name`` at ascending flat indexes ``idx`` without building
        the whole column when few rows are involved."""
        if idx.size * 4 > self.size:
            return self.col(name, out=self._scratch[0])[idx]
        out = np.full(idx.size, np.nan, dtype=F32)
        if idx.size == 0:
            return out
        rows = self.row_of(idx)
        cut = np.flatnonzero(rows[1:] != rows[:-1]) + 1
        bounds = np.concatenate([[0], cut, [idx.size]]).tolist()
        for i in range(len(bounds) - 1):
            a, b = bounds[i], bounds[i + 1]
            r = int(rows[a])
            arr = self.series[r].cols.get(name)
            if arr is not None:
                out[a:b] = arr[idx[a:b] - self.offsets[r]]
        return out

    def at_ranges(self, name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Column ``name`` over the ranges of :meth:`take` (same order),
        copied from the series without building the whole column."""
        rows = np.flatnonzero(b > a).tolist()
        if not rows:
            return np.zeros(0, dtype=F32)
        lo = (a - self.starts).tolist()
        hi = (b - self.starts).tolist()
        series = self.series
        if name in self._names_everywhere:
            parts = [series[r].cols[name][lo[r] : hi[r]] for r in rows]
        else:
            parts = [
                np.full(hi[r] - lo[r], np.nan, dtype=F32)
                if (arr := series[r].cols.get(name)) is None
                else arr[lo[r] : hi[r]]
                for r in rows
            ]
        return np.concatenate(parts, dtype=F32, casting="same_kind")

    def series_col(self, r: int, name: str) -> np.ndarray:
        """Row ``r``'s own float64 array of ``name`` (NaN when never reported)."""
        return np.asarray(self.series[r].get(name), dtype=np.float64)

    def has(self, name: str) -> bool:
        """Some series holds column ``name``."""
        return name in self._names

    @cached_property
    def _names(self) -> frozenset[str]:
        # One pass over every series for all names: detectors ask about a dozen names, most
        # of which no GPU of a fleet reports, and each such question scanned every series.
        return frozenset().union(*(s.cols for s in self.series))

    @cached_property
    def _names_everywhere(self) -> frozenset[str]:
        """Column names every series holds."""
        return (
            frozenset(self.series[0].cols).intersection(*(s.cols for s in self.series))
            if self.series
            else frozenset()
        )

    # --- time -------------------------------------------------------------------

    def _timing(self, gap_factor: float, fallback_dt_s: float) -> None:
        n, g = self.size, self.rows
        first = np.zeros(n, dtype=bool)
        first[self.starts] = True
        dt_prev = np.zeros(n, dtype=F32)
        if n > 1:
            np.subtract(self.t[1:], self.t[:-1], out=dt_prev[1:])
            dt_prev[self.starts] = 0.0
            np.maximum(dt_prev, 0.0, out=dt_prev)
        intervals = self.lengths - 1
        span = np.array([s.t[-1] - s.t[0] for s in self.series], dtype=np.float64) if g else np.zeros(0)
        # Typical interval: the mean, then the mean without the gaps it finds,
        # so one long gap does not hide the others (cheaper than a median).
        with np.errstate(invalid="ignore", divide="ignore"):
            typ = span / intervals
            gap = dt_prev > self.per_sample((gap_factor * typ).astype(F32))
            gi = np.flatnonzero(gap)
            if gi.size:
                gr = self.row_of(gi)
                gsum = np.bincount(gr, weights=dt_prev[gi], minlength=g)
                gcnt = np.bincount(gr, minlength=g)
                rest = intervals - gcnt
                typ = np.where((gcnt > 0) & (rest > 0), (span - gsum) / np.maximum(rest, 1), typ)
                gap = dt_prev > self.per_sample((gap_factor * typ).astype(F32))
        typ = np.where(np.isfinite(typ) & (typ > 0), typ, fallback_dt_s)
        self.dt = typ
        gap |= first
        del first
        w = dt_prev  # reused in place: the interval to the next sample
        if n:
            w[:-1] = w[1:]
            nxt = np.flatnonzero(gap[1:])
            w[nxt] = typ[self.row_of(nxt)]
            w[self.offsets[1:] - 1] = typ
        self.gap = gap
        self.w_all = w

    # --- episodes -----------------------------------------------------------------

    def trailing_episode(self, weight: np.ndarray, ind: np.ndarray, min_share: float) -> Episode:
        """Per row, the longest recent stretch in which ``ind`` holds for at
        least ``min_share`` of the ``weight`` (seconds).

        ``onset`` is the earliest sample with ``ind`` from which, to the end of
        the row, the condition's share is at least ``min_share``; ``seconds``
        the condition's weight from there; ``last`` the latest sample with
        ``ind``.  A condition that began inside the window is thus dated from
        its real start, and one that ended long ago is diluted away.  Only
        rows where ``ind`` ever holds are computed.
        """
        g = self.rows
        onset = np.full(g, np.nan)
        secs = np.full(g, np.nan)
        share = np.full(g, np.nan)
        hit = np.flatnonzero(ind & (weight > 0))
        hrow = self.row_of(hit)
        last = last_per_group(hrow, self.time(hit), g)
        if hit.size == 0:
            return Episode(onset, secs, share, last)
        head = np.ones(hrow.size, dtype=bool)
        head[1:] = hrow[1:] != hrow[:-1]
        rows = hrow[head]
        n = self.lengths[rows]
        if rows.size == g:
            idx = None
            wt = weight.astype(np.float64)
            on = ind & (weight > 0)
        else:
            idx = self.take(self.offsets[rows], self.offsets[rows + 1])
            wt = weight[idx].astype(np.float64)
            on = ind[idx] & (wt > 0)
        wi = wt * on
        x = wi - min_share * wt
        d = np.cumsum(x)
        c = np.cumsum(wi)
        ends = np.cumsum(n) - 1
        # From each sample to its row's end: condition weight minus share * weight.
        excess = np.repeat(d[ends], n) - d + x
        cond = np.flatnonzero(on & (excess >= -1e-6))
        if cond.size:
            local = np.searchsorted(ends, cond)
            first = np.ones(cond.size, dtype=bool)
            first[1:] = local[1:] != local[:-1]
            sel = cond[first]
            ls = local[first]
            r = rows[ls]
            tail_i = c[ends[ls]] - c[sel] + wi[sel]
            tail_w = (tail_i - excess[sel]) / min_share if min_share > 0 else np.full(sel.size, np.nan)
            onset[r] = self.time(sel if idx is None else idx[sel])
            secs[r] = tail_i
            with np.errstate(invalid="ignore", divide="ignore"):
                share[r] = np.where(tail_w > 0, tail_i / np.where(tail_w > 0, tail_w, 1.0), 1.0)
        return Episode(onset, secs, share, last)
