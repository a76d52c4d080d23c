"""The rollup time grid in Python, and how a window is cut into rollup pieces.

Rollup buckets are ``date_bin`` minutes and hours against 2000-01-01 UTC
(``gpufleet.db.energy_sql.ORIGIN``); the helpers here reproduce that grid in
integer microseconds so that a piece boundary computed in Python falls exactly
on a bucket boundary in SQL.

A window [lo, hi) is answered from rollups where whole buckets fit and from
raw samples elsewhere.  A bucket may be used only if no tariff edge (a carbon
or price step) falls strictly inside it, because a bucket's energy is
attributed to the tariff segment its start lies in.  Everything at or after
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
    """A time range answered one way: whole hour buckets, whole minute buckets, or raw samples."""

    kind: PieceKind
    lo: datetime
    hi: datetime


def _grid_pieces(a: datetime, b: datetime) -> list[Piece]:
    """Cut [a, b), which contains no tariff edge, into raw head, minutes, hours, minutes, raw tail."""
    m0, m1 = ceil_to(a, MINUTE_US), floor_to(b, MINUTE_US)
    if m0 >= m1:
        return [Piece("raw", a, b)]
    out = [Piece("raw", a, m0)]
    h0, h1 = ceil_to(m0, HOUR_US), floor_to(m1, HOUR_US)
    if h0 < h1:
        out += [Piece("1m", m0, h0), Piece("1h", h0, h1), Piece("1m", h1, m1)]
    else:
        out.append(Piece("1m", m0, m1))
    out.append(Piece("raw", m1, b))
    return [p for p in out if p.lo < p.hi]


def _merged(pieces: Iterable[Piece]) -> list[Piece]:
    """Join touching pieces of one kind (fewer ranges for SQL; segments come from bucket times)."""
    out: list[Piece] = []
    for p in pieces:
        if out and out[-1].kind == p.kind and out[-1].hi == p.lo:
            out[-1] = Piece(p.kind, out[-1].lo, p.hi)
        else:
            out.append(p)
    return out


def plan_pieces(lo: datetime, hi: datetime, tariff_edges: Sequence[datetime],
                stale_from: datetime | None = None) -> list[Piece]:
    """Cover [lo, hi) with rollup and raw pieces, in time order, without overlap.

    ``tariff_edges`` may hold any times; only those strictly inside (lo, hi)
    matter.  Rollups are used before ``stale_from`` only.
    """
    if hi <= lo:
        return []
    cut = hi if stale_from is None else max(lo, min(hi, stale_from))
    inner = sorted({e for e in tariff_edges if lo < e < cut})
    bounds = [lo, *inner, cut]
    pieces: list[Piece] = []
    for a, b in pairwise(bounds):
        if a < b:
            pieces += _grid_pieces(a, b)
    if cut < hi:
        pieces.append(Piece("raw", cut, hi))
    return _merged(pieces)
