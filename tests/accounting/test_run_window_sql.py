"""The accounting SQL's run windows are the one rule of gpufleet.store.run_model, at every boundary.

``gpufleet_accounting`` (its ``run_w``) and ``gpufleet_ledger_pieces`` (its ``w``) restate in SQL which
runs a period reaches and the part of each they account: :meth:`Run.overlaps` and :meth:`Run.window`.
Every combination of a period's edges and ``now`` placed before, on and after a run's start and end
(a run with an end and one without) is asked of both functions and compared with the model: a
boundary written ``<=`` for ``<`` anywhere fails here.
"""

from __future__ import annotations

import itertools

import psycopg

from gpufleet.store.run_model import load_runs
from tests.accounting.builders import at, node, run
from tests.accounting.test_incident_cost import incident

#: Seconds of the grid: before the start (10), on it, inside, on the end (20), after it.
EDGES = (None, 5, 10, 15, 20, 25)
NOWS = (5, 10, 15, 20, 25)

_LINES = (
    "SELECT run_id, part_start, part_end FROM gpufleet_accounting(%s, %s, %s, %s, false, 60, 'raw', 'line') "
    "WHERE line = 'run'"
)
_PIECES = "SELECT run_id, min(lo), max(hi) FROM gpufleet_ledger_pieces(%s, %s, %s, %s) GROUP BY run_id"


def test_the_sql_windows_are_the_models(conn: psycopg.Connection) -> None:
    node(conn, "n1", 2, None)
    run(conn, "ended", 10, 20, {"n1": [0]})
    run(conn, "open", 10, None, {"n1": [1]})
    # an incident over all of each run's time: its pieces span exactly the run's accounted window
    for rid in ("ended", "open"):
        incident(conn, "hung_collective", 0, None, {}, run_id=rid, scope=rid)
    runs = load_runs(conn, ["ended", "open"])
    checked = 0
    for lo_s, hi_s, now_s in itertools.product(EDGES, EDGES, NOWS):
        if lo_s is not None and hi_s is not None and hi_s <= lo_s:
            continue
        lo, hi, now = (None if x is None else at(x) for x in (lo_s, hi_s, now_s))
        assert now is not None
        case = f"from={lo_s} to={hi_s} now={now_s}"
        for ids in (None, ["ended", "open"]):
            lines = {r[0]: (r[1], r[2]) for r in conn.execute(_LINES, (lo, hi, now, ids)).fetchall()}
            pieces = {r[0]: (r[1], r[2]) for r in conn.execute(_PIECES, (lo, hi, now, ids)).fetchall()}
            for r in runs:
                reached = ids is not None or r.overlaps(lo, hi)
                window = r.window(now, lo, hi)
                assert (r.run_id in lines) == reached, (case, ids, r.run_id, "reached")
                if reached:
                    assert lines[r.run_id] == window, (case, ids, r.run_id, lines[r.run_id], window)
                # pieces exist where the window holds time the incident (open until now) covers
                has_time = reached and window[0] < min(window[1], now)
                assert (r.run_id in pieces) == has_time, (case, ids, r.run_id, "pieces")
                if has_time:
                    assert pieces[r.run_id] == window, (case, ids, r.run_id, pieces[r.run_id], window)
                checked += 1
    assert checked == 21 * len(NOWS) * 2 * 2  # periods x nows x (selected by period, by id) x runs
