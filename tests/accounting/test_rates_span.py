"""A run body's rates read once per site over the span of every window are each window's own.

``gpufleet.accounting.run._rates`` reads each site's periods (and each GPU model's prices) once over the
span of all the windows asked, and cuts them to each window; the database's functions called for each
window alone are the reference.  Windows start and end on setting changes, between them, before the
first, after the last, and are empty.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import psycopg

from gpufleet.accounting.run import _rates
from gpufleet.timeparse import iso
from tests.accounting.builders import at, setting, site

CHANGES_S = (1000.0, 2500.5, 4000.0, 7000.0)


def _site_with_changes(conn: psycopg.Connection) -> None:
    site(conn, "s1", pue=1.3, price=0.2, gpu_hour=2.0, currency="EUR", region="R")
    site(conn, "s2", pue=1.1, price=0.1)
    setting(conn, "s1", "pue", CHANGES_S[0], 1.5)
    setting(conn, "s1", "price_per_kwh", CHANGES_S[1], 0.35)
    setting(conn, "s1", "gpu_hour_price", CHANGES_S[2], 2.5)
    setting(conn, "s1", "gpu_hour_price", CHANGES_S[1], 4.0, gpu_model="H100")
    setting(conn, "s1", "gpu_hour_price", CHANGES_S[3], 4.5, gpu_model="H100")
    setting(conn, "s1", "carbon_region", CHANGES_S[3], "Q")
    setting(conn, "s2", "price_per_kwh", CHANGES_S[2], 0.15)


def _one_window(
    conn: psycopg.Connection, site_name: str, lo: datetime, hi: datetime, models: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the database's functions give for this window alone, in the body's form."""
    end = hi if hi > lo else lo + timedelta(microseconds=1)
    periods = [
        {
            "from": iso(r[0]),
            "to": iso(r[1]),
            "pue": r[2],
            "price_per_kwh": r[3],
            "gpu_hour_price": r[4],
            "carbon_region": r[5],
            "carbon_g_per_kwh": r[6],
            "currency": r[7],
        }
        for r in conn.execute("SELECT * FROM gpufleet_site_periods(%s, %s, %s)", (site_name, lo, end))
    ]
    prices: list[dict[str, Any]] = []
    for model in models:
        for t0, t1, key, price in conn.execute(
            "SELECT t0, t1, gpu_model_key, price FROM gpufleet_gpu_hour_prices(%s, %s, %s, %s) "
            "WHERE gpu_model_key <> ''",
            (site_name, model, lo, end),
        ):
            entry = {"gpu_model": key, "from": iso(t0), "to": iso(t1), "gpu_hour_price": price}
            if entry not in prices:
                prices.append(entry)
    return periods, prices


def test_rates_of_many_windows_are_each_windows_own(conn: psycopg.Connection) -> None:
    _site_with_changes(conn)
    edges = [-500.0, 0.0, *CHANGES_S, 9000.0]
    rng = random.Random(7)
    windows = [(a, b) for a in edges for b in edges if a <= b]
    windows += [tuple(sorted((rng.uniform(-600, 9500), rng.uniform(-600, 9500)))) for _ in range(40)]
    asks = []
    for i, (a, b) in enumerate(windows):
        site_name = ("s1", "s2", None)[i % 3]
        models = [m for m in ("NVIDIA H100 80GB HBM3", "Tesla T4") if i % 2 or m.startswith("NVIDIA")]
        asks.append((site_name, at(a), at(b), [{"model": m} for m in models]))
    got = _rates(conn, asks)
    for (site_name, lo, hi, models), rates in zip(asks, got, strict=True):
        if site_name is None:
            assert rates == ([], [])
            continue
        want = _one_window(conn, site_name, lo, hi, [m["model"] for m in models])
        assert rates == want, (site_name, lo, hi)
    assert any(len(r[0]) > 2 for r in got) and any(r[1] for r in got), (
        "no window crosses changes: tests nothing"
    )
