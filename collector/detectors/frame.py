"""The window's GPU samples as flat arrays, shared by every detector of a sweep.

All GPU series are concatenated into one flat array per column (row-major: the
samples of GPU row 0, then row 1, ...), so per-sample work is a handful of
numpy operations over the whole fleet and per-GPU reductions are
``np.add.reduceat`` over each row's contiguous segment.  A 10,000-GPU window
never loops over samples in Python; loops over GPUs only gather arrays or
examine the few GPUs a cheap vectorised screen has singled out.

Per-sample arrays are float32, times included (seconds since the earliest
sample: sub-millisecond over a day; :meth:`Frame.time` gives epoch seconds
back): half the memory traffic, and a sweep's fresh memory, which is what
costs most at 10,000 GPUs, stays small.

Time, not sample counts: each sample carries a weight in seconds (the interval
to the next sample).  An interval longer than ``gap_factor`` typical intervals
is a gap: the sample before it weighs one typical interval, the time in the
gap counts as neither busy nor idle, and it breaks phases.  Samples with no
activity reading weigh nothing and also break phases.

Activity (0-1), per sample:

* ``max(sm_active, dram_active)`` where DCGM profiling fields are reported;
* otherwise ``min(util_pct / 100, power activity)``, power activity being
  ``power_w`` over the enforced limit (or, where none is reported, the
  model's board power or the run's own power history:
  :attr:`Frame.power_reference`) mapped linearly from ``power_idle_frac``
  (0) to ``power_busy_frac`` (1): GPU-Util says a kernel was resident, not
  that the GPU did work, and spinning collective kernels keep it at 100 %;
* ``util_pct / 100`` alone, or power activity alone, when only one exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from gpufleet.catalog import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
)
from gpufleet.collector.detectors.stats import last_per_group
from gpufleet.collector.detectors.window import GpuKey, RunInfo, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.gpu_models import board_power_w, gpu_model_names

F32 = np.float32

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


def hysteresis(act: np.ndarray, seg_start: np.ndarray, lo: float | np.ndarray, hi: float | np.ndarray) -> np.ndarray:
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
        self.starts = self.offsets[:-1]
        self.size = n = int(self.offsets[-1])
        #: Times are float32 seconds since ``base`` (sub-millisecond over a
        #: day); :meth:`time` gives epoch seconds back.
        self.base = min((float(s.t[0]) for s in self.series), default=0.0)
        #: Results detectors share within one sweep (e.g. which runs the
        #: checkpoint detector claims, so starvation does not claim them too).
        self.memo: dict[str, Any] = {}
        self.t = np.empty(n, dtype=F32)
        # In slices of rows: one float64 copy of a slice at a time, not one temporary per row.
        for k in range(0, g, 1024):
            part = np.concatenate([s.t for s in self.series[k:k + 1024]])
            np.subtract(part, self.base, out=part)
            self.t[self.offsets[k]:self.offsets[min(k + 1024, g)]] = part
        self._timing()

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
            out=out, casting="same_kind",
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
            parts = [series[r].cols[name][lo[r]:hi[r]] for r in rows]
        else:
            parts = [np.full(hi[r] - lo[r], np.nan, dtype=F32) if (arr := series[r].cols.get(name)) is None
                     else arr[lo[r]:hi[r]] for r in rows]
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
        return frozenset(self.series[0].cols).intersection(*(s.cols for s in self.series)) if self.series \
            else frozenset()

    # --- time -------------------------------------------------------------------

    def _timing(self) -> None:
        cfg = self.config
        n, g = self.size, self.rows
        first = np.zeros(n, dtype=bool)
        first[self.starts] = True
        dt_prev = np.zeros(n, dtype=F32)
        if n > 1:
            np.subtract(self.t[1:], self.t[:-1], out=dt_prev[1:])
            dt_prev[self.starts] = 0.0
            np.maximum(dt_prev, 0.0, out=dt_prev)
        intervals = self.lengths - 1
        span = (
            np.array([s.t[-1] - s.t[0] for s in self.series], dtype=np.float64) if g else np.zeros(0)
        )
        # Typical interval: the mean, then the mean without the gaps it finds,
        # so one long gap does not hide the others (cheaper than a median).
        with np.errstate(invalid="ignore", divide="ignore"):
            typ = span / intervals
            gap = dt_prev > self.per_sample((cfg.gap_factor * typ).astype(F32))
            gi = np.flatnonzero(gap)
            if gi.size:
                gr = self.row_of(gi)
                gsum = np.bincount(gr, weights=dt_prev[gi], minlength=g)
                gcnt = np.bincount(gr, minlength=g)
                rest = intervals - gcnt
                typ = np.where((gcnt > 0) & (rest > 0), (span - gsum) / np.maximum(rest, 1), typ)
                gap = dt_prev > self.per_sample((cfg.gap_factor * typ).astype(F32))
        typ = np.where(np.isfinite(typ) & (typ > 0), typ, cfg.fallback_dt_s)
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

    # --- activity ---------------------------------------------------------------

    def power_frac(self, idx: np.ndarray, history: bool = True, power: np.ndarray | None = None,
                   limit: np.ndarray | None = None) -> np.ndarray:
        """Board power over the GPU's reference power at flat indexes ``idx``
        (NaN where either is missing): the enforced limit where reported,
        else :attr:`power_reference`.  ``history=False`` leaves out a
        reference taken from the power itself, for judgements that would be
        circular with it ("at its limit").  ``power`` and ``limit``: those
        columns at ``idx`` where the caller has gathered them already (each
        gather of a column at 10,000 GPUs costs 12 to 19 ms)."""
        lim = self.at("power_limit_w", idx) if limit is None else limit.copy()
        miss = ~(lim > 0)
        if miss.any():
            ref, basis = self.power_reference
            if not history:
                ref = np.where(np.array([b == "history" for b in basis], dtype=bool), np.nan, ref)
            lim[miss] = ref[self.row_of(idx[miss])]
        with np.errstate(invalid="ignore", divide="ignore"):
            pf = (self.at("power_w", idx) if power is None else power) / lim
        pf[~(lim > 0)] = np.nan
        return pf

    @cached_property
    def power_reference(self) -> tuple[np.ndarray, list[str]]:
        """Per row, the power that stands for "fully busy" where no enforced
        limit is reported, and its basis.

        Basis, per row: ``limit`` (the GPU reports its enforced limit: the
        reference is unused); ``model`` (the default board power of the
        product name in the node's facts, :mod:`gpufleet.gpu_models`);
        ``history`` (the median over the GPU's run, else its node, of each
        GPU's ``power_ref_percentile`` of power in the window: peers share
        one reference, so a GPU capped to a lower plateau reads as less busy
        than its peers, not as busy as them); ``none`` (no power, or power
        that never rose to ``power_ref_min_ratio`` times its idle level, which
        tells busy from idle no better than GPU-Util does).
        """
        cfg = self.config
        ref = np.full(self.rows, np.nan)
        basis = ["limit"] * self.rows
        need = [r for r, s in enumerate(self.series) if not s.has("power_limit_w")]
        if not need:
            return ref, basis
        models = {node: gpu_model_names(self.window.node_facts.get(node))
                  for node in {self.keys[r][0] for r in need}}
        hist: list[int] = []
        for r in need:
            node, gpu = self.keys[r]
            names = models[node]
            watts = board_power_w(names.get(gpu, names.get(-1)))
            if watts is not None:
                ref[r], basis[r] = watts, "model"
            else:
                hist.append(r)
        if not hist:
            return ref, basis
        hi = np.full(self.rows, np.nan)
        lo = np.full(self.rows, np.nan)
        for r in hist:
            p = self.series[r].get("power_w")
            p = p[np.isfinite(p)]
            if p.size:
                lo[r], hi[r] = np.percentile(p, (5.0, cfg.power_ref_percentile))
        ror = self.run_of_row
        groups: dict[object, list[int]] = {}
        for r in hist:
            groups.setdefault(("run", int(ror[r])) if ror[r] >= 0 else ("node", self.keys[r][0]), []).append(r)
        for rows in groups.values():
            h, q = hi[rows], lo[rows]
            if not np.isfinite(h).any():
                for r in rows:
                    basis[r] = "none"
                continue
            href, qref = float(np.nanmedian(h)), float(np.nanmedian(q))
            ok = href >= cfg.power_ref_min_ratio * max(qref, 1.0)
            for r in rows:
                if ok:
                    ref[r], basis[r] = href, "history"
                else:
                    basis[r] = "none"
        return ref, basis

    def activity_basis(self, rows: np.ndarray | list[int]) -> str:
        """How the activity of ``rows`` was judged, for a finding's evidence:
        ``sm_active`` (DCGM profiling), ``util+power_limit``,
        ``util+model_power``, ``util+power_history``, ``util`` (GPU-Util
        alone: power could not tell spinning from computing) or ``power``
        (no GPU-Util); several joined by commas."""
        src = self.activity_source
        basis = self.power_reference[1]
        out = set()
        for r in (int(x) for x in rows):
            if src[r] == "dcgm":
                out.add("sm_active")
                continue
            pw = {"limit": "power_limit", "model": "model_power", "history": "power_history"}.get(basis[r])
            has_util = self.series[r].has("util_pct")
            if pw is None or not self.series[r].has("power_w"):
                out.add("util" if has_util else "none")
            else:
                out.add(f"util+{pw}" if has_util else f"power+{pw}")
        return ",".join(sorted(out))

    @cached_property
    def activity(self) -> np.ndarray:
        cfg = self.config
        act = self.col("sm_active")
        if self.has("dram_active"):
            np.fmax(act, self.col("dram_active", out=self._scratch[1]), out=act, where=~np.isnan(act))
        need = np.flatnonzero(np.isnan(act))
        if need.size:
            util = self.at("util_pct", need) / F32(100.0)
            pa = (self.power_frac(need) - cfg.power_idle_frac) / (cfg.power_busy_frac - cfg.power_idle_frac)
            act[need] = np.fmin(np.clip(util, 0.0, 1.0), np.clip(pa, 0.0, 1.0))
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
    def paused(self) -> np.ndarray:
        """Activity at most ``ckpt_pause_activity``: no useful work, whether
        no kernel runs or a collective merely spins (False where unknown)."""
        return self.activity <= self.config.ckpt_pause_activity

    def kernel_resident(self, r: int) -> np.ndarray:
        """Per sample of row ``r``: 1 where a kernel was resident (GPU-Util at
        least ``ckpt_spin_util_pct``, or without GPU-Util SM activity at least
        ``ckpt_spin_sm_active``), 0 where none, NaN where neither is known.
        Tells a rank that blocks (no kernel) from peers spinning in a
        collective (kernel resident, no work)."""
        cfg = self.config
        s = self.series[r]
        if s.has("util_pct"):
            x = self.series_col(r, "util_pct")
            thr = cfg.ckpt_spin_util_pct
        elif s.has("sm_active"):
            x = self.series_col(r, "sm_active")
            thr = cfg.ckpt_spin_sm_active
        else:
            return np.full(len(s), np.nan)
        return np.where(np.isfinite(x), (x >= thr).astype(np.float64), np.nan)

    @cached_property
    def all_valid(self) -> bool:
        return not bool(np.isnan(self.activity).any())

    @cached_property
    def valid(self) -> np.ndarray:
        return ~np.isnan(self.activity)

    @cached_property
    def w(self) -> np.ndarray:
        """Sample weights in seconds; zero where activity is unknown."""
        return self.w_all if self.all_valid else self.w_all * self.valid

    @cached_property
    def seg_start(self) -> np.ndarray:
        """Sample starts a stretch of contiguous, readable data."""
        if self.all_valid:
            return self.gap
        inv = ~self.valid
        s = self.gap | inv
        s[1:] |= inv[:-1]
        return s

    @cached_property
    def busy(self) -> np.ndarray:
        return self.activity >= self.config.busy_activity

    @cached_property
    def w_busy(self) -> np.ndarray:
        """Sample weights of busy samples, zero for the others."""
        return self.w * self.busy

    @cached_property
    def state(self) -> np.ndarray:
        """Busy (True) / idle per sample, with hysteresis (:func:`hysteresis`)."""
        return hysteresis(self.activity, self.seg_start, self.config.idle_activity, self.config.busy_activity)

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
            dur = segment_sums(w, starts)
            wa = w * (self.activity if self.all_valid else np.nan_to_num(self.activity))
            asum = segment_sums(wa, starts)
        else:
            dur = asum = np.zeros(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            act = np.where(dur > 0, asum / np.where(dur > 0, dur, 1.0), np.nan)
        open_start = self.seg_start[starts]
        open_end = np.ones(starts.size, dtype=bool)
        if starts.size:
            open_end[:-1] = self.seg_start[starts[1:]]
        prow = self.row_of(starts)
        offsets = np.searchsorted(prow, np.arange(self.rows + 1))
        return Phases(
            row=prow, state=st[starts].astype(np.int8), t0=self.time(starts),
            t1=self.time(ends) + self.w_all[ends], dur=dur, act=act, open_start=open_start, open_end=open_end,
            offsets=offsets,
        )

    # --- derived hardware signals -------------------------------------------------

    def clock_ratio(self, idx: np.ndarray) -> np.ndarray:
        """SM clock over its maximum at flat indexes ``idx`` (NaN if unknown);
        the GPU's highest clock in the window stands in for a missing maximum."""
        clk = self.at("sm_clock_mhz", idx)
        mx = self.at("sm_clock_max_mhz", idx)
        miss = ~(mx > 0) & np.isfinite(clk)
        if miss.any():
            rows = self.row_of(idx[miss])
            seen = {int(r): float(np.nanmax(self.series_col(int(r), "sm_clock_mhz"))) for r in np.unique(rows)}
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
            dtype=np.int64, count=self.rows,
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
            row=rows[owner], state=st[k0].astype(np.int8), t0=self.time(idx[k0]),
            t1=self.time(idx[k1]) + self.w_all[idx[k1]], dur=dur[keep], act=mean[keep],
            open_start=seg[k0], open_end=open_end[keep],
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
            row=ph.row[a:b][k], state=ph.state[a:b][k], t0=c0[k], t1=c1[k], dur=dur[k], act=ph.act[a:b][k],
            open_start=(ph.open_start[a:b] | (t0 < lo))[k], open_end=(ph.open_end[a:b] | (t1 > hi))[k],
            offsets=np.array([0, k.size]),
        )
