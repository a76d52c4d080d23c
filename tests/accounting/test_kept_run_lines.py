"""A closed run's own lines, kept between readers (gpufleet.accounting.run_lines), are always the live ones.

The fleet and the changes are the priced store's (tests/accounting/test_priced_store.py): one run of 4 GPUs
over two hours, priced once and kept, then each input its lines read is changed, and the next read must be
the live computation again; each change moves the figures, so a missing invalidation fails here.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from gpufleet.accounting import account_runs, run_lines
from gpufleet.accounting.lines import Line
from gpufleet.store.run_model import load_runs
from tests.accounting.builders import at, carbon, constant_power, drain, gpu_samples, node, run
from tests.accounting.test_priced_store import CHANGES, NOW, PREPARE, _empty_store, _fleet

__all__ = ["_empty_store"]  # the priced store's fixture: an empty store, retention reaching no run here


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The runs each call of the database's accounting computed (none: every run's lines were kept)."""
    seen: list[list[str]] = []
    real = run_lines.rows

    def counted(conn: psycopg.Connection, *a: Any, **kw: Any) -> Any:
        seen.append(sorted(kw.get("run_ids") or []))
        return real(conn, *a, **kw)

    monkeypatch.setattr(run_lines, "rows", counted)
    return seen


def _lines(conn: psycopg.Connection, kept: bool = True, **kw: Any) -> dict[str, list[Line]]:
    runs = load_runs(conn, ["r", "r2"])
    return run_lines.run_lines(
        conn,
        runs,
        kw.get("since"),
        kw.get("until"),
        kw.get("now", NOW),
        max_gap_s=60.0,
        source="auto",
        kept=kept,
    )


def _figures(got: dict[str, list[Line]]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        k: [
            (ln.gpu_hours, ln.gpu_kwh, ln.host_kwh, ln.facility_kwh, ln.co2e_kg, ln.total_cost, ln.currency)
            for ln in v
        ]
        for k, v in got.items()
    }


def test_kept_lines_are_the_live_ones(conn: psycopg.Connection, computed: list[list[str]]) -> None:
    _fleet(conn)
    run(conn, "r2", 3600, None, {"n1": [6]}, site_name="s1")  # running: its window grows
    live = _lines(conn, kept=False)
    first = _lines(conn)
    assert computed == [["r", "r2"], ["r", "r2"]]
    again = _lines(conn)
    assert computed[-1] == ["r2"], "the ended run was computed again instead of read back"
    assert again == first == live
    assert all(ln.total_cost > 0 for ln in again["r"])
    kept = conn.execute("SELECT DISTINCT run_id FROM priced_pieces WHERE line = 'run'").fetchall()
    assert kept == [("r",)]


def test_a_period_holding_the_whole_run_reads_its_kept_lines_and_one_cutting_it_is_live(
    conn: psycopg.Connection, computed: list[list[str]]
) -> None:
    """A report over a period that holds the ended run asks what the run's page asks: the same key.  A
    period that cuts it asks another question each time, priced live and never stored."""
    _fleet(conn)
    run(conn, "r2", 3600, None, {"n1": [6]}, site_name="s1")
    whole = {"since": at(0), "until": at(8000)}
    assert _lines(conn, **whole) == _lines(conn, kept=False, **whole)
    computed.clear()
    assert _lines(conn) == _lines(conn, kept=False)
    assert computed == [["r2"], ["r", "r2"]], "the whole run's lines were priced again"
    stored = conn.execute("SELECT count(*) FROM priced_pieces").fetchone()
    cut = {"since": at(1000), "until": at(5000)}  # over by now, and cutting both runs
    computed.clear()
    assert _lines(conn, **cut) == _lines(conn, kept=False, **cut)
    assert _lines(conn, **cut) == _lines(conn, kept=False, **cut)
    assert computed == [["r", "r2"]] * 4
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == stored


def test_stale_answers_and_a_run_changed_since_it_was_loaded_are_not_kept(conn: psycopg.Connection) -> None:
    _fleet(conn)
    gpu_samples(conn, [(700.5, "n1", 0, 900.0, None)])  # queued, not yet rolled up: answered from samples
    assert _lines(conn)["r"][0].stale
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,)
    drain(conn)
    runs = load_runs(conn, ["r"])  # loaded before its end moves
    conn.execute('UPDATE runs SET "end" = %s WHERE run_id = %s', (at(3000), "r"))
    got = run_lines.run_lines(conn, runs, None, None, NOW, max_gap_s=60.0, source="auto")
    live = run_lines.run_lines(conn, runs, None, None, NOW, max_gap_s=60.0, source="auto", kept=False)
    assert got == live and got["r"][0].end == at(3000)
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,), (
        "lines of another window than the key's were kept"
    )
    # an allocation added since the caller loaded the run: its lines are priced over a node the caller's
    # run does not name, so no mark would watch it
    conn.execute('UPDATE runs SET "end" = %s WHERE run_id = %s', (at(7190.25), "r"))
    runs = load_runs(conn, ["r"])
    node(conn, "n9", 8, "s1")
    gpu_samples(conn, constant_power("n9", [0], 500.0, -60, 7260))
    drain(conn)
    conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES ('r', 'n9', 0)")
    got = run_lines.run_lines(conn, runs, None, None, NOW, max_gap_s=60.0, source="auto")
    assert got == run_lines.run_lines(conn, runs, None, None, NOW, max_gap_s=60.0, source="auto", kept=False)
    assert got["r"][0].gpu_count == 5
    assert conn.execute("SELECT count(*) FROM priced_pieces").fetchone() == (0,), (
        "lines over allocations the caller did not load were kept"
    )


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_input_is_read_live(conn: psycopg.Connection, change: str) -> None:
    _fleet(conn)
    carbon(conn, "Q", [(0, 50.0)])
    PREPARE.get(change, lambda c: None)(conn)
    before = _lines(conn)
    assert _lines(conn) == before
    assert conn.execute("SELECT count(*) FROM priced_pieces WHERE line = 'run'").fetchone() != (0,)
    CHANGES[change](conn)
    live = _lines(conn, kept=False)
    got = _lines(conn)
    assert got == live
    assert _figures(got) != _figures(before), "the change does not move the figures: it tests nothing"


def test_the_run_accounting_reads_its_kept_lines(conn: psycopg.Connection, computed: list[list[str]]) -> None:
    """account_runs, with its ledger, answers the same from kept lines; a read-only snapshot keeps them
    when it ends."""
    _fleet(conn)
    runs = load_runs(conn, ["r"])
    cold = account_runs(conn, runs, now=NOW)
    assert computed == [["r"]]
    assert account_runs(conn, runs, now=NOW) == cold
    assert computed == [["r"]]
