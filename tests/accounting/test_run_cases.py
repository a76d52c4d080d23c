"""Hand-computed runs: every number below is worked out on paper from the contract's definitions.

Each case is answered from raw samples, from pending data and from built
rollups (the ``account`` fixture checks that they agree).
"""

from __future__ import annotations

import psycopg
import pytest

from gpufleet.accounting import run_accounting
from gpufleet.store.runs import NotFound
from tests.accounting.builders import (
    KWH,
    approx,
    at,
    carbon,
    constant_power,
    gpu_samples,
    host_samples,
    node,
    prices,
    run,
    site,
)
from tests.accounting.conftest import Account


def test_constant_power_with_host_share(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "eu1", pue=1.2, price=0.1, gpu_hour=3.0, currency="EUR", carbon=400.0)
    node(conn, "n1", 8, "eu1")
    # starts and ends mid-interval and mid-minute: the straddling intervals count their share
    run(conn, "r1", 15, 3615, {"n1": [0, 1]}, site_name="eu1")
    gpu_samples(conn, constant_power("n1", range(8), 250.0, 0, 3700))
    host_samples(conn, [(s, "n1", 800.0) for s in range(0, 3701, 10)])
    a = account("r1", now=at(10_000))
    assert a["gpu_count"] == 2 and approx(a["gpu_hours"], 2.0)
    assert approx(a["gpu_kwh"], 2 * 250 * 3600 / KWH)  # 0.5
    assert approx(a["host_kwh"], 800 * 3600 * 2 / 8 / KWH)  # 0.2: 2 of 8 GPUs
    assert approx(a["it_kwh"], 0.7) and a["pue"] == 1.2 and approx(a["facility_kwh"], 0.84)
    assert approx(a["co2e_kg"], 0.84 * 0.4)
    # money as computed, not rounded to minor units (that is for CSV and the web view): 0.084 EUR of energy
    assert a["energy_cost"] == 0.084 and a["compute_cost"] == 6.0 and a["total_cost"] == 6.084
    assert a["currency"] == "EUR" and approx(a["coverage"], 1.0)
    assert (
        a["start"] == "2026-12-01T10:00:15Z" and a["end"] == "2026-12-01T11:00:15Z" and a["state"] == "ended"
    )


def test_interval_straddling_the_window_counts_its_share(conn: psycopg.Connection, account: Account) -> None:
    run(conn, "r", 15, 45, {"n1": [0]})
    gpu_samples(conn, [(0, "n1", 0, 5.0, 0.0), (60, "n1", 0, 5.0, 60_000_000.0)])  # counter: 1000 W
    a = account("r", now=at(100))
    assert approx(a["gpu_kwh"], 30_000 / KWH) and approx(a["coverage"], 1.0)


def test_counter_wins_and_a_reset_falls_back_to_power(conn: psycopg.Connection, account: Account) -> None:
    rows = []
    for s in range(0, 601, 10):
        e = 300.0 * s * 1000 if s < 300 else 300.0 * (s - 300) * 1000  # reset to 0 at 300 s
        rows.append((float(s), "n1", 0, 999.0, e))
    gpu_samples(conn, rows)
    run(conn, "r", 0, 600, {"n1": [0]})
    a = account("r", now=at(1000))
    # 59 intervals by the counter at 300 W, the reset interval (290, 300] by power at 999 W
    assert approx(a["gpu_kwh"], (59 * 3000 + 999 * 10) / KWH) and approx(a["coverage"], 1.0)


def test_power_does_not_bridge_a_long_gap_but_the_counter_does(
    conn: psycopg.Connection, account: Account
) -> None:
    times = [*range(0, 301, 10), *range(400, 601, 10)]  # a 100 s hole after 300 s
    for n in ("n1", "n2"):  # n2 is a copy of n1, for the run holding both kinds (one run per GPU)
        gpu_samples(conn, [(float(s), n, 0, 100.0, None) for s in times])
        gpu_samples(conn, [(float(s), n, 1, 999.0, 100.0 * s * 1000) for s in times])
    run(conn, "power", 0, 600, {"n1": [0]})
    run(conn, "counter", 0, 600, {"n1": [1]})
    run(conn, "both", 0, 600, {"n2": [0, 1]})
    p = account("power", now=at(1000))
    assert approx(p["gpu_kwh"], 100 * 500 / KWH) and approx(p["coverage"], 500 / 600)
    c = account("counter", now=at(1000))
    assert approx(c["gpu_kwh"], 100 * 600 / KWH) and approx(c["coverage"], 1.0)
    b = account("both", now=at(1000))
    assert approx(b["gpu_kwh"], 110_000 / KWH) and approx(b["coverage"], 1100 / 1200)


def test_max_gap_s_is_a_parameter(conn: psycopg.Connection, account: Account) -> None:
    gpu_samples(conn, [(float(s), "n1", 0, 100.0, None) for s in range(0, 601, 120)])
    run(conn, "r", 0, 600, {"n1": [0]})
    assert run_accounting(conn, "r", now=at(1000), source="raw")["coverage"] == 0.0
    a = account("r", now=at(1000), max_gap_s=120.0)
    assert approx(a["gpu_kwh"], 100 * 600 / KWH) and approx(a["coverage"], 1.0) and a["max_gap_s"] == 120.0


def test_carbon_series_changing_mid_run(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "de", region="DE")
    carbon(conn, "DE", [(1800, 100.0), (5405, 500.0)])  # the second step lands mid-interval, mid-minute
    run(conn, "r", 0, 7200, {"n1": [0]}, site_name="de")
    gpu_samples(conn, constant_power("n1", [0], 360.0, 0, 7200))
    a = account("r", now=at(10_000), segments=True)
    assert approx(a["gpu_kwh"], 0.72) and a["carbon_source"] == "series"
    # before the series' first point its first value is carried back (the site has no constant)
    assert approx(a["co2e_kg"], 5405 * 360 / KWH * 0.100 + 1795 * 360 / KWH * 0.500)
    segs = a["segments"]
    assert [s["start"] for s in segs] == [
        "2026-12-01T10:00:00Z",
        "2026-12-01T10:30:00Z",
        "2026-12-01T11:30:05Z",
    ]
    assert [s["g_co2e_per_kwh"] for s in segs] == [100.0, 100.0, 500.0]
    assert approx(sum(s["facility_kwh"] for s in segs), a["facility_kwh"])


def test_site_constant_applies_before_the_first_carbon_point(
    conn: psycopg.Connection, account: Account
) -> None:
    site(conn, "de", region="DE", carbon=50.0)
    carbon(conn, "DE", [(1800, 100.0), (5405, 500.0)])
    run(conn, "r", 0, 7200, {"n1": [0]}, site_name="de")
    gpu_samples(conn, constant_power("n1", [0], 360.0, 0, 7200))
    a = account("r", now=at(10_000))
    assert approx(a["co2e_kg"], 0.18 * 0.05 + 3605 * 360 / KWH * 0.1 + 1795 * 360 / KWH * 0.5)


def test_two_sites_with_different_pue_and_prices(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "a", pue=1.1, price=0.1, gpu_hour=2.0, currency="USD", carbon=200.0)
    site(conn, "b", pue=1.5, price=0.3, gpu_hour=4.0, currency="EUR", carbon=600.0)
    node(conn, "na", 8, "a")
    node(conn, "nb", 8, "b")
    gpu_samples(conn, constant_power("na", [0], 500.0, 0, 3600) + constant_power("nb", [0], 500.0, 0, 3600))
    run(conn, "ra", 0, 3600, {"na": [0]}, site_name="a")
    run(conn, "rb", 0, 3600, {"nb": [0]}, site_name="b")
    a = account("ra", now=at(9999))
    b = account("rb", now=at(9999))
    assert (
        approx(a["facility_kwh"], 0.55)
        and approx(a["co2e_kg"], 0.11)
        and approx(a["total_cost"], 0.055 + 2.0)
    )
    assert a["currency"] == "USD"
    assert (
        approx(b["facility_kwh"], 0.75)
        and approx(b["co2e_kg"], 0.45)
        and approx(b["total_cost"], 0.225 + 4.0)
    )
    assert b["currency"] == "EUR"


def test_run_spanning_a_price_change(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "tou", price=0.10, currency="EUR")
    prices(conn, "tou", [(1805, 0.30)])  # before the first point: the flat price
    run(conn, "r", 0, 3600, {"n1": [0]}, site_name="tou")
    gpu_samples(conn, constant_power("n1", [0], 1000.0, 0, 3600))
    a = account("r", now=at(9999))
    assert a["price_source"] == "time_of_use"
    assert approx(a["energy_cost"], 1805 * 1000 / KWH * 0.10 + 1795 * 1000 / KWH * 0.30)
    prices(conn, "tou", [(-3600, 0.20)])  # a point before the run now sets its first part
    a = account("r", now=at(9999))
    assert approx(a["energy_cost"], 1805 * 1000 / KWH * 0.20 + 1795 * 1000 / KWH * 0.30)
    assert a["co2e_kg"] is None  # the site has no carbon intensity at all: unknown, not zero


def test_run_without_telemetry(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "s", pue=1.3, price=0.2, gpu_hour=1.5, carbon=300.0)
    run(conn, "r", 0, 3600, {"n1": [0, 1, 2, 3]}, site_name="s")
    a = account("r", now=at(9999))
    assert a["coverage"] == 0.0 and a["gpu_kwh"] == 0.0 and a["host_kwh"] == 0.0 and a["facility_kwh"] == 0.0
    assert a["co2e_kg"] == 0.0 and a["energy_cost"] == 0.0
    assert approx(a["gpu_hours"], 4.0) and approx(a["compute_cost"], 6.0)
    eff = a["efficiency"]
    assert eff["tokens_per_kwh"] is None and eff["mfu"] is None and eff["goodput"] == 1.0


def test_run_without_allocations_or_site(conn: psycopg.Connection, account: Account) -> None:
    run(conn, "r", 0, 3600, {})
    a = account("r", now=at(9999))
    assert a["gpu_count"] == 0 and a["gpu_hours"] == 0.0 and a["coverage"] == 0.0
    assert a["pue"] == 1.0 and a["energy_cost"] == 0.0 and a["compute_cost"] == 0.0
    assert a["currency"] is None and a["co2e_kg"] is None


def test_still_running_run_is_accounted_up_to_now(conn: psycopg.Connection, account: Account) -> None:
    gpu_samples(conn, constant_power("n1", [0], 200.0, 0, 1200))
    gpu_samples(conn, constant_power("n2", [0], 200.0, 0, 1200))  # a copy: one run per GPU
    run(conn, "open", 0, None, {"n1": [0]})
    run(conn, "later", 0, 99_999, {"n2": [0]})  # an end in the future: running too
    for rid in ("open", "later"):
        a = account(rid, now=at(1205))
        assert a["state"] == "running" and a["window_end"] == "2026-12-01T10:20:05Z"
        assert approx(a["gpu_hours"], 1205 / 3600)
        assert approx(a["gpu_kwh"], 200 * 1200 / KWH) and approx(a["coverage"], 1200 / 1205)
    assert run_accounting(conn, "open", now=at(1205))["end"] is None


def test_mig_rows_are_not_counted_twice(conn: psycopg.Connection, account: Account) -> None:
    gpu_samples(conn, constant_power("n1", [0], 300.0, 0, 600))
    for mig in (1, 2):
        gpu_samples(conn, constant_power("n1", [0], 150.0, 0, 600, counter=True), mig=mig)
    run(conn, "r", 0, 600, {"n1": [0]})
    a = account("r", now=at(1000))
    assert approx(a["gpu_kwh"], 300 * 600 / KWH) and approx(a["coverage"], 1.0)


def test_unknown_run(conn: psycopg.Connection) -> None:
    with pytest.raises(NotFound):
        run_accounting(conn, "nope")


def test_period_clipping(conn: psycopg.Connection, account: Account) -> None:
    site(conn, "s", gpu_hour=1.0)
    gpu_samples(conn, constant_power("n1", [0], 100.0, 0, 7200))
    run(conn, "r", 0, 7200, {"n1": [0]}, site_name="s")
    a = account("r", now=at(9999), since=at(1800), until=at(3000))
    assert a["start"] == "2026-12-01T10:00:00Z" and a["window_start"] == "2026-12-01T10:30:00Z"
    assert approx(a["gpu_hours"], 1200 / 3600) and approx(a["gpu_kwh"], 100 * 1200 / KWH)


def test_a_vanishing_rate_is_priced_as_zero_not_an_error(conn: psycopg.Connection, account: Account) -> None:
    # float products that underflow to zero are an error in PostgreSQL: one stored intensity or price of
    # 5e-324 must not make every report over its site fail
    site(conn, "de", region="DE", price=5e-324, gpu_hour=5e-324)
    carbon(conn, "DE", [(0, 5e-324), (1800, 100.0)])
    run(conn, "r", 0, 3600, {"n1": [0]}, site_name="de")
    gpu_samples(conn, constant_power("n1", [0], 0.001, 0, 3600, step_s=0.5))
    a = account("r", now=at(10_000))
    assert approx(a["co2e_kg"], 1800 * 0.001 / KWH * 0.100, abs_=1e-15)
    assert a["energy_cost"] == 0 and a["compute_cost"] == 0
