"""An ended run's claims, kept between readers (gpufleet.accounting.kept_claims), always give the live answer.

The fleet is the priced store's (tests/accounting/test_priced_store.py): one run of 4 GPUs over two
hours with a checkpoint stall, throttling of two GPUs and an idle spell.  Its accounting with the ledger
is computed once (claims and lines kept), read back without claiming, then each input a claim reads is
changed and the next read must equal the live computation; each change moves the figures, so a missing
invalidation fails here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from gpufleet.accounting import account_runs, kept_claims, ledger
from gpufleet.accounting.result import AccountingBody
from gpufleet.store.run_model import Run, load_runs
from tests.accounting.builders import at, run
from tests.accounting.test_incident_cost import incident
from tests.accounting.test_priced_store import NOW, _empty_store, _fleet

__all__ = ["_empty_store"]  # the priced store's fixture: an empty store, retention reaching no run here


@pytest.fixture
def claimed(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The runs each accounting claimed from their incidents (none: every run's claims were kept)."""
    seen: list[list[str]] = []
    real = ledger.window_claims

    def counted(conn: psycopg.Connection, runs: list[Run], *a: Any, **kw: Any) -> Any:
        seen.append(sorted(r.run_id for r in runs))
        return real(conn, runs, *a, **kw)

    monkeypatch.setattr(ledger, "window_claims", counted)
    return seen


def _accounting(conn: psycopg.Connection, ids: tuple[str, ...] = ("r",), **kw: Any) -> list[AccountingBody]:
    return account_runs(conn, load_runs(conn, list(ids)), now=NOW, **kw)


def _live(conn: psycopg.Connection, ids: tuple[str, ...] = ("r",), **kw: Any) -> list[AccountingBody]:
    """The answer with nothing kept (what an empty store computes), leaving the store as it was."""
    conn.execute("BEGIN")
    try:
        conn.execute("TRUNCATE kept_claims, priced_pieces")
        return account_runs(conn, load_runs(conn, list(ids)), now=NOW, **kw)
    finally:
        conn.execute("ROLLBACK")


def _ledger(bodies: list[AccountingBody]) -> list[tuple[Any, ...]]:
    return [
        (b["lost_to_incidents"], {s: (v["gpu_hours"], v["gpu_kwh"]) for s, v in b["ledger"].items()})
        for b in bodies
    ]


def test_kept_claims_are_the_live_ones(conn: psycopg.Connection, claimed: list[list[str]]) -> None:
    _fleet(conn)
    run(conn, "r2", 3600, None, {"n1": [6]}, site_name="s1")  # running: its window grows
    incident(
        conn, "idle_allocation", 4000, 4500, {"gpus": [{"node": "n1", "gpu": 6}]}, run_id="r2", scope="r2"
    )
    live = _live(conn, ("r", "r2"))
    claimed.clear()
    first = _accounting(conn, ("r", "r2"))
    assert claimed == [["r", "r2"]]
    again = _accounting(conn, ("r", "r2"))
    assert claimed[-1] == ["r2"], "the ended run's incidents were claimed again instead of read back"
    assert again == first == live
    assert again[0]["lost_to_incidents"]["incidents"] == 3 and again[0]["lost_to_incidents"]["gpu_hours"] > 0
    assert conn.execute("SELECT run_id, incidents FROM kept_claims").fetchall() == [("r", 3)]
    # without the ledger: the kept lost line
    claimed.clear()
    got = _accounting(conn, ledger=False)
    assert claimed == [[]]
    assert got == _live(conn, ledger=False)


def test_an_unrelated_change_keeps_the_claims(conn: psycopg.Connection, claimed: list[list[str]]) -> None:
    """The sweep's updates of an incident's last sighting, and another run's incidents, change no claim."""
    _fleet(conn)
    before = _accounting(conn)
    conn.execute("UPDATE incidents SET last_seen = last_seen + INTERVAL '1 second'")
    incident(conn, "idle_allocation", 100, 200, {}, run_id="other", scope="o")
    claimed.clear()
    assert _accounting(conn) == before
    assert claimed == [[]]


def _sql(stmt: str, *params: Any) -> Callable[[psycopg.Connection], None]:
    def go(conn: psycopg.Connection) -> None:
        conn.execute(stmt, params or None)

    return go


CHANGES: dict[str, Callable[[psycopg.Connection], None]] = {
    "incident added": lambda c: incident(c, "hung_collective", 2000, 2600, {}, scope="h"),
    "incident removed": _sql("DELETE FROM incidents WHERE kind = 'checkpoint_stall'"),
    "incident end": _sql("UPDATE incidents SET \"end\" = %s WHERE kind = 'checkpoint_stall'", at(2400.5)),
    "incident start": _sql("UPDATE incidents SET start = %s WHERE kind = 'idle_allocation'", at(2000)),
    "incident evidence": _sql(
        "UPDATE incidents SET evidence = '{\"run_time_lost_share\": 0.9}' WHERE kind = 'checkpoint_stall'"
    ),
    "incident kind": _sql("UPDATE incidents SET kind = 'hung_collective' WHERE kind = 'idle_allocation'"),
    "incident GPU": _sql(
        'UPDATE incidents SET evidence = \'{"gpus": [{"node": "n1", "gpu": 0}]}\' WHERE kind = \'idle_allocation\''
    ),
    "incident moved to another run": _sql("UPDATE incidents SET run_id = 'other' WHERE kind = 'throttling'"),
    "incident moved into the run": lambda c: (
        incident(c, "hung_collective", 2000, 2600, {}, run_id="other", scope="h"),
        c.execute("UPDATE incidents SET run_id = 'r' WHERE scope_key = 'hung_collective|h'"),
    ),
    "run end": _sql('UPDATE runs SET "end" = %s WHERE run_id = %s', at(1100), "r"),
    "allocation removed": _sql("DELETE FROM run_allocations WHERE run_id = 'r' AND gpu = 3"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_input_is_claimed_live(
    conn: psycopg.Connection, claimed: list[list[str]], change: str
) -> None:
    _fleet(conn)
    before = _accounting(conn)
    claimed.clear()
    assert _accounting(conn) == before and claimed == [[]]  # kept
    CHANGES[change](conn)
    got = _accounting(conn)
    assert claimed[-1] == ["r"], "the change left the kept claims readable"
    assert got == _live(conn)
    assert _ledger(got) != _ledger(before), "the change does not move the figures: it tests nothing"
    claimed.clear()
    assert _accounting(conn) == got and claimed == [[]]  # and kept again


def test_cut_windows_and_runs_changed_since_loaded_are_not_kept(conn: psycopg.Connection) -> None:
    """A period cutting the run asks another question each time; claims made over a run that changed
    since the caller loaded it rest on marks that do not describe it."""
    _fleet(conn)
    assert _accounting(conn, since=at(1000), until=at(5000)) == _live(conn, since=at(1000), until=at(5000))
    assert conn.execute("SELECT count(*) FROM kept_claims").fetchone() == (0,)
    runs = load_runs(conn, ["r"])  # loaded before an allocation is removed
    conn.execute("DELETE FROM run_allocations WHERE run_id = 'r' AND gpu = 3")
    got = account_runs(conn, runs, now=NOW)
    assert conn.execute("SELECT count(*) FROM kept_claims").fetchone() == (0,), (
        "claims over allocations the database no longer has were kept"
    )
    assert got == account_runs(conn, runs, now=NOW)


def test_claims_of_other_rules_are_not_read(
    conn: psycopg.Connection, claimed: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims kept by code that claims otherwise (another release) are keyed apart and never read."""
    _fleet(conn)
    before = _accounting(conn)
    monkeypatch.setattr(kept_claims, "_rules", lambda: b"another release")
    claimed.clear()
    assert _accounting(conn) == before
    assert claimed == [["r"]]
