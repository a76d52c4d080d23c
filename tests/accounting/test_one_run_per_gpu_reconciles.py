"""Runs + unallocated = fleet total after every step of random run / allocation operations (issue 15 item 1).

Random sequences of registrations, added allocations, end changes (extending, shortening, reopening)
go through the store functions the API and CLI use; the database refuses those that would put a GPU
in two runs at once.  After every operation, accepted or refused, the fleet view over the whole
period must reconcile: GPU-hours and GPU kWh of the runs plus the unallocated part equal the fleet
total.  The last test shows the check has teeth: with the database's rule switched off, one
overlapping allocation breaks the same equality.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import psycopg
import pytest
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

op_create = st.tuples(
    st.just("create"),
    st.sampled_from(sorted(NODES)),
    st.sets(st.integers(0, 1), min_size=1),
    st.integers(0, 300),
    st.one_of(st.none(), st.integers(1, 300)),
)
op_alloc = st.tuples(st.just("alloc"), st.sampled_from(sorted(NODES)), st.integers(0, 1))
op_end = st.tuples(st.just("end"), st.one_of(st.none(), st.integers(0, 700)))
ops = st.builds(
    lambda first, rest: [first, *rest],
    op_create,
    st.lists(st.one_of(op_create, op_create, op_alloc, op_end), min_size=1, max_size=9),
)


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
            store.create_run(
                conn,
                {
                    "run_id": run_id,
                    "start": at(start_min * 60),
                    "end": None if dur_min is None else at((start_min + dur_min) * 60),
                    "allocations": [{"node": n, "gpus": sorted(gpus)}],
                },
            )
            created.append(run_id)
        elif op[0] == "alloc" and created:
            store.update_run(conn, created[-1], {"allocations": [{"node": op[1], "gpus": [op[2]]}]})
        elif op[0] == "end" and created:
            run = store.get_run(conn, created[-1])
            end = None if op[1] is None else max(run["start"], at(op[1] * 60))
            store.update_run(conn, created[-1], {"end": end})
    except store.Conflict:
        pass  # refused: nothing was written, and the fleet must still reconcile


@settings(
    max_examples=SEQUENCES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seq=ops)
def test_runs_plus_unallocated_is_the_total_after_every_operation(
    db: str, conn: psycopg.Connection, seq: list[tuple[Any, ...]]
) -> None:
    _fill(db, conn)
    created: list[str] = []
    for op in seq:
        _apply(conn, op, created)
        _reconciles(conn)
    # and no GPU is held by two runs at once, whatever was attempted
    overlaps = conn.execute(
        "SELECT count(*) FROM run_allocations a JOIN runs ra USING (run_id) JOIN run_allocations b "
        "ON b.node = a.node AND b.gpu = a.gpu AND b.run_id > a.run_id JOIN runs rb ON rb.run_id = b.run_id "
        'WHERE tstzrange(ra.start, ra."end") && tstzrange(rb.start, rb."end")'
    ).fetchone()
    assert overlaps == (0,)


def test_the_equality_fails_when_a_gpu_is_in_two_runs(db: str, conn: psycopg.Connection) -> None:
    """Without the database's rule, the issue's double billing comes back and the check sees it."""
    _fill(db, conn)
    store.create_run(
        conn, {"run_id": "demo-pretrain", "start": at(0), "allocations": [{"node": "n1", "gpus": [0]}]}
    )
    _reconciles(conn)
    conn.execute("ALTER TABLE run_allocations DISABLE TRIGGER run_allocations_one_run_per_gpu")
    try:
        store.create_run(
            conn, {"run_id": "nc-7", "start": at(3600), "allocations": [{"node": "n1", "gpus": [0]}]}
        )
        body = fleet_accounting(conn, T0, T0 + timedelta(seconds=HORIZON_S), now=at(HORIZON_S), source="raw")
        excess = body["runs"]["gpu_hours"] + body["unallocated"]["gpu_hours"] - body["total"]["gpu_hours"]
        assert abs(excess - (HORIZON_S - 3600) / 3600) < 1e-9  # exactly nc-7's hours, billed twice
    finally:
        conn.execute("DELETE FROM run_allocations WHERE run_id = 'nc-7'")
        conn.execute("ALTER TABLE run_allocations ENABLE TRIGGER run_allocations_one_run_per_gpu")


# ---------------------------------------------------------------- every field, every operation (issue 15 item 1)

from hypothesis import event  # noqa: E402

from gpufleet.collector import rollup  # noqa: E402
from gpufleet.db.policies import backend_of  # noqa: E402
from gpufleet.store import sites as site_store  # noqa: E402
from tests.accounting.builders import carbon, host_samples, site  # noqa: E402
from tests.independent import Fleet  # noqa: E402

SPAN_S = 2 * 3600
MODELS = {"n1": "NVIDIA H100 80GB HBM3", "n2": "NVIDIA A100-SXM4-80GB"}
FULL_SEQUENCES = int(os.environ.get("GPUFLEET_RECONCILE_SEQUENCES", "40"))

sharing_st = st.one_of(
    st.just({"sharing": "exclusive"}),
    st.sampled_from([0.25, 0.5, 0.75]).map(lambda s: {"sharing": "time_slice", "share": s}),
    st.sampled_from([0.3, 0.5]).map(lambda s: {"sharing": "mps", "share": s}),
    st.tuples(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), st.integers(0, 2)).map(
        lambda p: {"sharing": "mig", "mig_profile": p[0], "mig_instance": p[1]}
    ),
)
minute = st.integers(0, SPAN_S // 60)
f_create = st.tuples(
    st.just("create"),
    st.sampled_from(["n1", "n2"]),
    st.sets(st.integers(0, 1), min_size=1),
    minute,
    st.one_of(st.none(), st.integers(1, 120)),
    sharing_st,
    st.sampled_from(["s1", "s2", None]),
)
f_alloc = st.tuples(st.just("alloc"), st.sampled_from(["n1", "n2"]), st.integers(0, 1), sharing_st)
f_end = st.tuples(st.just("end"), st.one_of(st.none(), minute))
f_site = st.tuples(
    st.just("site"),
    st.sampled_from(["s1", "s2"]),
    st.sampled_from(
        [
            ("pue", 1.1),
            ("pue", 1.6),
            ("price_per_kwh", 0.3),
            ("price_per_kwh", 0.0),
            ("gpu_hour_price", 4.0),
            ("carbon_region", "R2"),
            ("carbon_region", None),
            ("carbon_g_per_kwh", 150.0),
            ("carbon_g_per_kwh", None),
            ("H100", 5.5),
            ("H100", None),
        ]
    ),
    st.one_of(st.none(), minute),
)
f_price = st.tuples(
    st.just("series"),
    st.sampled_from(["s1", "s2"]),
    st.sampled_from(["price_per_kwh", "pue"]),
    st.lists(st.tuples(minute, st.sampled_from([1.05, 1.2, 1.45])), min_size=1, max_size=3),
)
f_ingest = st.tuples(
    st.just("ingest"),
    st.sampled_from(["n1", "n2"]),
    minute,
    st.integers(1, 60),
    st.sampled_from([30.0, 45.0, 90.0]),
    st.booleans(),
    st.floats(80, 700),
)
f_drain = st.just(("drain",))
f_node = st.tuples(st.just("node_site"), st.sampled_from(["s1", "s2", None]))
full_ops = st.builds(
    lambda first, rest: [first, *rest],
    f_create,
    st.lists(
        st.one_of(f_create, f_alloc, f_end, f_site, f_price, f_ingest, f_ingest, f_drain, f_node),
        min_size=1,
        max_size=10,
    ),
)


def _fill_full(url: str, conn: psycopg.Connection) -> None:
    truncate_all(url)
    site(conn, "s1", pue=1.25, price=0.2, gpu_hour=2.0, currency="EUR", region="R1", carbon=300.0)
    site(conn, "s2", pue=1.4, price=0.1, gpu_hour=1.5, currency="USD", carbon=500.0)
    carbon(conn, "R1", [(600.0, 250.0), (3627.5, 410.0)])
    carbon(conn, "R2", [(-3600.0, 90.0), (4000.0, 120.0)])
    for n, s in (("n1", "s1"), ("n2", None)):
        node(conn, n, 2, s, facts={"gpu_model": MODELS[n]})
    gpu_samples(conn, constant_power("n1", [0, 1], 300.0, 0, 3600, step_s=30.0, counter=True))
    host_samples(conn, [(t, "n1", 600.0) for t in range(0, 3601, 30)])


def _full_apply(conn: psycopg.Connection, op: tuple[Any, ...], created: list[str]) -> None:
    kind = op[0]
    try:
        if kind == "create":
            _, n, gpus, start_min, dur_min, share, site_name = op
            run_id = f"r{len(created)}"
            store.create_run(
                conn,
                {
                    "run_id": run_id,
                    "site": site_name,
                    "start": at(start_min * 60),
                    "end": None if dur_min is None else at((start_min + dur_min) * 60),
                    "allocations": [{"node": n, "gpus": sorted(gpus), **share}],
                },
            )
            created.append(run_id)
        elif kind == "alloc" and created:
            store.update_run(conn, created[-1], {"allocations": [{"node": op[1], "gpus": [op[2]], **op[3]}]})
        elif kind == "end" and created:
            run_row = store.get_run(conn, created[-1])
            end = None if op[1] is None else max(run_row["start"], at(op[1] * 60))
            store.update_run(conn, created[-1], {"end": end})
        elif kind == "site":
            _, s, (name, value), from_min = op
            when = None if from_min is None else at(from_min * 60)
            if name == "H100":
                site_store.patch_site(
                    conn, s, {}, gpu_hour_prices={"H100": value}, valid_from=when, now=at(SPAN_S)
                )
            else:
                site_store.patch_site(conn, s, {name: value}, valid_from=when, now=at(SPAN_S))
        elif kind == "series":
            _, s, name, points = op
            value = (lambda v: v) if name == "pue" else (lambda v: round(v - 1.0, 2))
            site_store.set_series(conn, s, name, [(at(m * 60), value(v)) for m, v in dict(points).items()])
        elif kind == "ingest":
            _, n, start_min, dur_min, step, counter, power = op
            t0, t1 = start_min * 60.0 + 7.3, min(start_min + dur_min, SPAN_S // 60) * 60.0
            if t1 > t0:
                rows = constant_power(n, [0, 1], power, t0, t1, step_s=step, counter=counter)
                # the re-sent span replaces what was stored over it, to its last sample: the step can carry
                # that past t1, where a kept sample of the same instant would otherwise stand beside it
                conn.execute(
                    "DELETE FROM gpu_samples WHERE node = %s AND time >= %s AND time <= %s",
                    (n, at(t0), at(max(t1, max(r[0] for r in rows)))),
                )
                gpu_samples(conn, rows)
                hosts = [(t0 + k * step, n, 400.0 + power / 10) for k in range(int((t1 - t0) // step))]
                if hosts:
                    conn.execute(
                        "DELETE FROM host_samples WHERE node = %s AND time >= %s AND time <= %s",
                        (n, at(t0), at(hosts[-1][0])),
                    )
                host_samples(conn, hosts)
        elif kind == "drain":
            rollup.drain(conn, 60.0, plain_stats=backend_of(conn) != "timescaledb")
        elif kind == "node_site":
            conn.execute("UPDATE nodes SET site = %s WHERE node = 'n2'", (op[1],))
    except (store.Conflict, store.Invalid):
        pass  # refused: nothing was written, and the fleet must still reconcile


def _within(a: float, b: float, lines: int, places: float = 1e-9) -> bool:
    """Equal but for the rounding of ``lines`` lines (each by half of ``places``) and float noise."""
    return abs(a - b) <= lines * places / 2 + 1e-9 * max(abs(a), abs(b)) + 1e-12


def _check_everything(conn: psycopg.Connection, created: list[str]) -> None:
    now = at(SPAN_S)
    lo, hi = T0, T0 + timedelta(seconds=SPAN_S)
    body = fleet_accounting(conn, lo, hi, now=now, group_by="run")
    runs, idle, dark, total = body["runs"], body["unallocated"], body["no_telemetry"], body["total"]
    ref = Fleet(conn)
    indep = ref.fleet(lo, hi, now)
    n = runs["runs"] + 2 * len(body["groups"]) + 6  # lines whose rounding can add up
    # GPU-hours: the runs, the time no run held (with and without telemetry) and the fleet
    assert _within(runs["gpu_hours"] + idle["gpu_hours"] + dark["gpu_hours"], total["gpu_hours"], n)
    assert _within(total["gpu_hours"], indep.gpu_s / 3600.0, n)
    # energy, facility energy and CO2e: runs + unallocated = the fleet measured whole = the independent sum
    for key, ref_value in (
        ("gpu_kwh", indep.gpu_kwh),
        ("host_kwh", indep.host_kwh),
        ("facility_kwh", indep.facility_kwh),
        ("co2e_kg", indep.co2e_kg),
    ):
        assert _within(runs[key] + idle[key], total[key], n), (key, runs[key], idle[key], total[key])
        assert abs(total[key] - ref_value) <= 1e-6 * abs(ref_value) + n * 1e-9, (key, total[key], ref_value)
    # cost, per currency: energy of every share at the site that held it, compute of every run
    expect: dict[str, float] = {}
    for s, cost in indep.by_site_energy_cost.items():
        if s is not None:
            expect[ref.currency[s]] = expect.get(ref.currency[s], 0.0) + cost
    for r in created:
        f = ref.run(r, now, lo, hi)
        cur = ref.currency.get(ref.runs[r]["site"])
        if cur is not None:
            expect[cur] = expect.get(cur, 0.0) + f.compute_cost
    got = {c: v["total_cost"] for c, v in total["costs_by_currency"].items()}
    for cur in set(expect) | set(got):  # money as computed (to 1e-9 per line), not rounded to cents
        want = expect.get(cur, 0.0)
        assert abs(got.get(cur, 0.0) - want) <= 1e-6 * abs(want) + n * 1e-9, (cur, got, expect)
    # and every run on its own, as the contract defines it
    for run_id in created:
        a = fleet_run_body(body, run_id)
        if a is None:
            continue
        f = ref.run(run_id, now, lo, hi)
        for key, value in (
            ("gpu_hours", f.gpu_s / 3600.0),
            ("gpu_kwh", f.gpu_kwh),
            ("host_kwh", f.host_kwh),
            ("facility_kwh", f.facility_kwh),
        ):
            assert abs(a[key] - value) <= 1e-6 * abs(value) + 2e-9, (run_id, key, a[key], value)
        for key, value in (("energy_cost", f.energy_cost), ("compute_cost", f.compute_cost)):
            assert abs(a[key] - value) <= 1e-6 * abs(value) + 2e-9, (run_id, key, a[key], value)


def fleet_run_body(body: dict[str, Any], run_id: str) -> dict[str, Any] | None:
    """The run's group in a fleet view grouped by run."""
    return next((g for g in body["groups"] if g["key"] == run_id), None)


@settings(
    max_examples=FULL_SEQUENCES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seq=full_ops)
def test_every_field_reconciles_after_every_operation(
    db: str, conn: psycopg.Connection, seq: list[tuple[Any, ...]]
) -> None:
    """Runs (whole and shared GPUs), site settings from a time, price and PUE series, node sites and
    ingest in any order: after each, GPU-hours, GPU kWh, host kWh, facility kWh, CO2e and cost of the
    runs plus the unallocated part equal the fleet's, which equal an independent computation."""
    _fill_full(db, conn)
    created: list[str] = []
    for op in seq:
        _full_apply(conn, op, created)
        _check_everything(conn, created)
    event(f"operations per sequence: {len(seq)}")


def test_the_full_check_fails_when_a_gpu_is_shared_beyond_its_whole(
    db: str, conn: psycopg.Connection
) -> None:
    """The field-by-field check has teeth: with the database's rule off, shares of 0.75 + 0.75 on one GPU
    bill half a GPU twice and the check sees it."""
    _fill_full(db, conn)
    created: list[str] = []
    _full_apply(conn, ("create", "n1", {0}, 0, 60, {"sharing": "time_slice", "share": 0.75}, "s1"), created)
    _check_everything(conn, created)
    conn.execute("ALTER TABLE run_allocations DISABLE TRIGGER run_allocations_one_run_per_gpu")
    try:
        _full_apply(
            conn, ("create", "n1", {0}, 0, 60, {"sharing": "time_slice", "share": 0.75}, "s1"), created
        )
        assert len(created) == 2
        with pytest.raises(AssertionError):
            _check_everything(conn, created)
    finally:
        conn.execute("DELETE FROM run_allocations WHERE run_id = 'r1'")
        conn.execute("ALTER TABLE run_allocations ENABLE TRIGGER run_allocations_one_run_per_gpu")
