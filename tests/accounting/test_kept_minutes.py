"""A running run's minutes of closed hours are kept, and read back only while they are what a read gives.

The power-cap advisor reads each running run's minutes from its start to now on every request; the
hours that have closed are kept (:mod:`gpufleet.advisor.kept_minutes`) while the run's mark, the
fleet's whole mark and the hour's mark hold.  Here two running runs on two nodes, with power limits
that change, a GPU that lags the change and minutes no GPU reported a limit in, are read through the
kept hours and live: they must agree, before and after a late sample (through the rollup worker), an
allocation change and a change that moves every hour.
"""

from __future__ import annotations

import math
import time

import numpy as np
import psycopg
import pytest

from gpufleet.accounting.fleet_hours import SETTLE_S
from gpufleet.advisor import kept_minutes
from gpufleet.advisor.kept_minutes import Running
from tests.accounting.builders import T0, at, drain, node, run

H = 3600.0
#: T0 is 10:00 UTC: samples from 10:17:30 to 14:40, so hours 10 to 13 close and 14 is the tail.
SAMPLES = (17.5 * 60, 4 * H + 40 * 60)
NOW = SAMPLES[1] + 30.0
RUNS = (Running("r-a", T0.timestamp() + 17.5 * 60), Running("r-b", T0.timestamp() + H + 300.0))


def _limit(n: str, g: int, s: float) -> float | None:
    if n == "k1" and 2 * H + 1200 <= s < 2 * H + 1620:
        return None  # seven minutes no GPU of k1 reported a limit
    step = 2 * H + 60.0 * (g == 3)  # GPU 3 of k1 takes the new limit a minute late
    return 700.0 if s < step else 500.0


def _samples(conn: psycopg.Connection, n: str, gpus: int, t0: float, t1: float, power: float = 0.0) -> None:
    """Samples every 10 s with the power limit in force, queued for the rollup worker as ingest does."""
    with conn.cursor().copy("COPY gpu_samples (time, node, gpu, power_w, power_limit_w) FROM STDIN") as cp:
        for g in range(gpus):
            s = t0
            while s <= t1:
                cp.write_row(
                    (at(s), n, g, power or 300.0 + 50 * math.sin(s / 900.0) + 7 * g, _limit(n, g, s))
                )
                s += 10.0
    conn.execute("INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)", (n, at(t0), at(t1)))


def _fleet(conn: psycopg.Connection) -> None:
    node(conn, "k1", 4)
    node(conn, "k2", 2)
    _samples(conn, "k1", 4, *SAMPLES)
    _samples(conn, "k2", 2, *SAMPLES)
    run(conn, "r-a", 17.5 * 60, None, {"k1": [0, 1, 2, 3]})
    run(conn, "r-b", H + 300.0, None, {"k2": [0, 1]})
    drain(conn)


#: A minute as the tests compare it: (bucket, least limit or None, greatest limit or None, GPUs, J, GPU-s).
Minute = tuple[float, float | None, float | None, int, float, float]


def _rows(a: np.ndarray) -> list[Minute]:
    return [
        (b, None if math.isnan(lo) else lo, None if math.isnan(hi) else hi, int(n), j, c)
        for b, lo, hi, n, j, c in a.tolist()
    ]


def _live(conn: psycopg.Connection, now: float = NOW) -> dict[str, list[Minute]]:
    read = kept_minutes.read_ranges(conn, [(r.run_id, r.start, T0.timestamp() + now) for r in RUNS])
    return {r.run_id: _rows(rows) for r, rows in zip(RUNS, read, strict=True)}


def _kept(conn: psycopg.Connection) -> list[tuple[str, float]]:
    return [
        (rid, h.timestamp() - T0.timestamp())
        for rid, h in conn.execute("SELECT run_id, hour FROM kept_power_minutes ORDER BY 1, 2")
    ]


def _tamper(conn: psycopg.Connection, run_id: str, hour_s: float) -> None:
    """Change a kept hour behind its marks' back: the first minute's energy becomes 1 J."""
    (blob,) = conn.execute(
        "SELECT minutes FROM kept_power_minutes WHERE run_id = %s AND hour = %s", (run_id, at(hour_s))
    ).fetchone() or (None,)
    assert blob is not None
    rows = kept_minutes.decode(bytes(blob)).copy()
    rows[0, 4] = 1.0
    conn.execute(
        "UPDATE kept_power_minutes SET minutes = %s WHERE run_id = %s AND hour = %s",
        (kept_minutes.encode(rows), run_id, at(hour_s)),
    )


def _read(conn: psycopg.Connection, now: float = NOW) -> dict[str, list[Minute]]:
    return {rid: _rows(rows) for rid, rows in kept_minutes.minutes(conn, RUNS, T0.timestamp() + now).items()}


def test_the_fixture_has_what_the_hours_must_keep(conn: psycopg.Connection) -> None:
    _fleet(conn)
    rows = _live(conn)["r-a"]
    assert {m[1] for m in rows} >= {700.0, 500.0, None}  # both limits, and minutes with none
    assert any(m[1] != m[2] for m in rows)  # the minute GPU 3 lags
    assert all(m[3] == 4 for m in rows) and sum(m[5] > 0 for m in rows) > 0.9 * len(rows)  # energy


def test_closed_hours_are_kept_and_read_back_while_their_marks_hold(conn: psycopg.Connection) -> None:
    _fleet(conn)
    live = _live(conn)
    assert _read(conn) == live  # nothing kept yet: read, and the closed hours kept
    assert _kept(conn) == [("r-a", h * H) for h in range(4)] + [("r-b", h * H) for h in range(1, 4)]
    assert _read(conn) == live  # read back
    # read back, not read again: a kept hour changed behind its marks' back shows, and nothing else
    _tamper(conn, "r-a", 2 * H)
    got = _read(conn)
    assert got["r-b"] == live["r-b"]
    first = next(m for m in live["r-a"] if m[0] >= at(2 * H).timestamp())
    changed = [(a, b) for a, b in zip(got["r-a"], live["r-a"], strict=True) if a != b]
    assert changed == [((*first[:4], 1.0, first[5]), first)]


@pytest.mark.parametrize("change", ["late sample", "allocation", "the run's mark", "every hour"])
def test_a_moved_mark_makes_the_hours_it_names_read_again(conn: psycopg.Connection, change: str) -> None:
    _fleet(conn)
    _read(conn)
    for rid in ("r-a", "r-b"):
        for h in (1, 2, 3):
            _tamper(conn, rid, h * H)
    before = _live(conn)
    if change == "late sample":  # a sample of k1 that arrives late, in hour 12, through the rollup worker
        _samples(conn, "k1", 1, 2 * H + 1805.0, 2 * H + 1805.0, power=900.0)
        drain(conn)
    elif change == "allocation":  # r-b gives up a GPU (which moves the fleet's hours since its start too)
        conn.execute("DELETE FROM run_allocations WHERE run_id = 'r-b' AND gpu = 1")
    elif change == "the run's mark":  # what its window and allocations move, alone
        conn.execute("SELECT gpufleet_pricing_bump(ARRAY['r:r-b'])")
    else:
        conn.execute("SELECT gpufleet_pricing_bump(ARRAY['h'])")
    live = _live(conn)
    got = _read(conn)
    twelve = at(2 * H).timestamp()
    if change == "late sample":
        assert live["r-a"] != before["r-a"]  # the late sample changed a minute of hour 12
        # hour 12 and after are read again; hour 11 of either run, whose mark did not move, is as kept
        for rid in ("r-a", "r-b"):
            assert got[rid] != live[rid]
            assert [m for m in got[rid] if m[0] >= twelve] == [m for m in live[rid] if m[0] >= twelve]
    elif change == "allocation":
        assert live["r-b"] != before["r-b"]
        assert got == live
    elif change == "the run's mark":
        assert got["r-b"] == live["r-b"]  # the run whose mark moved is read again
        assert got["r-a"] != live["r-a"]  # the other is still read back
    else:
        assert got == live
    assert _read(conn) == got  # and what was read again is kept again, right


def test_an_hour_is_kept_once_it_has_settled(conn: psycopg.Connection) -> None:
    _fleet(conn)
    now = 4 * H + SETTLE_S - 1  # 14:02:59: hour 13 closed less than SETTLE_S ago
    assert _read(conn, now) == _live(conn, now)
    assert max(h for _, h in _kept(conn)) == 2 * H
    assert _read(conn, now + 2) == _live(conn, now + 2)
    assert max(h for _, h in _kept(conn)) == 3 * H


def test_a_minute_is_kept_exactly(conn: psycopg.Connection) -> None:
    rows = np.array(
        [
            (1.0, 700.0, 700.0, 8, 1234.5678901234567, 479.99999999999994),
            (61.0, np.nan, np.nan, 3, 0.0, 0.0),
            (121.0, 0.1 + 0.2, 1e300, 2**40, 5e-324, 60.0),
        ]
    )
    back = kept_minutes.decode(kept_minutes.encode(rows))
    assert back.shape == rows.shape and np.array_equal(back, rows, equal_nan=True)
    assert kept_minutes.decode(kept_minutes.encode(kept_minutes.empty())).shape == (0, 6)


def test_the_leader_keeps_closed_hours_newest_first_within_its_budget(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fleet(conn)
    monkeypatch.setattr(kept_minutes, "KEEP_GPU_HOURS", 6.0)  # a statement: an hour of both runs
    gpus = {"r-a": 4, "r-b": 2}
    now = T0.timestamp() + NOW
    past = time.monotonic() - 1  # the budget is spent: one statement
    assert kept_minutes.keep_closed(conn, RUNS, gpus, now, past) == 2
    assert _kept(conn) == [("r-a", 3 * H), ("r-b", 3 * H)]  # the newest hour first
    assert kept_minutes.keep_closed(conn, RUNS, gpus, now, past) == 2
    assert _kept(conn) == [("r-a", 2 * H), ("r-a", 3 * H), ("r-b", 2 * H), ("r-b", 3 * H)]
    assert kept_minutes.keep_closed(conn, RUNS, gpus, now, time.monotonic() + 60) == 3
    assert kept_minutes.keep_closed(conn, RUNS, gpus, now, time.monotonic() + 60) == 0
    # what the leader kept is what a request reads back
    _tamper(conn, "r-b", 1 * H)
    got, live = _read(conn), _live(conn)
    assert got["r-a"] == live["r-a"] and got["r-b"] != live["r-b"]
    # an hour whose mark moved is kept again by the next pass
    conn.execute("SELECT gpufleet_pricing_bump(ARRAY[%s])", (kept_minutes.hour_scope(at(1 * H).timestamp()),))
    assert kept_minutes.keep_closed(conn, RUNS, gpus, now, time.monotonic() + 60) == 2
    assert _read(conn) == live
