"""Accounting V6 gives V5's lines: the fleet path's cuts and held shares joined, not scanned per GPU.

V5's text is installed beside the current one as a function of this session (``pg_temp``) and both are
asked the same questions over a fleet whose GPUs are held in every way the joins must get right: GPUs
held by runs one after another (a cut at each edge), shared by two runs at once with declared shares
(held shares summed), a node held in part (the host's unallocated share), runs that start before, end
inside or run past the period, a GPU never held, and a node that never reported.
"""

from __future__ import annotations

import math

import psycopg
import pytest

from gpufleet.db import sql_files
from tests.accounting.builders import at, carbon, drain, gpu_samples, host_samples, node, prices, run, site
from tests.accounting.test_fleet_currency_join import assert_same_lines, fleet_rows


def _shared(
    conn: psycopg.Connection, run_id: str, start: float, end: float | None, gpus: list[tuple[str, int]]
) -> None:
    """A run holding half of each of ``gpus`` (time slicing), so another may hold the other half."""
    conn.execute(
        'INSERT INTO runs (run_id, site, start, "end") VALUES (%s, %s, %s, %s)',
        (run_id, "eu", at(start), None if end is None else at(end)),
    )
    for n, g in gpus:
        conn.execute(
            "INSERT INTO run_allocations (run_id, node, gpu, sharing, share) VALUES (%s, %s, %s, 'time_slice', 0.5)",
            (run_id, n, g),
        )


def _fleet(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.2, gpu_hour=2.5, currency="EUR", region="DE")
    site(conn, "us", pue=1.1, price=0.1, gpu_hour=2.0, currency="USD", carbon=400.0)
    carbon(conn, "DE", [(s, 180.0 + (s % 500) / 5) for s in range(-600, 4000, 600)])
    prices(conn, "eu", [(1000, 0.22), (2500.5, 0.17)])
    for n, count, s in (("b1", 4, "eu"), ("b2", 4, "eu"), ("b3", 2, "us"), ("b4", 2, "us")):
        node(conn, n, count, s)
        if n == "b4":
            continue  # registered, never reported
        rows = []
        for g in range(count):
            for k in range(0, 361):
                t = k * 10.0 + 0.3 * g
                rows.append((t, n, g, 80.0 + 20 * g + 35 * math.cos(t / 300.0), None))
        gpu_samples(conn, rows)
        host_samples(conn, [(k * 15.0, n, 240.0 + k % 7) for k in range(0, 241)])
    # b1's GPU 0 held by three runs one after another; GPUs 1 and 2 by one run past the period's end
    run(conn, "s1", -500, 900, {"b1": [0]}, site_name="eu", team="lm")
    run(conn, "s2", 900, 1900.5, {"b1": [0], "b2": [3]}, site_name="eu", team="lm")
    run(conn, "s3", 2400, 3300, {"b1": [0]}, site_name="us", team="vision")
    run(conn, "s4", 300.25, None, {"b1": [1, 2]}, site_name="eu")
    # b2's GPUs 0 and 1 shared by two runs that overlap; GPU 2 never held
    _shared(conn, "h1", 200, 2600, [("b2", 0), ("b2", 1)])
    _shared(conn, "h2", 1300, None, [("b2", 0), ("b2", 1)])
    # b3: one of its two GPUs held for a while, so its host is held in part
    run(conn, "s5", 1000, 2200, {"b3": [1]}, site_name="us", team="vision")


@pytest.mark.parametrize("detail", ["line", "step", "segment"])
def test_v6_lines_are_v5s(conn: psycopg.Connection, detail: str) -> None:
    _fleet(conn)
    drain(conn)
    v5 = sql_files.text("gpufleet_accounting.v5").replace(
        "CREATE OR REPLACE FUNCTION gpufleet_accounting(", "CREATE FUNCTION pg_temp.accounting_v5(", 1
    )
    assert v5 != sql_files.text("gpufleet_accounting.v5")
    conn.execute(v5)
    for lo, hi in ((0, 3600), (900, 1900.5), (1000.25, 2000), (-3600, 700), (2300, 3400), (1300, 1300.5)):
        new = fleet_rows(conn, "gpufleet_accounting", lo, hi, detail)
        assert_same_lines(new, fleet_rows(conn, "pg_temp.accounting_v5", lo, hi, detail), (lo, hi))
        assert any(r[0] == "unallocated" for r in new), (lo, hi)
    # the shared GPUs and the partly held host make unallocated shares between 0 and 1
    whole = fleet_rows(conn, "gpufleet_accounting", 0, 3600, detail)
    unalloc = sum(r[7] for r in whole if r[0] == "unallocated")
    total = sum(r[7] for r in whole if r[0] == "total")
    held_kwh = sum(r[12] for r in whole if r[0] == "run")
    assert 0 < unalloc < total and held_kwh > 0
