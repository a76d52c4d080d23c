"""Accounting latency of many runs with their ledgers: with the ledger and without, rollups vs raw samples.

    python bench/accounting.py [--gpus 512] [--runs 512] [--days 7] [--interval-s 10] [--repeat 5]

Creates a scratch database (``testsupport.pg.scratch_database``, dropped
afterwards), writes the fleet's telemetry straight into it with binary COPY
(``--gpus`` GPUs, 8 per node, sampled every ``--interval-s`` for ``--days``
days: 512 x 7 d x 10 s is about 31 M GPU samples, plus host power), a site
with an hourly carbon series and dated settings in force during the runs (a
PUE per day, an energy price change at an unaligned time, a GPU-hour price
change and an H100 price of its own), and builds the energy rollups node by node (``collector.rollup.rebuild``).
The GPUs are split evenly into ``--runs`` runs over the whole span (512 runs of
one GPU by default; ``--runs 1``: one 512-GPU run), each with incidents of every
kind that puts GPU-time in the ledger: an idle allocation a day, a hung
collective every other day, a checkpoint stall an hour, a starvation episode
every 4 hours overlapping some of them, a straggler every 6 hours and
throttling every 2 hours.

Then it times the runs' accounting (``gpufleet.accounting.account_runs``, the
bodies of ``GET /v1/runs/{id}/accounting`` and of the finance report) from
rollups (``source="auto"`` with an empty queue, and ``"rollup"``) with each
run's ledger, the same without the ledger (the baseline: what the accounting
cost before the ledger), and from raw samples, and compares them.  The runs
start and end off the minute grid, the power varies, the counters jitter and
reset once a day, so the rollup answer needs raw partial minutes as in
production.  It checks every ledger: its states' GPU-hours add up to the run's
exactly.

Refuses to start when the database's disk has less free space than about
twice the estimated size; scale down with ``--gpus``/``--days``.  The last
line is JSON with ``latency_ms`` (auto, with the ledger), ``no_ledger_ms`` (the
baseline), ``ledger_ratio``, ``cold_latency_ms`` / ``cold_no_ledger_ms`` (the same, timed once each
before anything priced was kept), ``rollup_latency_ms``, ``raw_latency_ms``,
``ratio`` (raw / rollup) and ``max_rel_err``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench.common import say
from gpufleet.accounting import account_runs
from gpufleet.accounting.result import AccountingBody
from gpufleet.collector import rollup
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.store.run_model import Run, load_runs
from testsupport.pg import server_url

T0 = datetime(2026, 11, 2, 0, 0, 0, tzinfo=UTC)
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
GPUS_PER_NODE = 8
#: Stored bytes per GPU sample (heap row with a wide NULL bitmap, (node, gpu, time) index,
#: BRIN/time index) plus its share of the minute rollups; measured on PostgreSQL 15.
BYTES_PER_SAMPLE = 160
KEYS = ("gpu_kwh", "host_kwh", "it_kwh", "facility_kwh", "co2e_kg", "energy_cost", "compute_cost", "coverage")


def _gpu_dtype(node_len: int) -> np.dtype:
    return np.dtype(
        [
            ("n", ">i2"),
            ("lt", ">i4"),
            ("t", ">i8"),
            ("ln", ">i4"),
            ("node", f"S{node_len}"),
            ("lg", ">i4"),
            ("g", ">i2"),
            ("lp", ">i4"),
            ("p", ">f4"),
            ("le", ">i4"),
            ("e", ">i8"),
        ]
    )


def _host_dtype(node_len: int) -> np.dtype:
    return np.dtype(
        [
            ("n", ">i2"),
            ("lt", ">i4"),
            ("t", ">i8"),
            ("ln", ">i4"),
            ("node", f"S{node_len}"),
            ("lp", ">i4"),
            ("p", ">f4"),
        ]
    )


HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
TRAILER = b"\xff\xff"
CHUNK_BYTES = 8 << 20


def node_gpu_rows(
    node: str, gpus: int, lo_s: float, hi_s: float, step_s: float, rng: np.random.Generator
) -> bytes:
    """Binary COPY rows (time, node, gpu, power_w, energy_mj) of one node's GPUs."""
    base = np.arange(lo_s, hi_s + step_s, step_s)
    n = len(base)
    blocks = []
    for g in range(gpus):
        t = base + rng.uniform(-0.4, 0.4, n)  # jittered sampling, never on the grid
        p = (450 + 200 * np.sin(t / (3600 * (1 + g % 5))) + rng.normal(0, 15, n)).clip(60, 700)
        e = np.concatenate([[0.0], np.cumsum((p[1:] + p[:-1]) / 2 * np.diff(t) * 1000)])
        e += 5e9 + g * 1e8
        for reset in range(int(86_400 / step_s), n, int(86_400 / step_s)):  # a driver reload a day
            e[reset:] -= e[reset] - rng.uniform(0, 1e6)
        a = np.zeros(n, dtype=_gpu_dtype(len(node)))
        a["n"], a["lt"], a["ln"], a["lg"], a["lp"], a["le"] = 5, 8, len(node), 2, 4, 8
        a["t"] = np.round((T0 - PG_EPOCH).total_seconds() * 1e6 + t * 1e6).astype(np.int64)
        a["node"] = node.encode()
        a["g"] = g
        a["p"] = p.astype(np.float32)
        a["e"] = np.round(e).astype(np.int64)
        blocks.append(a.tobytes())
    return b"".join(blocks)


def node_host_rows(node: str, lo_s: float, hi_s: float, step_s: float, rng: np.random.Generator) -> bytes:
    t = np.arange(lo_s, hi_s + step_s, step_s) + rng.uniform(-0.4, 0.4)
    a = np.zeros(len(t), dtype=_host_dtype(len(node)))
    a["n"], a["lt"], a["ln"], a["lp"] = 3, 8, len(node), 4
    a["t"] = np.round((T0 - PG_EPOCH).total_seconds() * 1e6 + t * 1e6).astype(np.int64)
    a["node"] = node.encode()
    a["p"] = (900 + rng.normal(0, 20, len(t))).astype(np.float32)
    return a.tobytes()


def copy(conn: psycopg.Connection, table_cols: str, payload: bytes) -> None:
    with conn.cursor().copy(f"COPY {table_cols} FROM STDIN (FORMAT BINARY)") as cp:
        cp.write(HEADER)
        for i in range(0, len(payload), CHUNK_BYTES):
            cp.write(payload[i : i + CHUNK_BYTES])
        cp.write(TRAILER)


def free_bytes(conn: psycopg.Connection) -> tuple[str, int]:
    """Free space where the server keeps its data (the local root when that is not visible here)."""
    try:
        path = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    except psycopg.Error:
        path = "/"
    while not Path(path).exists():
        path = str(Path(path).parent)
    return path, shutil.disk_usage(path).free


def load(url: str, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, int]:
    nodes = [f"node{i:04d}" for i in range((args.gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE)]
    span_s = args.days * 86_400
    rng = np.random.default_rng(7)
    run_start = T0 + timedelta(seconds=13.7)
    run_end = T0 + timedelta(seconds=span_s - 21.3)
    t = time.perf_counter()
    gpu_rows = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO sites (site, currency) VALUES ('bench', 'EUR')")
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num, txt) VALUES "
            "('bench', 'pue', '-infinity', 1.18, NULL), ('bench', 'price_per_kwh', '-infinity', 0.12, NULL), "
            "('bench', 'gpu_hour_price', '-infinity', 2.5, NULL), "
            "('bench', 'carbon_region', '-infinity', NULL, 'BENCH')"
        )
        hours = int(span_s // 3600) + 2
        conn.execute(
            "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) SELECT 'BENCH', "
            "%s + make_interval(hours => h), 250 + 150 * sin(h / 4.0) FROM generate_series(-1, %s) h",
            (T0, hours),
        )
        # Dated settings in force during the run: a measured PUE per day (loaded like carbon), an energy
        # price change at an unaligned time, a GPU-hour price change, and an H100 price of its own.
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num) SELECT 'bench', 'pue', "
            "%s + make_interval(days => d), 1.12 + 0.04 * (d %% 3) FROM generate_series(0, %s) d",
            (T0, int(args.days) + 1),
        )
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num) VALUES ('bench', 'price_per_kwh', "
            "%s, 0.31), ('bench', 'gpu_hour_price', %s, 2.75)",
            (T0 + timedelta(seconds=span_s / 2 + 7.25), T0 + timedelta(seconds=span_s / 3)),
        )
        conn.execute(
            "INSERT INTO site_settings (site, setting, gpu_model, valid_from, num) VALUES "
            "('bench', 'gpu_hour_price', 'H100', '-infinity', 3.1)"
        )
        ids = run_ids(getattr(args, "runs", 1))
        conn.cursor().executemany(
            'INSERT INTO runs (run_id, name, site, team, start, "end", params) '
            "VALUES (%s, %s, 'bench', %s, %s, %s, 70000000000)",
            [(r, r, f"team-{i % 8}", run_start, run_end) for i, r in enumerate(ids)],
        )
        per_run = max(args.gpus // len(ids), 1)
        left = args.gpus
        index = 0
        for node in nodes:
            count = min(GPUS_PER_NODE, left)
            left -= count
            conn.execute(
                "INSERT INTO nodes (node, site, gpu_count, facts) VALUES (%s, 'bench', %s, "
                '\'{"gpu_model": "NVIDIA H100 80GB HBM3"}\')',
                (node, count),
            )
            conn.cursor().executemany(
                "INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s)",
                [(ids[min((index + g) // per_run, len(ids) - 1)], node, g) for g in range(count)],
            )
            index += count
            payload = node_gpu_rows(node, count, -60.0, span_s + 60.0, args.interval_s, rng)
            gpu_rows += len(payload) // _gpu_dtype(len(node)).itemsize
            copy(conn, "gpu_samples (time, node, gpu, power_w, energy_mj)", payload)
            copy(
                conn,
                "host_samples (time, node, host_power_w)",
                node_host_rows(node, -60.0, span_s + 60.0, args.interval_s, rng),
            )
        say(f"loaded {gpu_rows:,} GPU samples on {len(nodes)} nodes in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        conn.execute("VACUUM ANALYZE gpu_samples")
        conn.execute("VACUUM ANALYZE host_samples")
        say(f"vacuum analyze {time.perf_counter() - t:.0f} s")
    # Rollups node by node over the whole range, each node in its own transaction (as the worker would
    # after a backfill); the per-minute stats are not needed for accounting and are skipped.
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        lo, hi = T0 - timedelta(seconds=60), T0 + timedelta(seconds=span_s + 60)
        for node in nodes:
            with conn.transaction():
                rollup.rebuild(conn, {node: (lo, hi)}, args.max_gap_s, plain_stats=False)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE gpu_energy_1m, gpu_energy_1h, host_energy_1m, host_energy_1h")
    say(f"rollups built in {time.perf_counter() - t:.0f} s")
    return {"gpu_samples": gpu_rows, "nodes": len(nodes)}


def run_ids(runs: int) -> list[str]:
    """The runs' ids: ``bench`` alone (``bench/incident_cost.py`` prices its incidents), else numbered."""
    return ["bench"] if runs <= 1 else [f"bench-{i:04d}" for i in range(runs)]


#: Incidents of every run: (kind, every s, first at s, lasting s, evidence).  Overlaps are on purpose:
#: the starvation episodes cross checkpoint stalls, stragglers and throttling, an idle spell a hang.
SCHEDULE: tuple[tuple[str, float, float, float, dict[str, Any]], ...] = (
    ("idle_allocation", 86_400, 7_200, 1_800, {}),
    ("hung_collective", 172_800, 8_400, 1_200, {}),
    ("checkpoint_stall", 3_600, 1_500, 120, {"run_time_lost_share": 0.3}),
    ("starvation", 14_400, 1_200, 2_700, {"duty_cycle": 0.6}),
    ("straggler", 21_600, 3_000, 1_800, {"activity": 0.7, "peer_activity": 0.9}),
    ("throttling", 7_200, 2_000, 1_200, {"throttled_share": 1.0, "clock_ratio": 0.7}),
)


def add_incidents(url: str, span_s: float) -> int:
    """Every run's incidents of :data:`SCHEDULE`, resolved, in one COPY."""
    with psycopg.connect(url, autocommit=True) as conn:
        alloc: dict[str, list[tuple[str, int]]] = {}
        for run_id, node, gpu in conn.execute(
            "SELECT run_id, node, gpu FROM run_allocations ORDER BY 1, 2, 3"
        ):
            alloc.setdefault(run_id, []).append((node, gpu))
        n = 0
        with conn.cursor().copy(
            'COPY incidents (kind, scope_key, run_id, severity, state, start, "end", last_seen, '
            "evidence) FROM STDIN"
        ) as cp:
            for run_id, gpus in alloc.items():
                listed = [{"node": node, "gpu": gpu} for node, gpu in gpus]
                for kind, every, first, dur, ev in SCHEDULE:
                    evidence = {**ev, "gpus": listed} if kind in ("idle_allocation", "throttling") else ev
                    if kind == "throttling":
                        evidence = {**ev, "gpus": [{**g, **ev} for g in listed]}
                    t = first
                    while t < span_s:
                        a, b = T0 + timedelta(seconds=t), T0 + timedelta(seconds=min(t + dur, span_s))
                        cp.write_row(
                            (
                                kind,
                                f"{kind}|{run_id}|{t}",
                                run_id,
                                "warning",
                                "resolved",
                                a,
                                b,
                                b,
                                json.dumps(evidence),
                            )
                        )
                        n += 1
                        t += every
        conn.execute("ANALYZE incidents")
    return n


def timed(
    conn: psycopg.Connection, runs: list[Run], source: str, repeat: int, max_gap_s: float, ledger: bool = True
) -> tuple[float, list[AccountingBody]]:
    times: list[float] = []
    bodies: list[AccountingBody] = []
    for _ in range(repeat):
        t = time.perf_counter()
        bodies = account_runs(conn, runs, source=source, max_gap_s=max_gap_s, ledger=ledger)  # type: ignore[arg-type]
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), bodies


def total(bodies: list[AccountingBody], key: str) -> float:
    got: list[Any] = [dict(b)[key] for b in bodies]
    return float(sum(float(v or 0.0) for v in got))


def ledger_gap(bodies: list[AccountingBody]) -> Decimal:
    """The largest difference between a run's GPU-hours and its ledger's states added up (0: exact)."""
    gap = Decimal(0)
    for b in bodies:
        states = sum((Decimal(repr(v["gpu_hours"])) for v in b["ledger"].values()), Decimal(0))
        gap = max(gap, abs(states - Decimal(repr(b["gpu_hours"]))))
    return gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument(
        "--runs", type=int, default=512, help="runs the GPUs are split into (1: one run of them all)"
    )
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions of the rollup answers")
    ap.add_argument("--raw-repeat", type=int, default=1, help="timed repetitions of the raw answer")
    ap.add_argument("--max-gap-s", type=float, default=60.0)
    ap.add_argument("--server", default=None, help="maintenance-database URL (default: the test server)")
    args = ap.parse_args()
    if not 1 <= args.runs <= args.gpus:
        ap.error(f"--runs must be between 1 and --gpus ({args.gpus}), not {args.runs}")

    server = args.server or server_url()
    samples = int(args.gpus * args.days * 86_400 / args.interval_s)
    need = samples * BYTES_PER_SAMPLE * 2 + (2 << 30)
    with psycopg.connect(server, autocommit=True) as conn:
        where, free = free_bytes(conn)
    if free < need:
        sys.exit(
            f"bench/accounting.py: {free / 1e9:.1f} GB free at {where}, about {need / 1e9:.1f} GB needed "
            f"for {samples:,} samples; use --gpus or --days to scale down"
        )
    say(
        f"{args.gpus} GPUs in {args.runs} runs x {args.days:g} days at {args.interval_s:g} s: ~{samples:,} GPU "
        f"samples ({free / 1e9:.0f} GB free at {where})"
    )
    with scratch_database(server, "gpufleet_bench_acct") as url:
        migrate.upgrade(url, load_settings(database_url=url))
        info = load(url, args, say)
        t = time.perf_counter()
        incidents = add_incidents(url, args.days * 86_400)
        say(f"{incidents:,} incidents written in {time.perf_counter() - t:.0f} s")
        with psycopg.connect(url, autocommit=True) as conn:
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
            runs = load_runs(conn, run_ids(args.runs))
            # first with nothing kept (each reader after the first reads the priced pieces it kept:
            # gpufleet.accounting.priced_store, and the claims: kept_claims), then warm
            conn.execute("TRUNCATE priced_pieces, kept_claims")
            cold_bare_ms, _ = timed(conn, runs, "auto", 1, args.max_gap_s, ledger=False)
            conn.execute("TRUNCATE priced_pieces, kept_claims")
            cold_ms, _ = timed(conn, runs, "auto", 1, args.max_gap_s)
            # interleaved, so a drift of the machine's load weighs on both alike
            bare_ms, bare = timed(conn, runs, "auto", args.repeat, args.max_gap_s, ledger=False)
            auto_ms, auto = timed(conn, runs, "auto", args.repeat, args.max_gap_s)
            bare2_ms, _ = timed(conn, runs, "auto", args.repeat, args.max_gap_s, ledger=False)
            auto2_ms, _ = timed(conn, runs, "auto", args.repeat, args.max_gap_s)
            rollup_ms, rolled = timed(conn, runs, "rollup", args.repeat, args.max_gap_s)
            raw_ms, raw = timed(conn, runs, "raw", args.raw_repeat, args.max_gap_s)
    bare_ms, auto_ms = min(bare_ms, bare2_ms), min(auto_ms, auto2_ms)
    errs = {
        k: abs(total(auto, k) - total(raw, k)) / abs(total(raw, k)) if total(raw, k) else abs(total(auto, k))
        for k in KEYS
    }
    max_err = max(errs.values())
    gap = ledger_gap(auto)
    waste = sum(total([b], "gpu_hours") - float(b["ledger"]["productive"]["gpu_hours"] or 0) for b in auto)
    hours = total(auto, "gpu_hours")
    say(
        f"database {size / 1e9:.2f} GB; {len(runs)} runs: {total(raw, 'gpu_kwh'):.1f} GPU kWh, "
        f"{total(raw, 'facility_kwh'):.1f} facility kWh, {total(raw, 'co2e_kg'):.1f} kg CO2e, "
        f"{total(raw, 'total_cost'):.2f} {raw[0]['currency']}; {waste:.1f} of {hours:.1f} GPU-hours wasted "
        f"({100 * waste / hours:.1f} %); every ledger adds up to its run's GPU-hours "
        + ("exactly" if gap == 0 else f"within {gap} h")
    )
    say(
        f"accounting from rollups: {auto_ms:.1f} ms with the ledger, {bare_ms:.1f} ms without "
        f"(ledger/without {auto_ms / bare_ms:.2f}x), {rollup_ms:.1f} ms (rollup); from raw samples: {raw_ms:.0f} ms; "
        f"raw/rollup {raw_ms / auto_ms:.0f}x; max relative difference {max_err:.2e} "
        f"({max(errs, key=errs.__getitem__)})"
    )
    say(
        f"the first reader (nothing kept yet): {cold_ms:.1f} ms with the ledger, {cold_bare_ms:.1f} ms without "
        f"({cold_ms / cold_bare_ms:.2f}x)"
    )
    same = all(total(bare, k) == total(auto, k) for k in KEYS)
    say(
        "target: the ledger in the same time class as the accounting without it (within 2x): "
        + ("met" if auto_ms < 2 * bare_ms else "NOT met")
        + "; rollup == raw within 0.1%: "
        + ("met" if max_err < 1e-3 else "NOT met")
        + ("" if same else "; the ledger changed the run's figures!")
    )
    print(
        json.dumps(
            {
                "name": "accounting",
                "value": round(auto_ms, 2),
                "unit": "ms",
                "baseline": round(bare_ms, 2),
                "gpus": args.gpus,
                "runs": len(runs),
                "days": args.days,
                "interval_s": args.interval_s,
                **info,
                "incidents": incidents,
                "db_bytes": size,
                "latency_ms": round(auto_ms, 2),
                "no_ledger_ms": round(bare_ms, 2),
                "ledger_ratio": round(auto_ms / bare_ms, 2),
                "cold_latency_ms": round(cold_ms, 2),
                "cold_no_ledger_ms": round(cold_bare_ms, 2),
                "rollup_latency_ms": round(rollup_ms, 2),
                "raw_latency_ms": round(raw_ms, 1),
                "ratio": round(raw_ms / auto_ms, 1),
                "max_rel_err": max_err,
                "source": auto[0]["source"],
                "rolled_equal": all(total(rolled, k) == total(auto, k) for k in KEYS),
                "ledger_exact": gap == 0,
                "waste_share": round(waste / hours, 4) if hours else 0.0,
            }
        )
    )


if __name__ == "__main__":
    main()
