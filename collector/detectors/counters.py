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
    """How counter ``name`` rose on every row of the frame.

    The readings are gathered once (NULL samples dropped: agents read these
    counters every few samples), compared with the previous reading of the same
    row and summed per row with ``reduceat``; only rows that rose are looked at
    one by one, for the times of their first and last rise."""
    n = fr.rows
    total = np.zeros(n)
    first, last, span, latest = (np.full(n, np.nan) for _ in range(4))
    readings = np.zeros(n)
    if n == 0 or not fr.has(name):
        return Rise(total, first, last, span, readings, latest)
    x = fr.transient(name)
    fin = np.isfinite(x)
    counts = np.add.reduceat(fin, fr.starts, dtype=np.int64)
    if not counts.any():
        return Rise(total, first, last, span, readings, latest)
    idx = np.flatnonzero(fin)
    v = x[idx]
    has = np.flatnonzero(counts > 0)
    c = counts[has]
    cstart = np.cumsum(c) - c  # each row's first reading in ``v``
    d = np.zeros(v.size, dtype=np.float32)
    d[1:] = v[1:] - v[:-1]
    d[cstart] = 0.0  # no step across rows
    up = d > 0
    total[has] = np.add.reduceat(np.where(up, d, np.float32(0.0)), cstart, dtype=np.float64)
    readings[has] = c
    lo, hi = idx[cstart], idx[cstart + c - 1]
    span[has] = fr.time(hi) - fr.time(lo)
    latest[has] = v[cstart + c - 1]
    for k in np.flatnonzero(total[has] > 0).tolist():
        seg = slice(int(cstart[k]), int(cstart[k] + c[k]))
        u = np.flatnonzero(up[seg])
        r = int(has[k])
        first[r] = float(fr.time(int(idx[seg.start + int(u[0])])))
        last[r] = float(fr.time(int(idx[seg.start + int(u[-1])])))
    return Rise(total, first, last, span, readings, latest)


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
