"""Fixtures' building blocks: sites, runs, nodes and samples written straight into the database."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg

from gpufleet.collector import rollup
from gpufleet.db.policies import backend_of

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
KWH = 3.6e6


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def site(
    conn: psycopg.Connection,
    name: str,
    *,
    pue: float = 1.0,
    price: float = 0.0,
    gpu_hour: float = 0.0,
    currency: str = "USD",
    region: str | None = None,
    carbon: float | None = None,
) -> None:
    """A site whose settings hold from the beginning (``-infinity``), as ``PUT /v1/sites`` creates one."""
    conn.execute("INSERT INTO sites (site, currency) VALUES (%s, %s)", (name, currency))
    for setting, num, txt in (
        ("pue", pue, None),
        ("price_per_kwh", price, None),
        ("gpu_hour_price", gpu_hour, None),
        ("carbon_region", None, region),
        ("carbon_g_per_kwh", carbon, None),
    ):
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num, txt) "
            "VALUES (%s, %s, '-infinity', %s, %s)",
            (name, setting, num, txt),
        )


def setting(
    conn: psycopg.Connection,
    site_name: str,
    name: str,
    from_s: float | None,
    value: float | str | None,
    gpu_model: str = "",
) -> None:
    """One dated change of a site setting (``from_s`` None: from the beginning)."""
    num, txt = (None, value) if name == "carbon_region" else (value, None)
    conn.execute(
        "INSERT INTO site_settings (site, setting, gpu_model, valid_from, num, txt) VALUES "
        "(%s, %s, %s, %s, %s, %s) ON CONFLICT (site, setting, gpu_model, valid_from) DO UPDATE "
        "SET num = EXCLUDED.num, txt = EXCLUDED.txt",
        (site_name, name, gpu_model, "-infinity" if from_s is None else at(from_s), num, txt),
    )


def carbon(conn: psycopg.Connection, region: str, points: Iterable[tuple[float, float]]) -> None:
    for s, g in points:
        conn.execute(
            "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) VALUES (%s, %s, %s)",
            (region, at(s), g),
        )


def prices(conn: psycopg.Connection, site_name: str, points: Iterable[tuple[float, float]]) -> None:
    """Time-of-use energy prices: points of the site's ``price_per_kwh`` series."""
    for s, p in points:
        setting(conn, site_name, "price_per_kwh", s, p)


def node(
    conn: psycopg.Connection,
    name: str,
    gpu_count: int | None = 8,
    site_name: str | None = None,
    facts: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        "INSERT INTO nodes (node, site, gpu_count, facts) VALUES (%s, %s, %s, %s)",
        (name, site_name, gpu_count, json.dumps(facts or {})),
    )


def run(
    conn: psycopg.Connection,
    run_id: str,
    start_s: float,
    end_s: float | None,
    alloc: dict[str, Sequence[int]],
    *,
    site_name: str | None = None,
    team: str | None = None,
    params: int | None = None,
) -> None:
    conn.execute(
        'INSERT INTO runs (run_id, site, team, start, "end", params) VALUES (%s, %s, %s, %s, %s, %s)',
        (run_id, site_name, team, at(start_s), None if end_s is None else at(end_s), params),
    )
    for n, gpus in alloc.items():
        for g in gpus:
            conn.execute(
                "INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s)", (run_id, n, g)
            )


GpuRow = tuple[float, str, int, float | None, float | None]  # (s, node, gpu, power_w, energy_mj)


def gpu_samples(
    conn: psycopg.Connection, rows: Sequence[GpuRow], mig: int | None = None, queue: bool = True
) -> None:
    """Write GPU samples and queue their range for the rollup worker, as ingest does."""
    if not rows:
        return
    with conn.cursor().copy(
        "COPY gpu_samples (time, node, gpu, power_w, energy_mj, mig_instance) FROM STDIN"
    ) as cp:
        for s, n, g, p, e in rows:
            cp.write_row((at(s), n, g, p, None if e is None else round(e), mig))
    if queue:
        for n in sorted({r[1] for r in rows}):
            mine = [r[0] for r in rows if r[1] == n]
            conn.execute(
                "INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)",
                (n, at(min(mine)), at(max(mine))),
            )


def host_samples(conn: psycopg.Connection, rows: Sequence[tuple[float, str, float | None]]) -> None:
    with conn.cursor().copy("COPY host_samples (time, node, host_power_w) FROM STDIN") as cp:
        for s, n, p in rows:
            cp.write_row((at(s), n, p))
    for n in sorted({r[1] for r in rows}):
        mine = [r[0] for r in rows if r[1] == n]
        conn.execute(
            "INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)",
            (n, at(min(mine)), at(max(mine))),
        )


def constant_power(
    node_name: str,
    gpus: Iterable[int],
    power_w: float,
    t0_s: float,
    t1_s: float,
    step_s: float = 10.0,
    counter: bool = False,
) -> list[GpuRow]:
    """Samples every ``step_s`` over [t0_s, t1_s], optionally with a consistent energy counter."""
    out: list[GpuRow] = []
    n = round((t1_s - t0_s) / step_s)
    for g in gpus:
        for k in range(n + 1):
            s = t0_s + k * step_s
            out.append((s, node_name, g, power_w, power_w * (s - t0_s) * 1000.0 + 1e9 if counter else None))
    return out


def wavy_power(
    node_name: str, count: int, t0_s: float, t1_s: float, step_s: float, period_s: float = 250.0
) -> list[GpuRow]:
    """Samples of GPUs 0..count-1 every ``step_s`` over [t0_s, t1_s], each GPU 0.7 s after the one before,
    at a power that swings around a level of its own (no two GPUs, samples or minutes alike)."""
    out: list[GpuRow] = []
    for g in range(count):
        for k in range(int((t1_s - t0_s) / step_s) + 1):
            t = t0_s + k * step_s + 0.7 * g
            out.append((t, node_name, g, 90.0 + 15 * g + 40 * math.sin(t / period_s), None))
    return out


def drain(conn: psycopg.Connection, max_gap_s: float = 60.0) -> None:
    rollup.drain(conn, max_gap_s, plain_stats=backend_of(conn) != "timescaledb")


def cents(x: float, places: int = 2) -> float:
    """``x`` rounded to minor units as the database rounds money (half away from zero)."""
    return float(Decimal(repr(x)).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))


def approx(a: float | None, b: float, rel: float = 1e-9, abs_: float = 1e-9) -> bool:
    return a is not None and abs(a - b) <= max(rel * abs(b), abs_)
