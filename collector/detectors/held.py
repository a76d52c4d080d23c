"""Per-sample signals of GPUs that are held but not working: no kernel at all, or one that spins.

GPU-Util is the fraction of the driver's sample period in which a kernel was
resident, nothing more.  Two readings of it matter to a GPU that does no work:

* **no kernel** (GPU-Util about 0, or without it SM activity about 0): the
  process holds the GPU and runs nothing on it: a notebook left open, a data
  loader that died while the process lives on, a rank that died or blocks;
* **spinning** (GPU-Util about 100 % with near-zero SM activity and board
  power at its idle level): a collective kernel polls for a peer that never
  comes.  Power and SM activity tell it from work, because GPU-Util cannot.

"Idle-level power" is judged against the GPU's own reference (its enforced
limit, its model's board power, or its run's busy history:
:meth:`Frame.power_frac`), never against one model's watts.  Where none exists
(an ``nvidia-smi`` log with no limit, no model and no busy history in view), a
spinner's power is compared with the idle power of its run's ranks that run
nothing, which is the same board's idle level.
"""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors.frame import Frame


def no_kernel(fr: Frame) -> np.ndarray:
    """Per sample: no kernel ran (False where unknown)."""
    cfg = fr.config
    util = fr.col("util_pct")
    out = util <= cfg.idle_util_pct
    miss = np.isnan(util)
    if miss.any():
        sm = fr.col("sm_active")
        out[miss] = sm[miss] <= cfg.idle_sm_active
        still = miss & np.isnan(sm)
        if still.any():
            # Power alone: at the idle end of the GPU's own range.
            out[still] = fr.activity[still] <= cfg.idle_activity
    return out


def kernel_resident(fr: Frame) -> np.ndarray:
    """Per sample: a kernel was resident nearly all the time (False where unknown): GPU-Util at
    least ``hung_util_pct``, or without GPU-Util (a DCGM profile) SM activity at least
    ``ckpt_spin_sm_active``, the share of SMs a polling collective kernel keeps occupied."""
    cfg = fr.config
    util = fr.col("util_pct")
    out = util >= cfg.hung_util_pct
    miss = np.isnan(util)
    if miss.any():
        out[miss] = fr.col("sm_active")[miss] >= cfg.ckpt_spin_sm_active
    return out


def spin_power(fr: Frame, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At flat indexes ``idx``: whether power is at the idle level by the GPU's own reference
    (True/False; False where it cannot tell) and whether it could tell at all."""
    cfg = fr.config
    pf = fr.power_frac(idx)
    known = np.isfinite(pf)
    return known & (pf <= cfg.hung_max_power_frac), known


def no_work(fr: Frame, idx: np.ndarray) -> np.ndarray:
    """At ``idx``: SM activity near zero where DCGM reports it (True where not reported)."""
    sm = fr.at("sm_active", idx)
    return ~(sm > fr.config.hung_max_sm_active)


def run_spans(fr: Frame) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the flat index range ``[a, b)`` of its run's span inside the window (warm-up
    included; empty for a row no run holds)."""
    w = fr.window
    ror = fr.run_of_row
    lo = np.full(fr.rows, np.nan)
    hi = np.full(fr.rows, np.nan)
    has = np.flatnonzero(ror >= 0)
    for r in has.tolist():
        run = w.runs[int(ror[r])]
        lo[r] = max(run.start, w.t_start)
        hi[r] = min(w.t_end if run.end is None else run.end, w.t_end)
    a = fr.index_at(lo, "left")
    b = fr.index_at(hi, "right")
    b[~(ror >= 0)] = a[~(ror >= 0)]
    return a, np.maximum(a, b)
