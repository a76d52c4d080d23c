"""Long counter intervals in rollups (issue 11, seen 8: two samples 13.9 days apart on 10 GPUs wrote
200,174 gpu_energy_1m rows).

A counted interval longer than the gap rule can only come from the energy counter, which bridges
gaps of any length by contract; it is now one ``gpu_energy_spans`` row, and rollup-based accounting
(the database's ``gpufleet_accounting``) adds its share of the hours and minutes it reads, split at the
tariff and carbon edges as raw accounting splits it: the ``account`` fixture checks raw, pending and rolled-up answers agree to 1e-9.
"""

from __future__ import annotations

import time
from itertools import pairwise

import psycopg

from gpufleet.accounting import fleet_accounting, run_accounting
from tests.accounting.builders import (
    KWH,
    approx,
    at,
    carbon,
    drain,
    gpu_samples,
    node,
    prices,
    run,
    site,
)
from tests.accounting.conftest import Account

DAY = 86400.0
GAP = 13.9 * DAY


def _rows(conn: psycopg.Connection) -> dict[str, int]:
    out = {}
    for t in ("gpu_energy_1m", "gpu_energy_1h", "gpu_energy_spans"):
        row = conn.execute(f"SELECT count(*) FROM {t}").fetchone()
        out[t] = int(row[0]) if row else -1
    return out


def test_two_samples_days_apart_write_a_row_per_gpu_not_per_minute(conn: psycopg.Connection) -> None:
    # the reproduction: 10 GPUs, two counter samples 13.9 days apart (about 1 KB on the wire)
    gpu_samples(conn, [(s, "n1", g, 300.0, 1e9 + 300.0 * s * 1000) for g in range(10) for s in (0.0, GAP)])
    t0 = time.perf_counter()
    drain(conn)
    took = time.perf_counter() - t0
    rows = _rows(conn)
    assert rows == {"gpu_energy_1m": 0, "gpu_energy_1h": 0, "gpu_energy_spans": 10}, rows
    assert took < 10
    spans = conn.execute("SELECT t0, t1, energy_j FROM gpu_energy_spans WHERE gpu = 3").fetchall()
    assert spans == [(at(0), at(GAP), 300.0 * GAP)]


def test_power_alone_does_not_bridge_the_gap_and_writes_nothing(conn: psycopg.Connection) -> None:
    gpu_samples(conn, [(s, "n1", g, 300.0, None) for g in range(10) for s in (0.0, GAP)])
    drain(conn)
    assert _rows(conn) == {"gpu_energy_1m": 0, "gpu_energy_1h": 0, "gpu_energy_spans": 0}


def _fleet_with_a_gap(conn: psycopg.Connection) -> None:
    """Node n1, GPU 0: samples every 10 s for 20 min, a counter gap of 3 days and 7 s, then 20 min
    again; GPU 1 the same without a counter (power only).  Carbon and prices change inside the gap,
    on and off the hour grid."""
    site(conn, "eu", price=0.2, gpu_hour=1.0, region="DE")
    node(conn, "n1", gpu_count=2, site_name="eu")
    carbon(conn, "DE", [(0, 300.0), (DAY + 1800.5, 100.0), (2 * DAY, 50.0), (2 * DAY + 61, 70.0)])
    prices(conn, "eu", [(0, 0.3), (DAY + 7200, 0.1), (2 * DAY + 90.25, 0.05)])
    before = [float(s) for s in range(0, 1201, 10)]
    after = [1200 + 3 * DAY + 7 + s for s in range(0, 1201, 10)]
    counter = 1e9
    rows = []
    last = 0.0
    for s in before + after:
        counter += 250.0 * (s - last) * 1000  # 250 W on average, also across the gap
        last = s
        rows.append((s, "n1", 0, 240.0, counter))
        rows.append((s, "n1", 1, 240.0, None))
    gpu_samples(conn, rows)


def test_accounting_across_a_long_counter_gap_matches_raw(conn: psycopg.Connection, account: Account) -> None:
    _fleet_with_a_gap(conn)
    # runs that start and end inside the gap, off the minute grid, and one covering it all
    run(conn, "inside", DAY + 33.3, 2 * DAY + 100.7, {"n1": [0]})
    run(conn, "whole", 0, 4 * DAY, {"n1": [1]})
    a = account("inside", now=at(5 * DAY))
    span_s = (2 * DAY + 100.7) - (DAY + 33.3)
    assert approx(a["gpu_kwh"], 250.0 * span_s / KWH, rel=1e-9)
    assert approx(a["coverage"], 1.0)
    w = account("whole", now=at(5 * DAY))  # power only: the gap is not bridged
    assert approx(w["coverage"], 2400 / (4 * DAY), rel=1e-9)
    assert _rows(conn)["gpu_energy_spans"] == 1


def test_fleet_totals_reconcile_with_a_long_gap(conn: psycopg.Connection) -> None:
    _fleet_with_a_gap(conn)
    run(conn, "inside", DAY + 33.3, 2 * DAY + 100.7, {"n1": [0]})
    lo, hi = at(DAY / 2), at(3 * DAY)
    raw = fleet_accounting(conn, lo, hi, group_by="run", now=at(5 * DAY), source="raw")
    drain(conn)
    rolled = fleet_accounting(conn, lo, hi, group_by="run", now=at(5 * DAY))
    assert rolled["source"] == "rollup"
    for block in ("runs", "unallocated", "total"):
        for k in ("gpu_kwh", "co2e_kg", "energy_cost", "coverage"):
            assert approx(rolled[block][k], raw[block][k], rel=1e-9, abs_=1e-12), (block, k)
    assert approx(
        rolled["runs"]["gpu_kwh"] + rolled["unallocated"]["gpu_kwh"], rolled["total"]["gpu_kwh"], rel=1e-9
    )
    assert rolled["total"]["gpu_kwh"] > 0


def test_a_late_sample_inside_the_gap_splits_the_span(conn: psycopg.Connection, account: Account) -> None:
    _fleet_with_a_gap(conn)
    run(conn, "inside", DAY + 33.3, 2 * DAY + 100.7, {"n1": [0]})
    drain(conn)
    first = run_accounting(conn, "inside", now=at(5 * DAY))
    # a spooled sample from inside the gap arrives late: the counter at that moment
    mid = 1.5 * DAY + 17.0
    counter = conn.execute(
        "SELECT energy_mj FROM gpu_samples WHERE gpu = 0 AND time = %s", (at(1200),)
    ).fetchone()
    assert counter is not None
    gpu_samples(conn, [(mid, "n1", 0, 240.0, counter[0] + 250.0 * (mid - 1200) * 1000)])
    a = account("inside", now=at(5 * DAY))
    assert approx(a["gpu_kwh"], first["gpu_kwh"], rel=1e-9)
    spans = conn.execute("SELECT t0, t1 FROM gpu_energy_spans ORDER BY t0").fetchall()
    assert spans == [(at(1200), at(mid)), (at(mid), at(1200 + 3 * DAY + 7))]


def test_minute_rows_of_a_long_interval_written_before_spans_are_not_counted_twice(
    conn: psycopg.Connection, account: Account
) -> None:
    # Rollups built with a gap rule wider than the gap stand for what earlier versions wrote: the
    # long interval spread over its minutes.  A later rebuild at its end must keep that form.
    # The long interval ends at 7230 s, inside the minute [7200, 7260) that the late sample's rebuild
    # starts from, so the rebuild reads it whole but rewrites only its last minute.
    rows = [(s, "n1", 0, 100.0, 1e9 + 100.0 * s * 1000) for s in (0.0, 10.0, 20.0, 7230.0)]
    gpu_samples(conn, rows)
    drain(conn, max_gap_s=1e9)
    assert _rows(conn)["gpu_energy_spans"] == 0
    gpu_samples(conn, [(7240.0, "n1", 0, 100.0, 1e9 + 100.0 * 7240 * 1000)])
    run(conn, "r", 0, 7300, {"n1": [0]})
    a = account("r", now=at(9000))
    assert approx(a["gpu_kwh"], 100.0 * 7240 / KWH, rel=1e-9)
    assert _rows(conn)["gpu_energy_spans"] == 0


def test_a_span_reaching_into_a_later_rebuild_is_kept(conn: psycopg.Connection, account: Account) -> None:
    # A span (10 s .. 7230 s) ends inside the minute that the next batch's rebuild starts from: the
    # rebuild reads it whole, must write it back as the span it was and not spread its last minute.
    gpu_samples(conn, [(s, "n1", 0, 100.0, 1e9 + 100.0 * s * 1000) for s in (0.0, 10.0, 7230.0)])
    drain(conn)
    assert _rows(conn)["gpu_energy_spans"] == 1
    gpu_samples(conn, [(7240.0, "n1", 0, 100.0, 1e9 + 100.0 * 7240 * 1000)])
    run(conn, "r", 0, 7300, {"n1": [0]})
    a = account("r", now=at(9000))
    assert approx(a["gpu_kwh"], 100.0 * 7240 / KWH, rel=1e-9)
    assert conn.execute("SELECT t0, t1 FROM gpu_energy_spans").fetchall() == [(at(10), at(7230))]


def test_price_and_carbon_changes_inside_the_gap_split_the_span(
    conn: psycopg.Connection, account: Account
) -> None:
    # A priced run inside the gap: the span's share of every hour and minute goes to the price and
    # carbon in force there (edges on the hour grid cut its hours, edges off it its minutes), as the
    # raw samples say; figures checked against the 250 W the counter shows across the gap.
    _fleet_with_a_gap(conn)
    lo, hi = DAY + 33.3, 2 * DAY + 100.7
    run(conn, "priced", lo, hi, {"n1": [0]}, site_name="eu")
    a = account("priced", now=at(5 * DAY))
    edges = [lo, DAY + 1800.5, DAY + 7200, 2 * DAY, 2 * DAY + 61, 2 * DAY + 90.25, hi]
    g_per_kwh = [300.0, 100.0, 100.0, 50.0, 70.0, 70.0]
    price = [0.3, 0.3, 0.1, 0.1, 0.1, 0.05]
    kwh = [250.0 * (b - t) / KWH for t, b in pairwise(edges)]
    assert approx(a["gpu_kwh"], sum(kwh), rel=1e-9)
    assert approx(a["co2e_kg"], sum(k * g / 1000.0 for k, g in zip(kwh, g_per_kwh, strict=True)), rel=1e-9)
    assert approx(a["energy_cost"], sum(k * p for k, p in zip(kwh, price, strict=True)), rel=1e-9)
    assert a["price_source"] == "time_of_use"
    # the fleet around it reconciles to the same figures, rolled up or raw
    raw = fleet_accounting(conn, at(DAY / 2), at(3 * DAY), group_by="run", now=at(5 * DAY), source="raw")
    rolled = fleet_accounting(conn, at(DAY / 2), at(3 * DAY), group_by="run", now=at(5 * DAY))
    assert rolled["source"] == "rollup"
    for block in ("runs", "unallocated", "total"):
        for k in ("gpu_kwh", "co2e_kg", "coverage"):
            assert approx(rolled[block][k], raw[block][k], rel=1e-9, abs_=1e-12), (block, k)
    assert approx(rolled["runs"]["co2e_kg"], a["co2e_kg"], rel=1e-9)
    # runs + unallocated (+ the GPU time no sample covers, GPU 1 in the gap) = the fleet
    for k in ("gpu_kwh", "co2e_kg"):
        assert approx(rolled["runs"][k] + rolled["unallocated"][k], rolled["total"][k], rel=1e-9), k
    dark = rolled["no_telemetry"]
    assert dark["gpu_hours"] > 0 and dark["gpu_kwh"] == 0
    assert approx(
        rolled["runs"]["gpu_hours"] + rolled["unallocated"]["gpu_hours"] + dark["gpu_hours"],
        rolled["total"]["gpu_hours"],
        rel=1e-9,
    )
