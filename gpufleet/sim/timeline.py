"""Sets of time intervals and the share of a tick each covers.

A run's pauses (warm-up, checkpoint stalls, evaluation, waits for input) are
kept as sorted, disjoint intervals.  The share of any tick ``(a, b]`` spent
in one is then exact for every sampling interval, from 100 ms to 30 s, which
keeps a sawtooth's duty cycle and a stall's length independent of how often
the fleet is sampled.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

import numpy as np


class IntervalSet:
    """Disjoint, sorted closed-open intervals ``[start, end)`` in epoch seconds."""

    __slots__ = ("_cum", "_cum_l", "_ends_l", "_starts_l", "ends", "starts")

    def __init__(self, pairs: Iterable[tuple[float, float]] = ()) -> None:
        merged: list[list[float]] = []
        for s, e in sorted((float(s), float(e)) for s, e in pairs if e > s):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        self.starts = np.array([m[0] for m in merged], dtype=np.float64)
        self.ends = np.array([m[1] for m in merged], dtype=np.float64)
        #: Covered length before each interval, for O(log n) coverage queries.
        self._cum = np.concatenate(([0.0], np.cumsum(self.ends - self.starts)))
        # Plain lists for the scalar queries a tick makes (much cheaper than numpy on one value).
        self._starts_l = self.starts.tolist()
        self._ends_l = self.ends.tolist()
        self._cum_l = self._cum.tolist()

    @classmethod
    def periodic(cls, start: float, end: float, period_s: float, on_s: float, first: float) -> IntervalSet:
        """``[first + k*period, first + k*period + on)`` for every k, clipped to ``[start, end)``."""
        if period_s <= 0 or on_s <= 0 or first >= end:
            return cls()
        k0 = max(0, int(np.floor((start - first - on_s) / period_s)))
        begins = first + period_s * np.arange(k0, int(np.ceil((end - first) / period_s)) + 1)
        return cls((max(b, start), min(b + on_s, end)) for b in begins if b < end and b + on_s > start)

    def pairs(self) -> list[tuple[float, float]]:
        return list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def __bool__(self) -> bool:
        return len(self) > 0

    def total(self) -> float:
        return float(self._cum[-1])

    def covered_until(self, x: np.ndarray | float) -> np.ndarray:
        """Covered length in ``(-inf, x]``, vectorised over ``x``."""
        x = np.asarray(x, dtype=np.float64)
        if not len(self):
            return np.zeros(x.shape)
        j = np.searchsorted(self.starts, x, side="right") - 1
        jc = np.clip(j, 0, None)
        inside = np.clip(x - self.starts[jc], 0.0, self.ends[jc] - self.starts[jc])
        return np.where(j >= 0, self._cum[jc] + inside, 0.0)

    def covered(self, a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
        """Covered length in ``(a, b]``."""
        return self.covered_until(b) - self.covered_until(a)

    def covered_in(self, a: float, b: float) -> float:
        """Covered length in ``(a, b]`` for scalar bounds."""
        if not self._starts_l or b <= self._starts_l[0] or a >= self._ends_l[-1]:
            return 0.0
        return self._until(b) - self._until(a)

    def _until(self, x: float) -> float:
        j = bisect_right(self._starts_l, x) - 1
        if j < 0:
            return 0.0
        return self._cum_l[j] + min(max(x - self._starts_l[j], 0.0), self._ends_l[j] - self._starts_l[j])

    def contains(self, x: float) -> bool:
        j = int(np.searchsorted(self.starts, x, side="right")) - 1
        return j >= 0 and x < self.ends[j]

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet(self.pairs() + other.pairs())

    def clip(self, start: float, end: float) -> IntervalSet:
        return self.intersect(IntervalSet([(start, end)]))

    def intersect(self, other: IntervalSet) -> IntervalSet:
        out: list[tuple[float, float]] = []
        i = j = 0
        a, b = self.pairs(), other.pairs()
        while i < len(a) and j < len(b):
            s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if s < e:
                out.append((s, e))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return IntervalSet(out)

    def minus(self, other: IntervalSet) -> IntervalSet:
        """The parts of this set not covered by ``other``."""
        if not other or not self:
            return IntervalSet(self.pairs())
        out: list[tuple[float, float]] = []
        cuts = other.pairs()
        j = 0
        for s, e in self.pairs():
            cur = s
            while j < len(cuts) and cuts[j][1] <= cur:
                j += 1
            k = j
            while k < len(cuts) and cuts[k][0] < e:
                if cuts[k][0] > cur:
                    out.append((cur, cuts[k][0]))
                cur = max(cur, cuts[k][1])
                k += 1
            if cur < e:
                out.append((cur, e))
        return IntervalSet(out)
