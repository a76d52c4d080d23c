"""Fleet view: runs + unallocated = fleet total, by three independent computations."""

from __future__ import annotations

import math

import psycopg
import pytest

from gpufleet.accounting import fleet_accounting, runs_report
from tests.accounting.builders import at, drain, gpu_samples, host_samples, node, run, site


def fleet(conn: psycopg.Connection) -> None:
    site(conn, "s1", pue=1.2, price=0.1, gpu_hour=2.0, currency="USD", carbon=300.0)
    site(conn, "s2", pue=1.4, price=0.2, gpu_hour=3.0, currency="EUR", carbon=100.0)
    for n, count, s in (("n1", 4, "s1"), ("n2", 4, "s1"), ("n3", 2, "s2")):
        node(conn, n, count, s)
        rows = []
        for g in range(count):
            for k in range(0, 361):
                t = k * 10.0 + 0.3 * g
                if n == "n2" and g == 1 and 1000 < t < 1300:
                    continue  # a hole longer than max_gap_s
                p = 100.0 + 20 * g + 50 * math.sin(t / 300.0)
                rows.append((t, n, g, p, None if g % 2 else 1e6 * t * 100 + 1e9))
        gpu_samples(conn, rows)
        host_samples(conn, [(s_ * 15.0, n, 300.0 + s_ % 7) for s_ in range(0, 241)])
    run(conn, "rA", 100, 2000.5, {"n1": [0, 1], "n2": [0]}, site_name="s1", team="lm")
    run(conn, "rB", 1500, 3000, {"n1": [2, 3]}, site_name="s1", team="vision")
    run(conn, "rC", 0, None, {"n3": [0]}, site_name="s2", team="lm")
    run(conn, "rD", 5000, 6000, {"n1": [0]}, site_name="s1", team="lm")


def close(a: float, b: float, rel: float = 1e-3) -> bool:
    return abs(a - b) <= rel * abs(b) + 1e-12


@pytest.mark.parametrize("source", ["raw", "rollup"])
def test_runs_plus_unallocated_is_the_fleet_total(conn: psycopg.Connection, source: str) -> None:
    fleet(conn)
    if source == "rollup":
        drain(conn)
    f = fleet_accounting(conn, at(300.5), at(3300), group_by="team", now=at(3400), source=source)  # type: ignore[arg-type]
    runs, idle, total = f["runs"], f["unallocated"], f["total"]
    assert runs["runs"] == 3 and total["gpu_kwh"] > 0 and idle["gpu_kwh"] > 0 and idle["host_kwh"] > 0
    for k in ("gpu_kwh", "host_kwh", "it_kwh", "facility_kwh", "co2e_kg"):
        assert close(runs[k] + idle[k], total[k]), (k, runs[k], idle[k], total[k])
    # GPU time no run held splits into time with telemetry (unallocated) and without (the hole on n2)
    dark = f["no_telemetry"]
    assert close(runs["gpu_hours"] + idle["gpu_hours"] + dark["gpu_hours"], total["gpu_hours"])
    assert (
        dark["gpu_kwh"] == 0 and dark["coverage"] == 0 and idle["coverage"] == 1.0 and dark["gpu_hours"] > 0
    )
    assert 0 < total["coverage"] < 1
    # per-currency energy cost adds up too
    for cur in ("USD", "EUR"):
        a = runs["costs_by_currency"][cur]["energy_cost"] + idle["costs_by_currency"][cur]["energy_cost"]
        assert close(a, total["costs_by_currency"][cur]["energy_cost"])
    assert total["currency"] is None and total["energy_cost"] is None  # two currencies
    groups = {g["key"]: g for g in f["groups"]}
    assert set(groups) == {"lm", "vision"} and groups["lm"]["runs"] == 2
    assert groups["lm"]["currency"] is None and set(groups["lm"]["costs_by_currency"]) == {"USD", "EUR"}
    assert groups["vision"]["currency"] == "USD"
    # the finance report covers the same runs with the same numbers
    rows = runs_report(conn, at(300.5), at(3300), now=at(3400), source=source)  # type: ignore[arg-type]
    assert [r["run_id"] for r in rows] == ["rC", "rA", "rB"]
    assert close(sum(r["gpu_kwh"] for r in rows), runs["gpu_kwh"], 1e-9)


def test_rollup_and_raw_fleet_agree_and_group_keys(conn: psycopg.Connection) -> None:
    fleet(conn)
    raw = fleet_accounting(conn, at(0), at(3600), group_by="site", now=at(3400), source="raw")
    pending = fleet_accounting(conn, at(0), at(3600), group_by="site", now=at(3400))
    drain(conn)
    rolled = fleet_accounting(conn, at(0), at(3600), group_by="run", now=at(3400))
    assert raw["window_end"] == "2026-12-01T10:56:40Z" and rolled["source"] == "rollup"
    assert pending["source"] == "mixed"
    for block in ("runs", "unallocated", "total"):
        for k in ("gpu_kwh", "host_kwh", "co2e_kg"):
            assert close(rolled[block][k], raw[block][k], 1e-9) and close(
                pending[block][k], raw[block][k], 1e-9
            )
    assert [g["key"] for g in raw["groups"]] == ["s1", "s2"]
    assert [g["key"] for g in rolled["groups"]] == ["rA", "rB", "rC"]


def test_empty_fleet(conn: psycopg.Connection) -> None:
    f = fleet_accounting(conn, at(0), at(3600), now=at(9999))
    assert f["groups"] == [] and f["total"]["gpu_kwh"] == 0.0 and f["total"]["coverage"] == 0.0
    with pytest.raises(ValueError, match="group_by"):
        fleet_accounting(conn, at(0), at(3600), group_by="colour")  # type: ignore[arg-type]


def test_a_day_with_minutes_of_telemetry_says_what_it_knows(conn: psycopg.Connection) -> None:
    """The issue's day: 17 minutes of telemetry, six runs. Runs overlapping the day count, the GPU time no
    sample covers is a line of its own (not "unallocated"), and every figure carries its coverage."""
    site(conn, "s", pue=1.2, price=0.3, gpu_hour=2.0, currency="EUR", carbon=300.0)
    node(conn, "n1", 8, "s")
    day = (at(-10 * 3600), at(14 * 3600))  # 00:00 to 24:00 of the day of T0 (10:00)
    gpu_samples(conn, [(float(t), "n1", g, 400.0, None) for g in range(8) for t in range(0, 17 * 60 + 1, 10)])
    for k in range(6):  # runs that overlap the day, one of them from the day before, one into the next
        run(
            conn,
            f"r{k}",
            -11 * 3600 if k == 0 else k * 600,
            20 * 3600 if k == 5 else k * 600 + 300,
            {"n1": [k]},
            site_name="s",
        )
    f = fleet_accounting(conn, *day, now=at(30 * 3600), source="raw")
    assert f["runs"]["runs"] == 6 and f["total"]["runs"] == 6
    idle, dark, total = f["unallocated"], f["no_telemetry"], f["total"]
    assert idle["coverage"] == 1.0 and dark["coverage"] == 0.0 and dark["gpu_kwh"] == 0.0
    assert idle["gpu_hours"] < 8 * 17 / 60 and dark["gpu_hours"] > 90  # most of the day is unknown, said so
    assert close(f["runs"]["gpu_hours"] + idle["gpu_hours"] + dark["gpu_hours"], total["gpu_hours"], 1e-9)
    # the GPUs joined at their first sample (10:00), GPU 0 when r0 took it the day before: the fleet is
    # 7 GPUs x 14 h + 24 h of the day, not 8 x 24 h
    assert close(total["gpu_hours"], 7 * 14.0 + 24.0, 1e-9) and 0 < total["coverage"] < 0.03
    for g in f["groups"]:
        assert "coverage" in g
