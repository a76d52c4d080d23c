"""Which GPUs compute, idle or pause: the activity judgement of a frame's samples.

Activity (0-1), per sample:

* ``max(sm_active, dram_active)`` where DCGM profiling fields are reported;
* otherwise ``min(util_pct / 100, power activity)``, power activity being
  ``power_w`` over the enforced limit (or, where none is reported, the
  model's board power or the run's own power history:
  :attr:`Activity.power_reference`) mapped linearly from ``power_idle_frac``
  (0) to ``power_busy_frac`` (1): GPU-Util says a kernel was resident, not
  that the GPU did work, and spinning collective kernels keep it at 100 %;
* ``util_pct / 100`` alone, or power activity alone, when only one exists.

Samples with no activity reading weigh nothing (:attr:`Activity.w`) and break
phases, as gaps do.  Busy and idle follow with hysteresis; a GPU is paused
when its activity, or its power against its own busy level, says it does no
useful work.  Every result is cached on the frame: the detectors of a sweep
share one judgement.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpufleet.collector.detectors.flat import F32, FlatArrays, hysteresis, segment_sums
from gpufleet.collector.detectors.window import Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.gpu_models import board_power_w, gpu_model_names


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


class Activity(FlatArrays):
    """The activity judgement over flat arrays (see the module doc); the frame supplies the window,
    the settings and which run each row worked for."""

    window: Window
    config: DetectorConfig

    @property
    @abstractmethod
    def run_of_row(self) -> np.ndarray:
        """Index into ``window.runs`` of the run each row worked for (-1: none): GPUs of one run share
        a power reference."""

    def power_frac(
        self,
        idx: np.ndarray,
        history: bool = True,
        power: np.ndarray | None = None,
        limit: np.ndarray | None = None,
    ) -> np.ndarray:
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
        models = {
            node: gpu_model_names(self.window.node_facts.get(node))
            for node in {self.keys[r][0] for r in need}
        }
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
            groups.setdefault(("run", int(ror[r])) if ror[r] >= 0 else ("node", self.keys[r][0]), []).append(
                r
            )
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
            row=prow,
            state=st[starts].astype(np.int8),
            t0=self.time(starts),
            t1=self.time(ends) + self.w_all[ends],
            dur=dur,
            act=act,
            open_start=open_start,
            open_end=open_end,
            offsets=offsets,
        )

    @cached_property
    def busy_power(self) -> np.ndarray | None:
        """Per row, the GPU's own busy power level in the window: the mean of the upper half of its power
        while busy (NaN where it was never busy; None where no GPU reports power)."""
        level: np.ndarray | None = None
        if self.has("power_w"):
            power = self.col("power_w")
            seen = np.isfinite(power)
            p0 = np.where(seen, power, 0.0)
            wb = self.w_busy * seen
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = self.row_sum(p0 * wb) / self.row_sum(wb)
                upper = wb * (p0 >= self.per_sample(mean).astype(p0.dtype))
                level = self.row_sum(p0 * upper) / self.row_sum(upper)
        return level

    def power_below(self, share: float) -> np.ndarray | None:
        """Per sample: board power at most ``share`` of the GPU's own busy level (None: no power anywhere)."""
        level = self.busy_power
        if level is None:
            return None
        power = self.col("power_w")
        return power <= (share * self.per_sample(level)).astype(power.dtype)

    @cached_property
    def pause_mask(self) -> np.ndarray:
        """Per sample: paused by activity, or by board power fallen to ``ckpt_pause_power_share`` of the
        GPU's own busy level (:attr:`busy_power`)."""
        low = self.power_below(self.config.ckpt_pause_power_share)
        return self.paused if low is None else self.paused | low
