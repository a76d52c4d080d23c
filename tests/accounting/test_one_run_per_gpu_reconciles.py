"""Runs + unallocated = fleet total after every step of random run / allocation operations (issue 15 item 1).

Random sequences of registrations, added allocations, end changes (extending, shortening, reopening)
go through the store functions the API and CLI use; the database refuses those that would put a GPU
in two runs at once.  After every operation, accepted or refused, the fleet view over the whole
period must reconcile: GPU-hours and GPU kWh of the runs plus the unallocated part equal the fleet
total.  The last test shows the check has teeth: with the database's rule switched off, one
overlapping allocation breaks the same equality.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.accounting import fleet_accounting
from gpufleet.store import runs as store
from tests.accounting.builders import T0, at, constant_power, gpu_samples, node
from tests.conftest import truncate_all

NODES = {"n1": 2, "n2": 2}
HORIZON_S = 12 * 3600
POWER_W = 100.0
SEQUENCES = 50

op_create = st.tuples(st.just("create"), st.sampled_from(sorted(NODES)), st.sets(st.integers(0, 1), min_size=1),
                      st.integers(0, 300), st.one_of(st.none(), st.integers(1, 300)))
op_alloc = st.tuples(st.just("alloc"), st.sampled_from(sorted(NODES)), st.integers(0, 1))
op_end = st.tuples(st.just("end"), st.one_of(st.none(), st.integers(0, 700)))
ops = st.builds(lambda first, rest: [first, *rest], op_create,
                st.lists(st.one_of(op_create, op_create, op_alloc, op_end), min_size=1, max_size=9))


def _fill(url: str, conn: psycopg.Connection) -> None:
    truncate_all(url)
    for n, count in NODES.items():
        node(conn, n, count)
        gpu_samples(conn, constant_power(n, range(count), POWER_W, 0, HORIZON_S, step_s=60.0), queue=False)


def _reconciles(conn: psycopg.Connection) -> dict[str, Any]:
    body = fleet_accounting(conn, T0, T0 + timedelta(seconds=HORIZON_S), now=at(HORIZON_S), source="raw")
    runs, idle, total = body["runs"], body["unallocated"], body["total"]
    assert abs(total["gpu_hours"] - 4 * HORIZON_S / 3600) < 1e-9, total
    for k in ("gpu_hours", "gpu_kwh"):
        assert abs(runs[k] + idle[k] - total[k]) <= 1e-9 * max(1.0, total[k]), (k, runs[k], idle[k], total[k])
    return body


def _apply(conn: psycopg.Connection, op: tuple[Any, ...], created: list[str]) -> None:
    try:
        if op[0] == "create":
            _, n, gpus, start_min, dur_min = op
            run_id = f"r{len(created)}"
            store.create_run(conn, {"run_id": run_id, "start": at(start_min * 60),
                                    "end": None if dur_min is None else at((start_min + dur_min) * 60),
                                    "allocations": [{"node": n, "gpus": sorted(gpus)}]})
            created.append(run_id)
        elif op[0] == "alloc" and created:
            store.update_run(conn, created[-1], {"allocations": [{"node": op[1], "gpus": [op[2]]}]})
        elif op[0] == "end" and created:
            run = store.get_run(conn, created[-1])
            end = None if op[1] is None else max(run["start"], at(op[1] * 60))
            store.update_run(conn, created[-1], {"end": end})
    except store.Conflict:
        pass  # refused: nothing was written, and the fleet must still reconcile


@settings(max_examples=SEQUENCES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seq=ops)
def test_runs_plus_unallocated_is_the_total_after_every_operation(db: str, conn: psycopg.Connection,
                                                                 seq: list[tuple[Any, ...]]) -> None:
    _fill(db, conn)
    created: list[str] = []
    for op in seq:
        _apply(conn, op, created)
        _reconciles(conn)
    # and no GPU is held by two runs at once, whatever was attempted
    overlaps = conn.execute(
        "SELECT count(*) FROM run_allocations a JOIN runs ra USING (run_id) JOIN run_allocations b "
        "ON b.node = a.node AND b.gpu = a.gpu AND b.run_id > a.run_id JOIN runs rb ON rb.run_id = b.run_id "
        "WHERE tstzrange(ra.start, ra.\"end\") && tstzrange(rb.start, rb.\"end\")").fetchone()
    assert overlaps == (0,)


def test_the_equality_fails_when_a_gpu_is_in_two_runs(db: str, conn: psycopg.Connection) -> None:
    """Without the database's rule, the issue's double billing comes back and the check sees it."""
    _fill(db, conn)
    store.create_run(conn, {"run_id": "demo-pretrain", "start": at(0), "allocations": [{"node": "n1", "gpus": [0]}]})
    _reconciles(conn)
    conn.execute("ALTER TABLE run_allocations DISABLE TRIGGER run_allocations_one_run_per_gpu")
    try:
        store.create_run(conn, {"run_id": "nc-7", "start": at(3600), "allocations": [{"node": "n1", "gpus": [0]}]})
        body = fleet_accounting(conn, T0, T0 + timedelta(seconds=HORIZON_S), now=at(HORIZON_S), source="raw")
        excess = body["runs"]["gpu_hours"] + body["unallocated"]["gpu_hours"] - body["total"]["gpu_hours"]
        assert abs(excess - (HORIZON_S - 3600) / 3600) < 1e-9  # exactly nc-7's hours, billed twice
    finally:
        conn.execute("DELETE FROM run_allocations WHERE run_id = 'nc-7'")
        conn.execute("ALTER TABLE run_allocations ENABLE TRIGGER run_allocations_one_run_per_gpu")
