"""Accounting V5 gives V4's lines: the fleet pieces' currency joined on the rate index, not looked up.

V4's text is installed beside the current one as a function of this session (``pg_temp``) and both are
asked the same questions over a fleet whose pieces fall on every kind of rate edge: an hourly-ish carbon
series, time-of-use prices, a currency change inside the period, a site without telemetry, runs that
start and end between edges, and periods that start before, on and after the currency change.
"""

from __future__ import annotations

import math
from datetime import timedelta

import psycopg
import pytest

from gpufleet.db import sql_files
from tests.accounting.builders import (
    at,
    carbon,
    drain,
    gpu_samples,
    host_samples,
    node,
    prices,
    run,
    site,
    wavy_power,
)

COLUMNS = (
    "line, run_id, site, part_start, part_end, gpu_count, gpu_equivalents, gpu_s, covered_s, gpu_hours, "
    "covered_hours, coverage, gpu_kwh, host_kwh, it_kwh, facility_kwh, pue, co2e_kg, co2e_unknown_kwh, "
    "carbon_source, g_co2e_per_kwh, price_source, price_per_kwh, currency, minor_units, energy_cost, "
    "compute_cost, total_cost, stale"
)


def _fleet(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.2, gpu_hour=2.5, currency="EUR", region="DE")
    site(conn, "us", pue=1.1, price=0.1, gpu_hour=2.0, currency="USD", carbon=400.0)
    # the US site bills in EUR from 1800 s on: its pieces before and after take different currencies
    conn.execute(
        "INSERT INTO site_settings (site, setting, valid_from, txt) VALUES ('us', 'currency', %s, 'EUR')",
        (at(1800),),
    )
    carbon(conn, "DE", [(s, 200.0 + (s % 700) / 7) for s in range(-600, 4000, 450)])
    prices(conn, "eu", [(900, 0.25), (2100.5, 0.18)])
    for n, count, s in (("a1", 4, "eu"), ("a2", 2, "us"), ("a3", 2, "us")):
        node(conn, n, count, s)
        if n == "a3":
            continue  # registered, never reported: its GPUs have no telemetry
        gpu_samples(conn, wavy_power(n, count, 0.0, 3600.0, 10.0))
        host_samples(conn, [(k * 15.0, n, 250.0 + k % 5) for k in range(0, 241)])
    run(conn, "r1", 130.5, 2500, {"a1": [0, 1], "a2": [0]}, site_name="eu", team="lm")
    run(conn, "r2", 1700, 3100.25, {"a2": [1]}, site_name="us", team="vision")
    run(conn, "r3", 2000, None, {"a1": [3]}, site_name="us")


def fleet_rows(conn: psycopg.Connection, fn: str, lo: float, hi: float, detail: str) -> list[tuple]:
    step = timedelta(minutes=20) if detail == "step" else None
    return conn.execute(
        f"SELECT {COLUMNS} FROM {fn}(%s, %s, %s, NULL, true, 60, 'rollup', %s, %s) "
        "ORDER BY line, run_id NULLS FIRST, site NULLS FIRST, part_start, currency NULLS FIRST",
        (at(lo), at(hi), at(3600), detail, step),
    ).fetchall()


def assert_same_lines(new: list[tuple], old: list[tuple], where: object) -> None:
    """Two texts' lines equal column by column; double-precision columns to 1e-12 (GPU-seconds, and the
    coverage from them, may be summed in another order)."""
    assert len(new) == len(old), where
    for a, b in zip(new, old, strict=True):
        for name, x, y in zip(COLUMNS.split(", "), a, b, strict=True):
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9), (where, name, a, b)
            else:
                assert x == y, (where, name, a, b)


@pytest.mark.parametrize("detail", ["line", "step", "segment"])
def test_v5_lines_are_v4s(conn: psycopg.Connection, detail: str) -> None:
    _fleet(conn)
    drain(conn)
    v4 = sql_files.text("gpufleet_accounting.v4").replace(
        "CREATE OR REPLACE FUNCTION gpufleet_accounting(", "CREATE FUNCTION pg_temp.accounting_v4(", 1
    )
    conn.execute(v4)
    for lo, hi in ((0, 3600), (1800, 3600), (1799.5, 2000), (-3600, 900), (2500, 3400)):
        new = fleet_rows(conn, "gpufleet_accounting", lo, hi, detail)
        assert_same_lines(new, fleet_rows(conn, "pg_temp.accounting_v4", lo, hi, detail), (lo, hi))
        assert any(r[0] == "total" for r in new) and {r[23] for r in new} >= {"EUR"}
    # the period across the change prices the US site's fleet time in both currencies
    across = fleet_rows(conn, "gpufleet_accounting", 0, 3600, detail)
    assert {r[23] for r in across if r[2] == "us" and r[0] == "unallocated"} == {"USD", "EUR"}
