"""Lines by day read a day at a time are the lines of one call with a step of a day.

The finance page's day chart and the daily FOCUS export read :func:`gpufleet.accounting.lines.by_day`
(one line-detail call per UTC day, each whole day's fleet lines summed from kept hours) instead of
``detail='step'`` (every GPU's time priced live).  Both must give the same lines: a fleet across two
midnights with a currency change, time-of-use prices, a carbon series, runs that cross midnight and
one still running, periods on and off midnight, with the closed hours kept and without.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import psycopg
import pytest

from gpufleet.accounting import fleet_hours
from gpufleet.accounting.lines import Line, by_day, lines
from tests.accounting.builders import (
    at,
    carbon,
    drain,
    gpu_samples,
    host_samples,
    node,
    prices,
    run,
    site,
    wavy_power,
)

H = 3600.0
#: T0 is 10:00 UTC: the samples run from 20:00 of T0's day to 04:00 two days later (two midnights).
START, END = 10 * H, 42 * H
NOW = END + 600.0
MIDNIGHT = 14 * H
PERIODS = (
    (START, END),
    (MIDNIGHT, MIDNIGHT + 24 * H),
    (START + 1234.5, NOW),
    (MIDNIGHT - 100, MIDNIGHT + 100),
    (MIDNIGHT + 3 * H, MIDNIGHT + 5 * H),
    (0, NOW + 48 * H),
    (NOW + 600, NOW + 48 * H),
)


def _fleet(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.2, gpu_hour=2.5, currency="EUR", region="DE")
    site(conn, "us", pue=1.1, price=0.1, gpu_hour=2.0, currency="USD", carbon=400.0)
    conn.execute(
        "INSERT INTO site_settings (site, setting, valid_from, txt) VALUES ('us', 'currency', %s, 'EUR')",
        (at(MIDNIGHT + 2 * H),),
    )
    carbon(conn, "DE", [(s, 200.0 + (s % 7000) / 70) for s in range(int(START) - 3600, int(NOW), 5400)])
    prices(conn, "eu", [(MIDNIGHT - 2 * H, 0.25), (MIDNIGHT + 5 * H + 0.5, 0.18)])
    for n, count, s in (("a1", 2, "eu"), ("a2", 2, "us")):
        node(conn, n, count, s)
        gpu_samples(conn, wavy_power(n, count, START, END, 60.0, period_s=2500.0))
        host_samples(
            conn, [(START + k * 120.0, n, 250.0 + k % 5) for k in range(int((END - START) / 120) + 1)]
        )
    run(conn, "r1", MIDNIGHT - 5 * H + 0.5, MIDNIGHT + 7 * H, {"a1": [0, 1]}, site_name="eu", team="lm")
    run(conn, "r2", START + 600, MIDNIGHT + 26 * H, {"a2": [0]}, site_name="us", team="cv")
    run(conn, "r3", MIDNIGHT + 20 * H, None, {"a2": [1]}, site_name="us")
    drain(conn)


def _key(ln: Line) -> tuple:
    return (ln.line, ln.run_id or "", ln.site or "", ln.start, ln.currency or "")


def _assert_same(got: list[Line], want: list[Line], where: object) -> None:
    assert sorted(map(_key, got)) == sorted(map(_key, want)), where
    for a, b in zip(sorted(got, key=_key), sorted(want, key=_key), strict=True):
        for f, x, y in zip(
            dataclasses.fields(Line), dataclasses.astuple(a), dataclasses.astuple(b), strict=True
        ):
            if isinstance(x, float) and isinstance(y, float):  # seconds summed in another order
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9), (where, f.name, a, b)
            else:
                assert x == y, (where, f.name, a, b)


@pytest.mark.parametrize("kept", [False, True])
def test_lines_by_day_are_the_step_of_a_day(conn: psycopg.Connection, kept: bool) -> None:
    _fleet(conn)
    if kept:
        keeping = fleet_hours.Keeping(max_gap_s=60.0, gone_after_s=86400.0, days=3.0)
        assert fleet_hours.keep(conn, keeping, at(NOW), budget_s=60.0) >= 30
    day = timedelta(days=1)
    for lo, hi in PERIODS:
        with conn.transaction():
            want = lines(conn, at(lo), at(hi), at(NOW), fleet=True, detail="step", step=day)
            got = by_day(conn, at(lo), at(hi), at(NOW), fleet=True)
        _assert_same(got, want, (lo, hi))
    # the fixture reaches what the days must agree on: runs on both sides of a midnight, in two currencies
    whole = by_day(conn, at(START), at(NOW), at(NOW), fleet=True)
    r1 = [ln for ln in whole if ln.run_id == "r1"]
    assert len({ln.start.date() for ln in r1 if ln.start}) == 2
    assert {ln.currency for ln in whole if ln.run_id == "r2"} == {"USD", "EUR"}
