"""The rollup time grid in Python, and how a window is cut into rollup pieces.

Rollup buckets are ``date_bin`` minutes and hours against 2000-01-01 UTC
(``gpufleet.db.energy_sql.ORIGIN``); the helpers here reproduce that grid in
integer microseconds so that a piece boundary computed in Python falls exactly
on a bucket boundary in SQL.

A window [lo, hi) is answered from rollups where whole buckets fit and from
raw samples elsewhere.  A bucket may be used only if no tariff edge (a carbon
or price step) falls strictly inside the part of it that counts, because all
of a bucket's energy goes to one tariff segment.  Everything at or after
``stale_from`` (rollups that a pending queue row may still change) is raw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Literal

ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
MINUTE_US = 60_000_000
HOUR_US = 3_600_000_000

PieceKind = Literal["1h", "1m", "raw"]


def _us(t: datetime) -> int:
    return (t - ORIGIN) // timedelta(microseconds=1)


def _from_us(us: int) -> datetime:
    return ORIGIN + timedelta(microseconds=us)


def floor_to(t: datetime, step_us: int) -> datetime:
    """The grid point at or before ``t`` (like ``date_bin``)."""
    return _from_us(_us(t) - _us(t) % step_us)


def ceil_to(t: datetime, step_us: int) -> datetime:
    """The grid point at or after ``t``."""
    us = _us(t)
    return _from_us(us + (-us) % step_us)


@dataclass(frozen=True)
class Piece:
    """A time range answered one way: whole hour buckets, whole minute buckets, or raw samples.

    ``sign`` -1 subtracts the range (an hour less the minutes outside a long
    partial hour reads two or three rows instead of up to 59).  Buckets are
    attributed to the tariff segment containing ``seg_at``, or, when it is
    None, to the segment containing each bucket's start.
    """

    kind: PieceKind
    lo: datetime
    hi: datetime
    sign: int = 1
    seg_at: datetime | None = None


def _minute_run(x: datetime, y: datetime) -> list[Piece]:
    """Whole minutes [x, y) within one hour: directly, or as the hour less its other minutes."""
    if x >= y:
        return []
    h = floor_to(x, HOUR_US)
    end = h + timedelta(hours=1)
    direct = (y - x) // timedelta(minutes=1)
    complement = 1 + (x - h) // timedelta(minutes=1) + (end - y) // timedelta(minutes=1)
    if complement >= direct:
        return [Piece("1m", x, y)]
    parts = [Piece("1h", h, end, 1, x), Piece("1m", h, x, -1, x), Piece("1m", y, end, -1, x)]
    return [p for p in parts if p.lo < p.hi]


def _grid_pieces(a: datetime, b: datetime) -> list[Piece]:
    """Cut [a, b), which no tariff edge cuts, into raw head, minutes, hours, minutes, raw tail."""
    m0, m1 = ceil_to(a, MINUTE_US), floor_to(b, MINUTE_US)
    if m0 >= m1:
        return [Piece("raw", a, b)]
    out = [Piece("raw", a, m0)]
    h0, h1 = ceil_to(m0, HOUR_US), floor_to(m1, HOUR_US)
    if h0 <= h1:
        out += [*_minute_run(m0, h0), Piece("1h", h0, h1), *_minute_run(h1, m1)]
    else:
        out += _minute_run(m0, m1)
    out.append(Piece("raw", m1, b))
    return [p for p in out if p.lo < p.hi]


def _merged(pieces: Iterable[Piece]) -> list[Piece]:
    """Join touching plain pieces of one kind (fewer ranges for SQL)."""
    out: list[Piece] = []
    for p in pieces:
        last = out[-1] if out else None
        if (last is not None and last.kind == p.kind and last.hi == p.lo and last.sign == p.sign == 1
                and last.seg_at is None and p.seg_at is None):
            out[-1] = Piece(p.kind, last.lo, p.hi)
        else:
            out.append(p)
    return out


def plan_pieces(lo: datetime, hi: datetime, tariff_edges: Sequence[datetime],
                stale_from: datetime | None = None) -> list[Piece]:
    """Cover [lo, hi) with rollup and raw pieces whose signed sum is exactly [lo, hi).

    ``tariff_edges`` may hold any times; only those strictly inside (lo, hi)
    matter.  Rollups are used for buckets before ``stale_from`` only, except
    that a subtracted bucket may lie after it: an hour and its minutes are
    rewritten together, so the difference is current.
    """
    if hi <= lo:
        return []
    cut = hi if stale_from is None else max(lo, min(hi, stale_from))
    # An edge on the hour grid lies inside no bucket, so only the others cut the window.
    inner = sorted({e for e in tariff_edges if lo < e < cut and _us(e) % HOUR_US})
    bounds = [lo, *inner, cut]
    pieces: list[Piece] = []
    for a, b in pairwise(bounds):
        if a < b:
            pieces += _grid_pieces(a, b)
    if cut < hi:
        pieces.append(Piece("raw", cut, hi))
    return _merged(pieces)
