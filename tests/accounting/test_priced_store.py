"""Kept incident and ledger pricing (gpufleet.accounting.priced_store) is always the live answer.

One run of 4 GPUs over two hours on a site with a PUE, an energy price, a GPU-hour price and a carbon
series, with a job-wide checkpoint stall, throttling of two GPUs and an idle spell.  Its pieces are
priced once (and kept), then each input the price reads is changed, and the next read must be the live
computation again, not the kept one: each change is chosen so that the figures move, so a missing
invalidation fails here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from gpufleet.accounting import account_runs, incidents
from gpufleet.accounting.incidents import Piece, lost_pieces, window_claims
from gpufleet.accounting.lines import Line
from gpufleet.store.run_model import load_runs
from tests.accounting.builders import (
    at,
    carbon,
    constant_power,
    drain,
    gpu_samples,
    host_samples,
    node,
    run,
    setting,
    site,
)
from tests.accounting.test_incident_cost import incident

NOW = at(86_400)


@pytest.fixture(autouse=True)
def _empty_store(conn: psycopg.Connection) -> Iterator[None]:
    """An empty store, and retention that reaches none of these runs (they are dated, the clock is not)."""
    conn.execute("TRUNCATE priced_pieces, pricing_marks")
    storage = conn.execute("SELECT value FROM gpufleet_meta WHERE key = 'storage'").fetchone()
    _retention(conn, 36_500)
    yield
    conn.execute("TRUNCATE priced_pieces, pricing_marks")
    conn.execute("DELETE FROM gpufleet_meta WHERE key = 'storage'")
    if storage is not None:
        conn.execute("INSERT INTO gpufleet_meta (key, value) VALUES ('storage', %s)", (Jsonb(storage[0]),))


def _retention(conn: psycopg.Connection, days: int) -> None:
    conn.execute(
        "INSERT INTO gpufleet_meta (key, value) VALUES ('storage', %s) ON CONFLICT (key) DO UPDATE "
        "SET value = EXCLUDED.value",
        (Jsonb({"retention_days": days, "rollup_retention_days": 3 * days}),),
    )


def _fleet(conn: psycopg.Connection) -> None:
    site(conn, "s1", pue=1.4, price=0.20, gpu_hour=2.0, currency="EUR", region="R")
    carbon(conn, "R", [(-3600, 300.0), (1800, 500.0), (5400, 250.0)])
    node(conn, "n1", 8, "s1", facts={"gpu_model": "NVIDIA H100 80GB HBM3"})
    run(conn, "r", 5.5, 7190.25, {"n1": [0, 1, 2, 3]}, site_name="s1")
    gpu_samples(
        conn,
        constant_power("n1", [0, 1], 300.0, -60, 7260, counter=True)
        + constant_power("n1", [2, 3], 250.0, -60, 7260, counter=True),
    )
    host_samples(conn, [(s, "n1", 900.0) for s in range(-60, 7261, 10)])
    drain(conn)
    incident(conn, "checkpoint_stall", 600.5, 1200.5, {"run_time_lost_share": 0.5})
    incident(
        conn,
        "throttling",
        900,
        1500,
        {
            "gpus": [
                {"node": "n1", "gpu": 0, "throttled_share": 1.0, "clock_ratio": 0.25},
                {"node": "n1", "gpu": 1, "throttled_share": 1.0, "clock_ratio": 0.25},
            ]
        },
        scope="t",
    )
    incident(conn, "idle_allocation", 3000.25, 3900.75, {"gpus": [{"node": "n1", "gpu": 3}]}, scope="i")


def _keyed(conn: psycopg.Connection, now: datetime = NOW) -> dict[str, list[Piece]]:
    """The keys the run's accounting prices: its lost line and each incident's claim."""
    runs = load_runs(conn, ["r"])
    claims = window_claims(conn, runs, {"r": runs[0].window(now, None, None)}, now=now)
    keyed = {"Lr": lost_pieces(claims["r"])}
    for i, (_kind, ps) in enumerate(claims["r"]):
        keyed[f"I{i}"] = ps
    return keyed


def test_kept_lines_are_the_live_ones(conn: psycopg.Connection, calls: list[int]) -> None:
    _fleet(conn)
    keyed = _keyed(conn)
    live = incidents.price(conn, keyed, NOW, kept=False)
    first = incidents.price(conn, keyed, NOW)
    assert calls == [4, 4]
    kept = incidents.price(conn, keyed, NOW)
    assert calls == [4, 4], "the second read priced again instead of reading what the first kept"
    assert kept == first == live
    assert set(kept) == set(keyed) and all(ln.total_cost > 0 for ln in kept.values())


def test_kept_run_accounting_is_the_live_one(conn: psycopg.Connection) -> None:
    """The bodies with ledgers read back from the store (a read-only snapshot stores when it ends)."""
    _fleet(conn)
    runs = load_runs(conn, ["r"])
    cold = account_runs(conn, runs, now=NOW)
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (5,)  # run, lost line, 3 states
    assert account_runs(conn, runs, now=NOW) == cold
    conn.execute("TRUNCATE priced_pieces")
    assert account_runs(conn, runs, now=NOW) == cold


def test_open_pieces_and_stale_answers_are_not_kept(conn: psycopg.Connection) -> None:
    _fleet(conn)
    now = at(3000)
    open_piece = {
        "open": [Piece("r", "n1", 0, at(100), now, 1.0)],
        "closed": [Piece("r", "n1", 1, at(100), at(2000), 1.0)],
    }
    incidents.price(conn, open_piece, now)
    assert {r[0] for r in conn.execute("SELECT run_id FROM priced_pieces")} == {"closed"}
    conn.execute("TRUNCATE priced_pieces")
    gpu_samples(conn, [(700.5, "n1", 0, 900.0, None)])  # queued, not yet rolled up: answered from samples
    got = incidents.price(conn, _keyed(conn), NOW)
    assert got["Lr"].stale and conn.execute("SELECT count(*) FROM priced_pieces WHERE stale").fetchone() == (
        0,
    )


def test_lines_retention_reaches_are_read_live(conn: psycopg.Connection, calls: list[int]) -> None:
    """Retention deletes samples the accounting of old spans reads: those are neither kept nor read back."""
    _fleet(conn)
    keyed = _keyed(conn)
    incidents.price(conn, keyed, NOW)
    _retention(conn, 1)  # the run's samples are past it
    calls.clear()
    assert incidents.price(conn, keyed, NOW) == incidents.price(conn, keyed, NOW, kept=False)
    assert calls == [4, 4]
    conn.execute("TRUNCATE priced_pieces")
    incidents.price(conn, keyed, NOW)
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,)


def test_pieces_a_period_cuts_are_not_kept(conn: psycopg.Connection) -> None:
    """A report's period cuts a run's pieces anew at each period: those are priced, not stored."""
    _fleet(conn)
    runs = load_runs(conn, ["r"])
    account_runs(conn, runs, now=NOW, since=at(1000), until=at(7000))  # cuts the checkpoint stall
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,)
    cut = account_runs(conn, runs, now=NOW, since=at(100), until=at(7000))  # cuts no incident
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (4,)  # the run's lines: cut
    assert account_runs(conn, runs, now=NOW, since=at(100), until=at(7000)) == cut


def test_a_reader_that_cannot_write_answers_without_keeping(conn: psycopg.Connection) -> None:
    """A hot standby (here: a session whose transactions are read-only) answers live and keeps nothing."""
    _fleet(conn)
    keyed = _keyed(conn)
    runs = load_runs(conn, ["r"])
    live = incidents.price(conn, keyed, NOW, kept=False)
    bodies = account_runs(conn, runs, now=NOW)
    conn.execute("TRUNCATE priced_pieces")
    conn.execute("SET default_transaction_read_only = on")
    try:
        assert incidents.price(conn, keyed, NOW) == live
        assert account_runs(conn, runs, now=NOW) == bodies
    finally:
        conn.execute("SET default_transaction_read_only = off")
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,)


def _late_sample(conn: psycopg.Connection) -> None:
    gpu_samples(conn, [(905.0, "n1", 0, 700.0, None), (2400.0, "n1", 2, 600.0, None)])


def _late_sample_rolled_up(conn: psycopg.Connection) -> None:
    _late_sample(conn)
    drain(conn)


def _sql(stmt: str, *params: Any) -> Callable[[psycopg.Connection], None]:
    def go(conn: psycopg.Connection) -> None:
        conn.execute(stmt, params or None)

    return go


def _region(conn: psycopg.Connection, region: str, point_s: float) -> None:
    """The site's carbon region from the beginning: one whose only point is at ``point_s``."""
    carbon(conn, region, [(point_s, 200.0)])
    setting(conn, "s1", "carbon_region", None, region)


def _facts(conn: psycopg.Connection) -> None:
    conn.execute(
        "INSERT INTO node_facts_history (node, valid_from, facts) VALUES ('n1', %s, %s)",
        (at(-7200), '{"gpu_model": "Tesla T4"}'),
    )


#: Inputs set before pricing, where a change needs them: a GPU-hour price of the node's model, a carbon
#: series whose first point comes days after the run, one whose last point came days before it.
PREPARE: dict[str, Callable[[psycopg.Connection], None]] = {
    "node facts in force": lambda c: setting(c, "s1", "gpu_hour_price", None, 3.0, gpu_model="H100"),
    "carbon point before the first": lambda c: _region(c, "H", 3 * 86_400),
    "carbon point after the last": lambda c: _region(c, "T", -3 * 86_400),
}

CHANGES: dict[str, Callable[[psycopg.Connection], None]] = {
    # read live while queued, and again after the rollup worker rebuilt the minutes
    "late sample, queued": _late_sample,
    "late sample, rolled up": _late_sample_rolled_up,
    "energy price back in time": lambda c: setting(c, "s1", "price_per_kwh", 700, 0.35),
    "PUE": lambda c: setting(c, "s1", "pue", None, 1.1),
    "GPU-hour price of the model": lambda c: setting(c, "s1", "gpu_hour_price", None, 3.0, gpu_model="H100"),
    "currency": _sql("UPDATE sites SET currency = 'USD' WHERE site = 's1'"),
    "carbon point inside": lambda c: carbon(c, "R", [(1000, 900.0)]),
    "carbon point before the first": lambda c: carbon(c, "H", [(2 * 86_400, 100.0)]),
    "carbon point after the last": lambda c: carbon(c, "T", [(-2 * 86_400, 100.0)]),
    "carbon point removed": _sql("DELETE FROM carbon_intensity WHERE region = 'R' AND time = %s", at(1800)),
    "carbon region": lambda c: setting(c, "s1", "carbon_region", 1000, "Q"),
    "run end": _sql('UPDATE runs SET "end" = %s WHERE run_id = %s', at(1100), "r"),
    "run start": _sql("UPDATE runs SET start = %s WHERE run_id = %s", at(800), "r"),
    "allocation share": _sql(
        "UPDATE run_allocations SET share = 0.5, sharing = 'time_slice' WHERE run_id = 'r' AND gpu = 0"
    ),
    "node GPU count": _sql("UPDATE nodes SET gpu_count = 4 WHERE node = 'n1'"),
    "node facts in force": _facts,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_input_is_read_live(conn: psycopg.Connection, change: str) -> None:
    _fleet(conn)
    carbon(conn, "Q", [(0, 50.0)])
    PREPARE.get(change, lambda c: None)(conn)
    keyed = _keyed(conn)
    before = incidents.price(conn, keyed, NOW)
    assert incidents.price(conn, keyed, NOW) == before  # kept
    CHANGES[change](conn)
    live = incidents.price(conn, keyed, NOW, kept=False)
    got = incidents.price(conn, keyed, NOW)
    assert got == live
    assert _figures(got) != _figures(before), "the change does not move the figures: it tests nothing"
    if not live["Lr"].stale:
        assert incidents.price(conn, keyed, NOW) == live  # and kept again


def _figures(priced: dict[str, Line]) -> dict[str, tuple[Any, ...]]:
    return {
        k: (ln.gpu_hours, ln.gpu_kwh, ln.host_kwh, ln.facility_kwh, ln.co2e_kg, ln.total_cost, ln.currency)
        for k, ln in priced.items()
    }


def test_an_unrelated_change_keeps_the_lines(conn: psycopg.Connection, calls: list[int]) -> None:
    """Samples of another node, another site's prices and a carbon point days after the run leave them kept."""
    _fleet(conn)
    site(conn, "s2", price=0.5)
    node(conn, "n2", 8, "s2")
    keyed = _keyed(conn)
    incidents.price(conn, keyed, NOW)
    gpu_samples(conn, constant_power("n2", [0], 300.0, 0, 600))
    drain(conn)
    setting(conn, "s2", "price_per_kwh", 100, 0.9)
    carbon(conn, "R", [(3 * 86_400, 100.0)])
    calls.clear()
    incidents.price(conn, keyed, NOW)
    assert calls == []


def _moved(conn: psycopg.Connection, change: Callable[[], object]) -> list[str]:
    """The marks ``change`` moved."""
    marks = "SELECT scope, version FROM pricing_marks"
    before = set(conn.execute(marks).fetchall())
    change()
    return sorted(scope for scope, _ in set(conn.execute(marks).fetchall()) - before)


def test_a_change_over_years_marks_its_whole_scope(conn: psycopg.Connection, calls: list[int]) -> None:
    """A carbon point centuries before the next, or a sample after a node's years of silence, moves the
    mark of the whole region or node, not one per day (millions of rows from one request): the lines kept
    of it are then read live, the same figures again."""
    _fleet(conn)
    keyed = _keyed(conn)
    before = incidents.price(conn, keyed, NOW)
    ages = (
        "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) VALUES ('R', '0398-11-19T00:00:00Z', 90)"
    )
    # (and every kept fleet hour: a point before the region's first is carried back to all of them)
    assert _moved(conn, lambda: conn.execute(ages)) == ["c:R", "c:R:head", "h"]
    calls.clear()
    assert incidents.price(conn, keyed, NOW) == before
    assert calls, "a kept line read after its region's mark moved"
    incidents.price(conn, keyed, NOW)
    assert len(calls) == 1  # kept again

    def silence() -> None:
        gpu_samples(conn, [(-3 * 365 * 86_400, "n1", 0, 300.0, None)])
        drain(conn)

    assert _moved(conn, silence) == ["e:n1", "h"]  # and every kept fleet hour, years of them
    calls.clear()
    assert incidents.price(conn, keyed, NOW) == before
    assert calls, "a kept line read after its node's mark moved"
    # a change of days marks its days (here the new last point's, and what it carries forward), not
    # the whole region
    moved = _moved(conn, lambda: carbon(conn, "R", [(3 * 86_400, 100.0)]))
    assert [m for m in moved if not m.startswith("h:")] == ["c:R:2026-12-04", "c:R:tail"]
    # (and the fleet's hours from the new last point on, which it now prices)
    assert min(m for m in moved if m.startswith("h:")) == "h:2026-12-04T10"


def test_a_mark_moves_once_per_transaction(conn: psycopg.Connection) -> None:
    """Marking a scope again in the transaction that moved it leaves its row alone: a bulk change whose
    rows each mark the same scopes wrote a version of the row per mark, each write walking the versions
    before it (a COPY's cost grew with the square of its rows)."""
    marks = "SELECT scope, ctid::text, version FROM pricing_marks WHERE scope IN ('x', 'y') ORDER BY scope"
    with conn.transaction():
        conn.execute("SELECT gpufleet_pricing_bump(ARRAY['x', 'y'])")
        first = conn.execute(marks).fetchall()
        conn.execute("SELECT gpufleet_pricing_bump(ARRAY['y', 'x', 'z'])")
        assert conn.execute(marks).fetchall() == first
        assert conn.execute("SELECT count(*) FROM pricing_marks WHERE scope = 'z'").fetchone() == (1,)
    with conn.transaction():
        conn.execute("SELECT gpufleet_pricing_bump(ARRAY['x'])")
        (x, y) = conn.execute(marks).fetchall()
    assert x[2] > first[0][2] and y == first[1]
