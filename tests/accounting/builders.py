"""Fixtures' building blocks: sites, runs, nodes and samples written straight into the database."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from gpufleet.collector import rollup
from gpufleet.db.policies import backend_of

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
KWH = 3.6e6


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def site(conn: psycopg.Connection, name: str, *, pue: float = 1.0, price: float = 0.0, gpu_hour: float = 0.0,
         currency: str = "USD", region: str | None = None, carbon: float | None = None) -> None:
    conn.execute("INSERT INTO sites (site, pue, price_per_kwh, gpu_hour_price, currency, carbon_region, "
                 "carbon_g_per_kwh) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                 (name, pue, price, gpu_hour, currency, region, carbon))


def carbon(conn: psycopg.Connection, region: str, points: Iterable[tuple[float, float]]) -> None:
    for s, g in points:
        conn.execute("INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) VALUES (%s, %s, %s)",
                     (region, at(s), g))


def prices(conn: psycopg.Connection, site_name: str, points: Iterable[tuple[float, float]]) -> None:
    for s, p in points:
        conn.execute("INSERT INTO site_prices (site, time, price_per_kwh) VALUES (%s, %s, %s)",
                     (site_name, at(s), p))


def node(conn: psycopg.Connection, name: str, gpu_count: int | None = 8, site_name: str | None = None,
         facts: dict[str, Any] | None = None) -> None:
    conn.execute("INSERT INTO nodes (node, site, gpu_count, facts) VALUES (%s, %s, %s, %s)",
                 (name, site_name, gpu_count, json.dumps(facts or {})))


def run(conn: psycopg.Connection, run_id: str, start_s: float, end_s: float | None,
        alloc: dict[str, Sequence[int]], *, site_name: str | None = None, team: str | None = None,
        params: int | None = None) -> None:
    conn.execute('INSERT INTO runs (run_id, site, team, start, "end", params) VALUES (%s, %s, %s, %s, %s, %s)',
                 (run_id, site_name, team, at(start_s), None if end_s is None else at(end_s), params))
    for n, gpus in alloc.items():
        for g in gpus:
            conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s)", (run_id, n, g))


GpuRow = tuple[float, str, int, float | None, float | None]  # (s, node, gpu, power_w, energy_mj)


def gpu_samples(conn: psycopg.Connection, rows: Sequence[GpuRow], mig: int | None = None,
                queue: bool = True) -> None:
    """Write GPU samples and queue their range for the rollup worker, as ingest does."""
    if not rows:
        return
    with conn.cursor().copy("COPY gpu_samples (time, node, gpu, power_w, energy_mj, mig_instance) FROM STDIN") as cp:
        for s, n, g, p, e in rows:
            cp.write_row((at(s), n, g, p, None if e is None else round(e), mig))
    if queue:
        for n in sorted({r[1] for r in rows}):
            mine = [r[0] for r in rows if r[1] == n]
            conn.execute("INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)",
                         (n, at(min(mine)), at(max(mine))))


def host_samples(conn: psycopg.Connection, rows: Sequence[tuple[float, str, float | None]]) -> None:
    with conn.cursor().copy("COPY host_samples (time, node, host_power_w) FROM STDIN") as cp:
        for s, n, p in rows:
            cp.write_row((at(s), n, p))
    for n in sorted({r[1] for r in rows}):
        mine = [r[0] for r in rows if r[1] == n]
        conn.execute("INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)",
                     (n, at(min(mine)), at(max(mine))))


def constant_power(node_name: str, gpus: Iterable[int], power_w: float, t0_s: float, t1_s: float,
                   step_s: float = 10.0, counter: bool = False) -> list[GpuRow]:
    """Samples every ``step_s`` over [t0_s, t1_s], optionally with a consistent energy counter."""
    out: list[GpuRow] = []
    n = round((t1_s - t0_s) / step_s)
    for g in gpus:
        for k in range(n + 1):
            s = t0_s + k * step_s
            out.append((s, node_name, g, power_w, power_w * (s - t0_s) * 1000.0 + 1e9 if counter else None))
    return out


def drain(conn: psycopg.Connection, max_gap_s: float = 60.0) -> None:
    rollup.drain(conn, max_gap_s, plain_stats=backend_of(conn) != "timescaledb")


def approx(a: float | None, b: float, rel: float = 1e-9, abs_: float = 1e-9) -> bool:
    return a is not None and abs(a - b) <= max(rel * abs(b), abs_)
