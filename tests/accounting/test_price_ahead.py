"""Incidents that closed and runs that ended are priced by the collector's leader before anyone asks
(gpufleet.accounting.ahead): the first reader finds every piece kept and prices nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from gpufleet.accounting import account_runs, ahead
from gpufleet.accounting.ahead import PriceAhead
from gpufleet.accounting.incidents import incident_costs
from gpufleet.collector.leader import Leader
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.config import Settings
from gpufleet.store.run_model import load_runs
from tests.accounting.builders import at
from tests.accounting.test_priced_store import _fleet, _retention
from tests.collector.test_sweep import wait_until

NOW = at(86_400)
INCIDENTS = 'SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents ORDER BY id'


@pytest.fixture(autouse=True)
def _fleet_kept_for_ever(conn: psycopg.Connection) -> Iterator[None]:
    """The fleet of the priced-store tests, with retention that reaches none of it, and an empty store."""
    conn.execute("TRUNCATE priced_pieces, pricing_marks")
    _retention(conn, 36_500)
    _fleet(conn)
    yield
    conn.execute("TRUNCATE priced_pieces, pricing_marks")
    conn.execute("DELETE FROM gpufleet_meta WHERE key = 'storage'")


def _readers(conn: psycopg.Connection) -> tuple[Any, Any]:
    """What the incident pages and the run's page ask: every incident's cost, the run with its ledger."""
    rows = [
        dict(zip(("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence"), r, strict=True))
        for r in conn.execute(INCIDENTS).fetchall()
    ]
    return incident_costs(conn, rows, now=NOW), account_runs(conn, load_runs(conn, ["r"]), now=NOW)


def test_settled_incidents_and_runs_are_priced_once_before_their_readers(
    conn: psycopg.Connection, calls: list[int]
) -> None:
    ahead = PriceAhead(max_gap_s=60.0, recent_s=7200)
    # the run ended at 7190 s, its three incidents by 3901 s: all within the two hours before 7300 s
    assert ahead.run(conn, at(7300)) == (3, 1)
    assert calls, "the pass priced nothing"
    calls.clear()
    first = _readers(conn)
    assert calls == [], "a reader priced what the pass should have kept"
    assert ahead.run(conn, at(7310)) == (0, 0)  # each is priced once
    # an incident whose end moves is another claim: priced again, and its readers find it kept
    conn.execute("UPDATE incidents SET \"end\" = %s WHERE kind = 'idle_allocation'", (at(3950),))
    assert ahead.run(conn, at(7320)) == (1, 1)  # and its run, whose ledger it changes
    calls.clear()
    _readers(conn)
    assert calls == []
    # what settled longer ago than the window is left to its readers
    assert PriceAhead(max_gap_s=60.0, recent_s=7200).run(conn, at(7191) + timedelta(hours=2)) == (0, 0)
    # and kept figures are the live ones
    conn.execute("TRUNCATE priced_pieces, pricing_marks")
    conn.execute("UPDATE incidents SET \"end\" = %s WHERE kind = 'idle_allocation'", (at(3900.75),))
    assert _readers(conn) == first


def test_a_pass_stops_at_its_budget_and_the_next_goes_on(
    conn: psycopg.Connection, calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its budget a pass starts no more pricing (the leader's rollups and sweeps wait behind it), yet
    each prices something, so what settled is priced within a few passes."""
    monkeypatch.setattr(ahead, "CHUNK", 1)
    slow = PriceAhead(max_gap_s=60.0, recent_s=7200, budget_s=0.0)
    passes = [slow.run(conn, at(7300 + i)) for i in range(5)]
    assert passes == [(1, 0), (1, 0), (1, 0), (0, 1), (0, 0)]
    calls.clear()
    _readers(conn)
    assert calls == []


@pytest.mark.timeout(120)
def test_the_leader_prices_what_settled(
    conn: psycopg.Connection, db: str, settings: Settings, calls: list[int]
) -> None:
    s = settings.model_copy(update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 0.2})})
    leader = Leader(db, s, CollectorMetrics(), sweep=lambda c, now: None, rollup_interval_s=0.1)
    leader.ahead.recent_s = 30 * 86_400  # the fleet is dated days back; the leader prices at the clock's now
    leader.start()
    try:
        wait_until(lambda: leader.ahead.done != {}, 60, "the leader prices the settled run and incidents")
    finally:
        leader.stop()
    assert {k[0] for k in leader.ahead.done} == {"i", "r"}
    calls.clear()
    _readers(conn)
    assert calls == []
