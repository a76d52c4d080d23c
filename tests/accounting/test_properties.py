"""Properties over random telemetry: additivity over time, ingest-order independence, raw == rollup."""

from __future__ import annotations

import itertools
import random
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.accounting import run_accounting
from tests.accounting.builders import GpuRow, at, carbon, drain, gpu_samples, host_samples, node, run, site
from tests.conftest import truncate_all

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def telemetry(draw: st.DrawFn) -> list[GpuRow]:
    """1-2 GPUs, irregular sampling with long holes, power gaps, counters that reset or are missing."""
    rows: list[GpuRow] = []
    for g in range(draw(st.integers(1, 2))):
        steps = draw(
            st.lists(st.sampled_from([0.5, 3.0, 10.0, 17.3, 45.0, 90.0, 400.0]), min_size=2, max_size=40)
        )
        t, counter_mj = draw(st.floats(0, 120)), draw(st.integers(0, 10**9))
        counters = draw(st.booleans())
        for k, dt in enumerate(steps):
            p = draw(st.one_of(st.none(), st.floats(50, 700)))
            counter_mj += round(dt * (p or 300.0) * 1000)
            if draw(st.integers(0, 15)) == 0:
                counter_mj = draw(st.integers(0, 1000))  # reset
            rows.append((round(t, 3), "n1", g, p, counter_mj if counters and k % 7 != 3 else None))
            t += dt
    return rows


def _setup(
    url: str,
    conn: psycopg.Connection,
    rows: list[GpuRow],
    start: float,
    end: float,
    steps: list[tuple[float, float]],
    chunks: int = 1,
    seed: int = 0,
) -> None:
    truncate_all(url)
    site(conn, "s", pue=1.3, price=0.2, region="R" if steps else None, carbon=250.0)
    node(conn, "n1", 2, "s")
    carbon(conn, "R", dict((round(t, 3), g) for t, g in steps).items())
    run(conn, "r", start, end, {"n1": [0, 1]}, site_name="s")
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    size = max(1, len(shuffled) // chunks)
    for i in range(0, len(shuffled), size):
        gpu_samples(conn, shuffled[i : i + size])
        if i // size % 2:
            drain(conn)  # rollups built from partial data, then corrected by late rows
    host_samples(conn, [(float(s), "n1", 400.0 + s % 13) for s in range(0, 2000, 7)])


KEYS = ("gpu_kwh", "host_kwh", "facility_kwh", "co2e_kg", "energy_cost", "coverage")


def _close(a: dict[str, Any], b: dict[str, Any], rel: float) -> None:
    for k in KEYS:
        assert abs(a[k] - b[k]) <= rel * abs(b[k]) + 1e-12, (k, a[k], b[k])


steps_st = st.lists(st.tuples(st.floats(-100, 2500), st.floats(0, 900)), max_size=4)


@SETTINGS
@given(
    rows=telemetry(),
    start=st.floats(0, 600),
    length=st.floats(1, 1800),
    steps=steps_st,
    chunks=st.integers(1, 6),
    seed=st.integers(0, 99),
)
def test_shuffled_ingest_then_rollup_equals_raw(
    db: str,
    conn: psycopg.Connection,
    rows: list[GpuRow],
    start: float,
    length: float,
    steps: list[tuple[float, float]],
    chunks: int,
    seed: int,
) -> None:
    _setup(db, conn, rows, round(start, 3), round(start + length, 3), steps, chunks, seed)
    raw = run_accounting(conn, "r", now=at(10_000), source="raw")
    pending = run_accounting(conn, "r", now=at(10_000))
    drain(conn)
    rolled = run_accounting(conn, "r", now=at(10_000), source="rollup")
    assert rolled["source"] == "rollup"
    _close(rolled, raw, 1e-3)
    _close(pending, raw, 1e-3)
    # the same rows ingested in time order, in one batch, give the same answer
    _setup(db, conn, sorted(rows), round(start, 3), round(start + length, 3), steps)
    drain(conn)
    _close(run_accounting(conn, "r", now=at(10_000), source="rollup"), rolled, 1e-9)


@SETTINGS
@given(
    rows=telemetry(),
    start=st.floats(0, 600),
    length=st.floats(1, 1800),
    steps=steps_st,
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=4),
    source=st.sampled_from(["raw", "rollup"]),
)
def test_splitting_the_window_sums_to_the_whole(
    db: str,
    conn: psycopg.Connection,
    rows: list[GpuRow],
    start: float,
    length: float,
    steps: list[tuple[float, float]],
    cuts: list[float],
    source: str,
) -> None:
    lo, hi = round(start, 3), round(start + length, 3)
    _setup(db, conn, rows, lo, hi, steps)
    drain(conn)
    whole = run_accounting(conn, "r", now=at(10_000), source=source)  # type: ignore[arg-type]
    bounds = sorted({lo, hi, *(round(lo + c * (hi - lo), 3) for c in cuts)})
    parts = [
        run_accounting(conn, "r", now=at(10_000), source=source, since=at(a), until=at(b))  # type: ignore[arg-type]
        for a, b in itertools.pairwise(bounds)
    ]
    # each answer is rounded (energies and hours to 1e-9, money to the cent): n parts differ from the
    # whole by at most n + 1 roundings, and by nothing else
    n = len(parts) + 1
    for k in ("gpu_kwh", "host_kwh", "facility_kwh", "co2e_kg", "gpu_hours"):
        total = sum(p[k] for p in parts)
        assert abs(total - whole[k]) <= 1e-9 * abs(whole[k]) + n * 5e-10 + 1e-12, (k, total, whole[k])
    for k in ("energy_cost", "compute_cost"):
        total = sum(p[k] for p in parts)
        assert abs(total - whole[k]) <= n * 0.005 + 1e-9, (k, total, whole[k])
    # covered hours as coverage x gpu_hours: each gpu_hours is rounded to 1e-9, so n roundings again (a
    # window of seconds is all rounding: 2 GPU-seconds are 0.000555556 h)
    covered = sum(p["coverage"] * p["gpu_hours"] for p in parts)
    assert (
        abs(covered - whole["coverage"] * whole["gpu_hours"]) <= 1e-9 * whole["gpu_hours"] + n * 5e-10 + 1e-12
    )
