"""Vectorised helpers over ragged groups, and evidence formatting.

Groups are small integer labels (a GPU's row, a run's index); every helper
works on all groups at once so a sweep never loops over samples in Python.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Scale of the median absolute deviation that matches a normal std.
MAD_SCALE = 1.4826


def _sorted_groups(
    values: np.ndarray, groups: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ok = np.isfinite(values)
    v = values[ok]
    g = groups[ok]
    order = np.lexsort((v, g))
    counts = np.bincount(g, minlength=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    return v[order], counts, starts


def group_median(values: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """Median of the finite values of each group ``0..n-1``; NaN for an empty group."""
    v, counts, starts = _sorted_groups(values, groups, n)
    out = np.full(n, np.nan)
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (v[lo] + v[hi])
    return out


def group_loo_median(values: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """For each element, the median of the *other* finite members of its group.

    NaN where the element is not finite or has no peer.  Leaving the element
    out makes a two-member group compare each member with the other one.
    """
    m = values.shape[0]
    out = np.full(m, np.nan)
    ok = np.isfinite(values)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return out
    v = values[idx]
    g = groups[idx]
    order = np.lexsort((v, g))
    sv = v[order]
    sg = g[order]
    counts = np.bincount(sg, minlength=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    rank = np.arange(idx.size) - starts[sg]
    c = counts[sg]
    peers = c - 1
    good = peers >= 1
    lo = (peers - 1) // 2
    hi = peers // 2

    def pick(p: np.ndarray) -> np.ndarray:
        # Position p among the peers is p in the group when p < own rank, else p + 1.
        pos = starts[sg] + np.where(p < rank, p, p + 1)
        return sv[np.minimum(pos, sv.size - 1)]

    med = 0.5 * (pick(lo) + pick(hi))
    res = np.full(idx.size, np.nan)
    res[good] = med[good]
    out[idx[order]] = res
    return out


def group_mad(values: np.ndarray, groups: np.ndarray, n: int, median: np.ndarray) -> np.ndarray:
    """Median absolute deviation of each group around ``median`` (per group)."""
    dev = np.abs(values - median[groups])
    return group_median(dev, groups, n)


def robust_z(
    values: np.ndarray, groups: np.ndarray, n: int, *, rel_floor: float, abs_floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """Robust z-score of each element against its group's other members.

    Returns ``(z, ref)``: ``ref`` is the median of the element's peers and the
    scale is ``1.4826 * MAD`` of the group, floored at ``rel_floor * |ref|``
    and ``abs_floor`` so that identical peers (MAD 0) do not make every small
    difference infinite.  Groups of two have no spread to measure: only the
    floors apply.
    """
    ref = group_loo_median(values, groups, n)
    med = group_median(values, groups, n)
    mad = group_mad(values, groups, n, med)
    counts = np.bincount(groups[np.isfinite(values)], minlength=n)
    spread = np.where(counts[groups] >= 3, MAD_SCALE * mad[groups], 0.0)
    spread = np.nan_to_num(spread, nan=0.0)
    scale = np.maximum(np.maximum(spread, rel_floor * np.abs(np.nan_to_num(ref))), abs_floor)
    return (values - ref) / scale, ref


def first_per_group(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """First value of each group in order of appearance (``groups`` ascending)."""
    out = np.full(n, np.nan)
    if groups.size:
        head = np.ones(groups.size, dtype=bool)
        head[1:] = groups[1:] != groups[:-1]
        out[groups[head]] = values[head]
    return out


def last_per_group(groups: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Last value of each group in order of appearance (``groups`` ascending)."""
    out = np.full(n, np.nan)
    if groups.size:
        tail = np.ones(groups.size, dtype=bool)
        tail[:-1] = groups[1:] != groups[:-1]
        out[groups[tail]] = values[tail]
    return out


def num(x: Any, digits: int = 3) -> float | None:
    """A JSON-safe rounded float, None for NaN, infinities and missing values."""
    if x is None:
        return None
    f = float(x)
    if not math.isfinite(f):
        return None
    if f == 0:
        return 0.0
    return round(f, max(digits, digits - math.floor(math.log10(abs(f))) - 1))


def median_of(values: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Median of the finite values (where ``mask`` holds, when given); NaN if none."""
    ok = np.isfinite(values)
    if mask is not None:
        ok &= mask
    if not ok.any():
        return math.nan
    return float(np.median(values[ok]))


def trailing_onset(t: np.ndarray, weight: np.ndarray, ind: np.ndarray, min_share: float) -> float:
    """Earliest time with ``ind`` from which ``ind`` holds for at least
    ``min_share`` of the remaining ``weight``; NaN when never.

    One series' version of :meth:`gpufleet.collector.detectors.frame.Frame.trailing_episode`.
    """
    wi = np.where(ind, weight, 0.0)
    tail_w = np.cumsum(weight[::-1])[::-1]
    tail_i = np.cumsum(wi[::-1])[::-1]
    ok = np.flatnonzero(ind & (weight > 0) & (tail_i >= min_share * tail_w - 1e-9))
    return float(t[ok[0]]) if ok.size else math.nan
