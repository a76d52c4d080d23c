"""Rollup pieces: they tile the window, buckets are whole and never straddle a tariff edge."""

from __future__ import annotations

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
    pieces = plan_pieces(at(15), at(86_400 + 30), [at(7205)])
    assert pieces == [
        Piece("raw", at(15), at(60)), Piece("1m", at(60), at(3600)), Piece("1h", at(3600), at(7200)),
        Piece("raw", at(7200), at(7260)), Piece("1m", at(7260), at(10_800)), Piece("1h", at(10_800), at(86_400)),
        Piece("raw", at(86_400), at(86_430)),
    ]


def test_stale_rollups_are_not_used() -> None:
    pieces = plan_pieces(at(0), at(7200), [], stale_from=at(3660))
    assert pieces == [Piece("1h", at(0), at(3600)), Piece("1m", at(3600), at(3660)), Piece("raw", at(3660), at(7200))]
    assert plan_pieces(at(0), at(600), [], stale_from=at(-60)) == [Piece("raw", at(0), at(600))]


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(0, 10**11), length=st.integers(0, 4 * 10**11),
       edges=st.lists(st.integers(-10**10, 5 * 10**11), max_size=6),
       stale=st.one_of(st.none(), st.integers(-10**10, 5 * 10**11)))
def test_pieces_tile_the_window(lo: int, length: int, edges: list[int], stale: int | None) -> None:
    def t(us: int) -> datetime:
        return T0 + timedelta(microseconds=us)

    a, b = t(lo), t(lo + length)
    tariff = [t(e) for e in edges]
    pieces = plan_pieces(a, b, tariff, None if stale is None else t(stale))
    if length == 0:
        assert pieces == []
        return
    assert pieces[0].lo == a and pieces[-1].hi == b
    for p, q in itertools.pairwise(pieces):
        assert p.hi == q.lo and p.lo < p.hi
    for p in pieces:
        if p.kind == "raw":
            continue
        step = HOUR_US if p.kind == "1h" else MINUTE_US
        assert floor_to(p.lo, step) == p.lo and floor_to(p.hi, step) == p.hi
        assert stale is None or p.hi <= t(stale)
        for e in tariff:
            if p.lo < e < p.hi:
                assert floor_to(e, step) == e  # an edge inside a piece sits on a bucket boundary
