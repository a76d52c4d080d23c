"""The fleet's kept hours give the live query's lines, and every input a kept hour read moves its mark.

Accounting V6 (the text before the kept hours) is installed beside the current one as a function of
this session (``pg_temp``): it prices every period live, so it is what the kept hours must give.  The
fleet has two sites and two currencies (one site changes currency in the middle), time-of-use prices,
an hourly-ish carbon series, runs that start and end inside hours, GPUs shared by two runs, a node held
in part and a node that never reported; periods start and end on and off the hour.

After the hours are kept, each kind of change to an input (a late sample, a run registered late, a
run's end or start moved, an allocation added, a run removed, a price, a carbon point, a node moved to
another site, a new node with old samples, new facts) must leave the current text equal to V6, which
it is only if the change moved the marks of the hours it reaches: a trigger that did not fire leaves
the old kept lines in the answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from gpufleet.accounting import fleet_hours
from gpufleet.accounting.ahead import PriceAhead
from gpufleet.db import sql_files
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
from tests.accounting.test_fleet_currency_join import COLUMNS, assert_same_lines

#: The fleet's samples span [START, END) seconds from T0 (10:00 UTC): the hours 09:00 to 12:00.
START, END = -3600.0, 7200.0
#: What "now" is for the readers and the keeper: the last hour closed and settled.
NOW = END + 600.0
KEEPING = fleet_hours.Keeping(max_gap_s=60.0, gone_after_s=86400.0, days=1.0)
#: Periods (seconds from T0) on and off the hour, inside one hour, across all of them.
PERIODS = ((START, END), (0, 3600), (-1800.5, 5400), (1000.25, 2000), (3599, 3601), (-7200, NOW), (5000, NOW))


def _fleet(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.2, gpu_hour=2.5, currency="EUR", region="DE")
    site(conn, "us", pue=1.1, price=0.1, gpu_hour=2.0, currency="USD", carbon=400.0)
    conn.execute(
        "INSERT INTO site_settings (site, setting, valid_from, txt) VALUES ('us', 'currency', %s, 'EUR')",
        (at(1800),),
    )
    # an H100 costs more an hour at the EU site: the nodes' facts price their runs
    conn.execute(
        "INSERT INTO site_settings (site, setting, gpu_model, valid_from, num) "
        "VALUES ('eu', 'gpu_hour_price', 'H100', %s, 4.0)",
        (at(-3600 * 24),),
    )
    carbon(conn, "DE", [(s, 200.0 + (s % 700) / 7) for s in range(-4200, 9000, 1450)])
    prices(conn, "eu", [(900, 0.25), (4100.5, 0.18)])
    for n, count, s in (("a1", 4, "eu"), ("a2", 2, "us"), ("a3", 2, "us")):
        node(conn, n, count, s)
        if n == "a3":
            continue  # registered, never reported
        gpu_samples(conn, wavy_power(n, count, START, END, 20.0))
        host_samples(conn, [(START + k * 30.0, n, 250.0 + k % 5) for k in range(int((END - START) / 30) + 1)])
    run(conn, "r1", 130.5, 4500, {"a1": [0, 1], "a2": [0]}, site_name="eu", team="lm")
    run(conn, "r2", -2000, 3100.25, {"a2": [1]}, site_name="us", team="vision")
    run(conn, "r3", 2000, None, {"a1": [3]}, site_name="us")
    for rid, lo, hi in (("h1", -3000, 2600), ("h2", 1300, None)):
        conn.execute(
            'INSERT INTO runs (run_id, site, start, "end") VALUES (%s, %s, %s, %s)',
            (rid, "eu", at(lo), None if hi is None else at(hi)),
        )
        conn.execute(
            "INSERT INTO run_allocations (run_id, node, gpu, sharing, share) "
            "VALUES (%s, 'a1', 2, 'time_slice', 0.5)",
            (rid,),
        )


def _rows(conn: psycopg.Connection, fn: str, lo: float, hi: float) -> list[tuple]:
    return conn.execute(
        f"SELECT {COLUMNS} FROM {fn}(%s, %s, %s, NULL, true, 60, 'auto', 'line', NULL) "
        "ORDER BY line, run_id NULLS FIRST, site NULLS FIRST, part_start, currency NULLS FIRST",
        (at(lo), at(hi), at(NOW)),
    ).fetchall()


def _same_as_live(conn: psycopg.Connection) -> None:
    for lo, hi in PERIODS:
        assert_same_lines(
            _rows(conn, "gpufleet_accounting", lo, hi), _rows(conn, "pg_temp.accounting_v6", lo, hi), (lo, hi)
        )


def _keep(conn: psycopg.Connection) -> int:
    return fleet_hours.keep(conn, KEEPING, at(NOW), budget_s=60.0)


def _missing(conn: psycopg.Connection) -> list[datetime]:
    return fleet_hours.missing(conn, KEEPING, at(NOW))


#: The hours of the fleet (09:00 to 12:00 UTC of T0's day) and the ones before, kept empty.
HOURS = [at(START) + timedelta(hours=i) for i in range(3)]


@pytest.fixture(params=["registered now", "registered before"])
def fleet(conn: psycopg.Connection, request: pytest.FixtureRequest) -> psycopg.Connection:
    """The fleet, its nodes registered now (after its samples: every GPU's membership probed in full) or
    a day before its samples (most GPUs decided by the registration and their last sample)."""
    _fleet(conn)
    if request.param == "registered before":
        conn.execute("UPDATE nodes SET first_seen = %s", (at(START - 86400),))
    drain(conn)
    v6 = sql_files.text("gpufleet_accounting.v6").replace(
        "CREATE OR REPLACE FUNCTION gpufleet_accounting(", "CREATE FUNCTION pg_temp.accounting_v6(", 1
    )
    assert v6 != sql_files.text("gpufleet_accounting.v6")
    conn.execute(v6)
    return conn


def test_with_nothing_kept_the_lines_are_the_live_querys(fleet: psycopg.Connection) -> None:
    assert fleet.execute("SELECT count(*) FROM fleet_hours_kept").fetchone() == (0,)
    _same_as_live(fleet)


def test_kept_hours_give_the_live_querys_lines(fleet: psycopg.Connection) -> None:
    missing = _missing(fleet)
    assert set(HOURS) <= set(missing) and missing == sorted(missing, reverse=True)  # newest first
    assert _keep(fleet) == len(missing)
    assert _missing(fleet) == []
    lines = fleet.execute("SELECT count(*) FROM fleet_hour_lines WHERE hour = ANY(%s)", (HOURS,)).fetchone()
    assert lines is not None and lines[0] > 10
    _same_as_live(fleet)


def test_the_reader_takes_kept_hours_while_their_marks_hold(fleet: psycopg.Connection) -> None:
    _keep(fleet)
    live = _rows(fleet, "pg_temp.accounting_v6", 0, 3600)
    # a kept line changed under the reader shows in its answer: the kept hour is what it read
    changed = fleet.execute(
        "UPDATE fleet_hour_lines SET gpu_kwh = gpu_kwh + 1000 WHERE hour = %s AND line = 'total'", (at(0),)
    ).rowcount
    got = _rows(fleet, "gpufleet_accounting", 0, 3600)
    i = COLUMNS.split(", ").index("gpu_kwh")
    total = sum(r[i] for r in got if r[0] == "total") - sum(r[i] for r in live if r[0] == "total")
    assert changed >= 2 and round(total) == 1000 * changed
    # a sample inside that hour moves its mark (and the later ones': it may be the GPU's last): the hour
    # is priced live again, and kept again
    gpu_samples(fleet, [(1234.5, "a1", 0, 500.0, None)])
    drain(fleet)
    again = _missing(fleet)
    assert again[-1] == at(0) and at(-3600) not in again
    _same_as_live(fleet)
    assert _keep(fleet) == len(again)
    _same_as_live(fleet)


def test_a_range_queued_for_the_rollup_worker_is_priced_live(fleet: psycopg.Connection) -> None:
    _keep(fleet)
    fleet.execute("UPDATE fleet_hour_lines SET gpu_kwh = gpu_kwh + 1000 WHERE line = 'total'")
    # a late sample queued and not yet rolled up: the hours from it on are read live (and from raw)
    gpu_samples(fleet, [(4000.5, "a2", 1, 700.0, None)])
    for lo, hi in ((3600, 7200), (4000, NOW)):
        assert_same_lines(
            _rows(fleet, "gpufleet_accounting", lo, hi),
            _rows(fleet, "pg_temp.accounting_v6", lo, hi),
            (lo, hi),
        )
    # the hours before it still read what was kept
    assert _rows(fleet, "gpufleet_accounting", 0, 3600) != _rows(fleet, "pg_temp.accounting_v6", 0, 3600)


def _late_run(conn: psycopg.Connection) -> None:
    run(conn, "late", 600, 1900, {"a1": [3], "a3": [0]}, site_name="us")


def _two_runs_one_statement(conn: psycopg.Connection) -> None:
    """Two runs registered late, their allocations in one statement: the one on a GPU silent since
    before its start reaches back to the GPU's last sample."""
    for rid, lo, hi in (("s1", 4000, 5000), ("s2", NOW + 3600, None)):
        conn.execute(
            "INSERT INTO runs (run_id, site, start, \"end\") VALUES (%s, 'us', %s, %s)",
            (rid, at(lo), None if hi is None else at(hi)),
        )
    conn.execute(
        "INSERT INTO run_allocations (run_id, node, gpu) VALUES ('s1', 'a3', 0), ('s2', 'a2', 0), ('s1', 'a3', 1)"
    )


def _new_node(conn: psycopg.Connection) -> None:
    node(conn, "a4", 1, "eu")
    gpu_samples(conn, [(START + k * 20.0, "a4", 0, 120.0, None) for k in range(200)])


def _dated_facts(conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO node_facts_history (node, valid_from, facts) VALUES ('a1', %s, %s)",
        (at(2500), '{"gpu_model": "NVIDIA H100 80GB HBM3"}'),
    )


def _facts(conn: psycopg.Connection) -> None:
    assert conn.execute("SELECT count(*) FROM node_facts_history WHERE node = 'a1'").fetchone() == (0,)
    conn.execute("UPDATE nodes SET facts = '{\"gpu_model\": \"NVIDIA H100 80GB HBM3\"}' WHERE node = 'a1'")


CHANGES: dict[str, Callable[[psycopg.Connection], None]] = {
    "late sample": lambda c: gpu_samples(c, [(2222.2, "a1", 1, 650.0, None)]),
    "run registered late": _late_run,
    "run ended earlier": lambda c: c.execute("UPDATE runs SET \"end\" = %s WHERE run_id = 'r1'", (at(1500),)),
    "running run ended in the past": lambda c: c.execute(
        "UPDATE runs SET \"end\" = %s WHERE run_id = 'r3'", (at(2100),)
    ),
    "run started earlier": lambda c: c.execute("UPDATE runs SET start = %s WHERE run_id = 'r3'", (at(-900),)),
    "run moved to another site": lambda c: c.execute("UPDATE runs SET site = 'eu' WHERE run_id = 'r2'"),
    "allocation added": lambda c: c.execute(
        "INSERT INTO run_allocations (run_id, node, gpu) VALUES ('r3', 'a3', 1)"
    ),
    "allocation removed": lambda c: c.execute("DELETE FROM run_allocations WHERE run_id = 'r1' AND gpu = 1"),
    "allocation's share changed": lambda c: c.execute(
        "UPDATE run_allocations SET share = 0.25 WHERE run_id = 'h1'"
    ),
    "allocations of two runs in one statement": _two_runs_one_statement,
    "run removed": lambda c: c.execute("DELETE FROM runs WHERE run_id = 'r2'"),
    "price edited back in time": lambda c: prices(c, "eu", [(-1200, 0.31)]),
    "carbon point": lambda c: carbon(c, "DE", [(1111, 950.0)]),
    "node moved to another site": lambda c: c.execute("UPDATE nodes SET site = 'us' WHERE node = 'a1'"),
    "node registered with old samples": _new_node,
    "dated facts that price a model": _dated_facts,
    "facts reported by a node without dated ones": _facts,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_moves_the_hours_it_reaches(fleet: psycopg.Connection, change: str) -> None:
    _keep(fleet)
    assert _missing(fleet) == []
    CHANGES[change](fleet)
    drain(fleet)
    assert _missing(fleet), "the change moved no kept hour"
    _same_as_live(fleet)
    _keep(fleet)
    assert _missing(fleet) == []
    _same_as_live(fleet)


def test_ending_a_long_run_now_moves_only_the_hour_it_ends_in(fleet: psycopg.Connection) -> None:
    _keep(fleet)
    fleet.execute("UPDATE runs SET \"end\" = %s WHERE run_id = 'h2'", (at(NOW - 60),))
    assert _missing(fleet) == []
    _same_as_live(fleet)


def _marked(conn: psycopg.Connection, statements: list[str]) -> set[str]:
    """The marks ``statements`` move, run in one transaction that is then rolled back."""
    marks = "SELECT scope, version FROM pricing_marks"
    with conn.transaction(force_rollback=True):
        before = set(conn.execute(marks).fetchall())
        for stmt in statements:
            conn.execute(stmt)
        return {scope for scope, _ in set(conn.execute(marks).fetchall()) - before}


#: (the rows one statement each, the same rows in one statement)
_ALLOCATION_STATEMENTS = {
    "insert": (
        [
            f"INSERT INTO run_allocations (run_id, node, gpu) VALUES {v}"
            for v in ("('r3', 'a3', 1)", "('r2', 'a3', 0)")
        ],
        "INSERT INTO run_allocations (run_id, node, gpu) VALUES ('r3', 'a3', 1), ('r2', 'a3', 0)",
    ),
    "delete": (
        [
            f"DELETE FROM run_allocations WHERE run_id = '{r}' AND node = '{n}'"
            for r, n in (("r3", "a1"), ("r2", "a2"))
        ],
        "DELETE FROM run_allocations WHERE (run_id, node) IN (('r3', 'a1'), ('r2', 'a2'))",
    ),
    "update": (
        [f"UPDATE run_allocations SET share = 0.25 WHERE run_id = '{r}'" for r in ("h2", "h1")],
        "UPDATE run_allocations SET share = 0.25 WHERE run_id IN ('h1', 'h2')",
    ),
}


@pytest.mark.parametrize("op", sorted(_ALLOCATION_STATEMENTS))
def test_a_statement_of_allocations_marks_what_its_rows_mark_one_by_one(
    fleet: psycopg.Connection, op: str
) -> None:
    """Allocations are marked per statement (every row's hours run to now, so the statement's are those
    of its earliest row): the same hours as its rows marked one by one."""
    each, together = _ALLOCATION_STATEMENTS[op]
    alone = [_marked(fleet, [stmt]) for stmt in each]
    marked = _marked(fleet, [together])
    assert marked == _marked(fleet, each) == alone[0] | alone[1]
    assert min(alone, key=len) < marked, "the rows mark the same hours: the statement's earliest is untested"
    assert _marked(fleet, ["DELETE FROM run_allocations WHERE false"]) == set()


def test_a_change_reaching_past_the_hour_marks_moves_every_hour(conn: psycopg.Connection) -> None:
    assert conn.execute(
        "SELECT gpufleet_fleet_hour_scopes(%s, %s)", (at(0), at(3 * 3600 - 1))
    ).fetchone() == (["h:2026-12-01T10", "h:2026-12-01T11", "h:2026-12-01T12"],)
    assert conn.execute("SELECT gpufleet_fleet_hour_scopes(%s, %s)", (at(0), at(1001 * 3600))).fetchone() == (
        ["h"],
    )
    assert conn.execute("SELECT gpufleet_fleet_hour_scopes(%s, 'infinity')", (at(0),)).fetchone() == (["h"],)


def test_stale_lines_are_not_kept(fleet: psycopg.Connection) -> None:
    gpu_samples(fleet, [(3700.5, "a1", 2, 400.0, None)])  # queued: the hour from 11:00 reads raw samples
    kept = _keep(fleet)
    held = {r[0] for r in fleet.execute("SELECT hour FROM fleet_hours_kept").fetchall()}
    assert at(3600) not in held and at(3600) in _missing(fleet) and 0 < kept == len(held)
    drain(fleet)
    _keep(fleet)
    assert _missing(fleet) == []
    _same_as_live(fleet)


def test_the_leader_keeps_the_hours_after_what_settled(fleet: psycopg.Connection) -> None:
    ahead = PriceAhead(60.0, fleet=KEEPING)
    ahead.run(fleet, at(NOW))
    assert _missing(fleet) == []
    _same_as_live(fleet)


def test_keeping_is_capped_short_of_retention() -> None:
    from gpufleet.config import Settings

    s = Settings.model_validate({"storage": {"retention_days": 10}, "accounting": {"keep_fleet_days": 35}})
    assert fleet_hours.keeping_of(s).days == 9
    assert fleet_hours.keeping_of(Settings()).days == 35
    off = Settings.model_validate({"accounting": {"keep_fleet_days": 0}})
    assert fleet_hours.keeping_of(off).days == 0
    assert fleet_hours.missing(None, fleet_hours.keeping_of(off), datetime.now(UTC)) == []  # type: ignore[arg-type]


def test_a_pass_with_no_budget_left_makes_one_call(fleet: psycopg.Connection) -> None:
    """The leader's pass may have spent its budget on what settled: it still keeps one call's hours
    (the newest), so the fleet's hours are never starved, and no more (its rollups wait on it)."""
    before = _missing(fleet)
    assert len(before) > fleet_hours.HOURS_PER_CALL
    assert fleet_hours.keep(fleet, KEEPING, at(NOW), budget_s=0.0) == fleet_hours.HOURS_PER_CALL
    assert _missing(fleet) == before[fleet_hours.HOURS_PER_CALL :]
    # a call whose hours are all stale keeps none, and the pass still ends after it
    gpu_samples(fleet, [(3700.5, "a1", 2, 400.0, None)])
    fleet.execute("DELETE FROM fleet_hours_kept")
    assert fleet_hours.keep(fleet, KEEPING, at(NOW), budget_s=0.0) < fleet_hours.HOURS_PER_CALL
    assert len(_missing(fleet)) > len(before) - fleet_hours.HOURS_PER_CALL


def test_a_keeper_meeting_another_keeps_nothing_and_goes_on(fleet: psycopg.Connection, db: str) -> None:
    """Two leaders for a moment (one handing over): the second to store an hour finds the first's row
    and keeps nothing of that call, without an error; the hour holds the first one's lines."""
    hour = _missing(fleet)[0]
    with psycopg.connect(db) as other:
        other.execute(
            "INSERT INTO fleet_hours_kept (max_gap_s, source, gone_after_s, hour, whole_mark, hour_mark) "
            "VALUES (60, 'auto', 86400, %s, 0, 0)",
            (hour,),
        )
        got: list[int] = []
        keeper = threading.Thread(target=lambda: got.append(_keep_one(db)))
        keeper.start()
        time.sleep(1.0)  # the keeper waits on the other's uncommitted row
        other.commit()
        keeper.join(timeout=60)
    assert got == [0]
    assert fleet.execute("SELECT count(*) FROM fleet_hours_kept WHERE hour = %s", (hour,)).fetchone() == (1,)


def _keep_one(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        return fleet_hours.keep(conn, KEEPING, at(NOW), budget_s=0.0)
