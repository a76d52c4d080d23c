"""One answer to "is this run active": the Python rules and their SQL twins agree at every boundary."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from gpufleet.store.run_model import Run, overlaps, overlaps_sql, state_at, state_sql

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_run_holds_its_gpus_from_its_start_to_just_before_its_end() -> None:
    r = Run("r", at(10), at(20))
    assert [r.state_at(at(t)) for t in (9, 10, 19.999, 20, 30)] == [
        "pending",
        "running",
        "running",
        "ended",
        "ended",
    ]
    assert not r.overlaps(at(0), at(10)) and r.overlaps(at(0), at(10.001))
    assert r.overlaps(at(19.999), at(30)) and not r.overlaps(at(20), at(30))
    assert Run("open", at(10)).state_at(at(1e6)) == "running" and Run("open", at(10)).overlaps(at(1e6), None)
    assert r.window(at(15)) == (at(10), at(15)) and r.window(at(50), since=at(25)) == (at(25), at(25))


def test_epoch_seconds_follow_the_same_rules() -> None:
    assert overlaps(10.0, 20.0, 19.0, 25.0) and not overlaps(10.0, 20.0, 20.0, 25.0)
    assert state_at(10.0, None, 10.0) == "running" and state_at(10.0, 20.0, 20.0) == "ended"


@pytest.mark.parametrize("end", [None, 20.0])
def test_sql_twins_say_what_python_says(conn: psycopg.Connection, end: float | None) -> None:
    points = [None, 0.0, 9.0, 10.0, 15.0, 20.0, 25.0]
    for lo, hi in itertools.product(points, points):
        sql = (
            f"SELECT {overlaps_sql('r', None if lo is None else '%(lo)s', None if hi is None else '%(hi)s')} "
            'FROM (SELECT %(s)s::timestamptz AS start, %(e)s::timestamptz AS "end") r'
        )
        got = conn.execute(
            sql,
            {
                "lo": None if lo is None else at(lo),
                "hi": None if hi is None else at(hi),
                "s": at(10),
                "e": None if end is None else at(end),
            },
        ).fetchone()
        want = overlaps(
            at(10),
            None if end is None else at(end),
            None if lo is None else at(lo),
            None if hi is None else at(hi),
        )
        assert got is not None and got[0] is want, (lo, hi, end)
    for t in (0.0, 10.0, 15.0, 20.0, 25.0):
        row = conn.execute(
            f"SELECT {state_sql('r', '%(t)s')} FROM (SELECT %(s)s::timestamptz AS start, "
            '%(e)s::timestamptz AS "end") r',
            {"t": at(t), "s": at(10), "e": None if end is None else at(end)},
        ).fetchone()
        assert row is not None and row[0] == state_at(at(10), None if end is None else at(end), at(t)), (
            t,
            end,
        )
