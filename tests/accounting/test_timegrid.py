"""Rollup pieces: their signed sum is exactly the window, bucket by bucket in the right tariff segment."""

from __future__ import annotations

import bisect
import itertools
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.accounting.timegrid import HOUR_US, MINUTE_US, Piece, ceil_to, floor_to, plan_pieces
from tests.accounting.builders import T0, at


def test_grid_matches_date_bin_origin() -> None:
    t = at(3725.5)
    assert floor_to(t, MINUTE_US) == at(3720) and ceil_to(t, MINUTE_US) == at(3780)
    assert floor_to(t, HOUR_US) == at(3600) and ceil_to(at(3600), HOUR_US) == at(3600)


def test_plan_of_an_unaligned_day_with_a_mid_minute_step() -> None:
    pieces = plan_pieces(at(15), at(86_400 + 30), [at(7205), at(10_800)])
    assert pieces == [
        Piece("raw", at(15), at(60)),
        # 59 minutes of the first hour: that hour less its first minute
        Piece("1h", at(0), at(3600), 1, at(60)), Piece("1m", at(0), at(60), -1, at(60)),
        Piece("1h", at(3600), at(7200)),
        Piece("raw", at(7200), at(7260)),  # the step at 7205 s cuts this minute
        Piece("1h", at(7200), at(10_800), 1, at(7260)), Piece("1m", at(7200), at(7260), -1, at(7260)),
        Piece("1h", at(10_800), at(86_400)),  # the step at 10 800 s is on the hour grid: no cut
        Piece("raw", at(86_400), at(86_430)),
    ]


def test_short_partial_hours_read_minutes() -> None:
    assert plan_pieces(at(600), at(1200), []) == [Piece("1m", at(600), at(1200))]
    assert plan_pieces(at(0), at(7200), [], stale_from=at(3660)) == [
        Piece("1h", at(0), at(3600)), Piece("1m", at(3600), at(3660)), Piece("raw", at(3660), at(7200))]
    assert plan_pieces(at(0), at(600), [], stale_from=at(-60)) == [Piece("raw", at(0), at(600))]


def _density(us: int) -> int:
    """Energy per microsecond, different in every minute (so misplaced buckets show)."""
    return 1 + (us // MINUTE_US) % 7


def _energy(a: int, b: int) -> int:
    """Integral of the density over [a, b), microseconds since T0 (minute-grid aligned)."""
    total, t = 0, a
    while t < b:
        nxt = min(b, (t // MINUTE_US + 1) * MINUTE_US)
        total += (nxt - t) * _density(t)
        t = nxt
    return total


@settings(max_examples=300, deadline=None)
@given(lo=st.integers(0, 10**11), length=st.integers(0, 3 * 10**11),
       edges=st.lists(st.one_of(st.integers(-10**10, 4 * 10**11),
                                st.integers(-3, 100).map(lambda m: m * MINUTE_US),
                                st.integers(-1, 90).map(lambda h: h * HOUR_US)), max_size=6),
       stale=st.one_of(st.none(), st.integers(-10**10, 4 * 10**11)))
def test_signed_pieces_attribute_every_microsecond_once(lo: int, length: int, edges: list[int],
                                                        stale: int | None) -> None:
    """Summing the pieces as the engine does (buckets whole, to ``seg_at`` or their start's segment;
    raw pieces split at the edges) gives each tariff segment exactly its share of the window."""
    def t(us: int) -> datetime:
        return T0 + timedelta(microseconds=us)

    def us(d: datetime) -> int:
        return (d - T0) // timedelta(microseconds=1)

    hi = lo + length
    cuts = sorted({lo, hi, *(e for e in edges if lo < e < hi)})
    pieces = plan_pieces(t(lo), t(hi), [t(e) for e in cuts], None if stale is None else t(stale))
    if length == 0:
        assert pieces == []
        return
    expected: dict[int, int] = {}
    for a, b in itertools.pairwise(cuts):
        expected[bisect.bisect_right(cuts, a)] = _energy(a, b)
    got: dict[int, int] = {}
    for p in pieces:
        a, b = us(p.lo), us(p.hi)
        if p.kind == "raw":
            bounds = sorted({a, b, *(c for c in cuts if a < c < b)})
            for x, y in itertools.pairwise(bounds):
                k = bisect.bisect_right(cuts, x)
                got[k] = got.get(k, 0) + _energy(x, y)
            continue
        step = HOUR_US if p.kind == "1h" else MINUTE_US
        assert a % step == 0 and b % step == 0 and a < b
        if p.sign == 1 and p.seg_at is None:
            assert stale is None or b <= stale
        for bucket in range(a, b, step):
            k = bisect.bisect_right(cuts, bucket if p.seg_at is None else us(p.seg_at))
            got[k] = got.get(k, 0) + p.sign * _energy(bucket, bucket + step)
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}
