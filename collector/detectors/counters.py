"""Cumulative counters and flags in a window: how much they rose, when, how fast.

Error counters (ECC, PCIe replays, NVLink CRC) only ever count up until the
driver reloads, and agents read them sparsely (the NVML source every tenth
collect): a counter is judged on its readings alone, NULL samples between
them are skipped, never taken as zero.  A reading lower than the one before
is a restart (driver reload): that step is not counted as errors.

Values come through the frame's float32 columns, which hold whole numbers
exactly up to 2**24 (16.7 million): beyond that, a rise smaller than the
float's spacing shows one sweep later, which no threshold here depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import first_per_group, last_per_group


@dataclass(eq=False)
class Rise:
    """Per frame row (NaN where the row has no reading)."""

    #: Sum of the increases between consecutive readings.
    total: np.ndarray
    #: Time (epoch s) of the first and the last reading that showed an increase.
    first: np.ndarray
    last: np.ndarray
    #: Seconds between the row's first and last reading.
    span_s: np.ndarray
    #: Readings in the window, and the latest value.
    readings: np.ndarray
    latest: np.ndarray

    def per_minute(self) -> np.ndarray:
        """Increase per minute over the readings' span (NaN under two readings)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.span_s > 0, 60.0 * self.total / self.span_s, np.nan)


def rises(fr: Frame, name: str) -> Rise:
    """How counter ``name`` rose on every row of the frame."""
    n = fr.rows
    nan = np.full(n, np.nan)
    if n == 0 or not fr.has(name):
        return Rise(np.zeros(n), nan, nan.copy(), nan.copy(), np.zeros(n), nan.copy())
    x = fr.transient(name)
    idx = np.flatnonzero(np.isfinite(x))
    v = x[idx].astype(np.float64)
    rows = fr.row_of(idx)
    t = fr.time(idx)
    readings = np.bincount(rows, minlength=n).astype(np.float64)
    total = np.zeros(n)
    first, last = nan.copy(), nan.copy()
    if idx.size > 1:
        same = rows[1:] == rows[:-1]
        d = np.where(same, v[1:] - v[:-1], 0.0)
        up = d > 0
        total = np.bincount(rows[1:][up], weights=d[up], minlength=n).astype(np.float64)
        first = first_per_group(rows[1:][up], t[1:][up], n)
        last = last_per_group(rows[1:][up], t[1:][up], n)
    span = last_per_group(rows, t, n) - first_per_group(rows, t, n)
    return Rise(total, first, last, span, readings, last_per_group(rows, v, n))


def trailing_on(t: np.ndarray, flag: np.ndarray) -> float:
    """Start of the trailing stretch of readings where ``flag`` holds (NaN readings
    skipped): when a flag that is set now was first seen set without a break."""
    ok = np.isfinite(flag)
    tt, f = t[ok], flag[ok] > 0.5
    if not f.size or not f[-1]:
        return float("nan")
    off = np.flatnonzero(~f)
    return float(tt[off[-1] + 1]) if off.size else float(tt[0])


def forward_fill(values: np.ndarray, t: np.ndarray, max_age_s: float) -> np.ndarray:
    """Each NaN replaced by the last reading before it, if at most ``max_age_s`` old."""
    ok = np.isfinite(values)
    if ok.all() or not ok.any():
        return values.copy()
    last = np.maximum.accumulate(np.where(ok, np.arange(values.size), -1))
    out = np.where(last >= 0, values[np.maximum(last, 0)], np.nan)
    age = t - t[np.maximum(last, 0)]
    return np.where((last >= 0) & (age <= max_age_s), out, np.nan)
