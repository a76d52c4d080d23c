"""Registering runs in bulk: the cost of the pricing marks on a COPY of backfilled allocations.

    python bench/register_runs.py [--runs 16,64] [--days 30] [--server URL]

A scheduler import or a late registration inserts allocations of runs that started long ago; each
allocation marks the fleet's hours from its run's start to now (``gpufleet.db.fleet_hours_sql``) and
its run's priced-store mark.  For each ``--runs`` N, on a migrated scratch database with N × 8 nodes
registered ``--days`` + 1 days ago, N runs of 64 GPUs started ``--days`` ago are registered and their
N × 64 allocations copied in one COPY, timed; the **baseline** is the same COPY, in the same run, with
the table's own triggers disabled (foreign keys and exclusion constraints still checked), so the
difference is what the marks cost.  Last line JSON: the largest N's seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.common import say
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url


def _copy(conn: psycopg.Connection, runs: int, days: float, tag: str, marks: bool) -> float:
    now = datetime.now(UTC)
    start = now - timedelta(days=days)
    with conn.transaction(), conn.cursor().copy('COPY runs (run_id, start, "end") FROM STDIN') as cp:
        for i in range(runs):
            cp.write_row((f"{tag}{i}", start, start + timedelta(hours=40)))
    with conn.transaction():
        if not marks:
            conn.execute("ALTER TABLE run_allocations DISABLE TRIGGER USER")
        t = time.perf_counter()
        with conn.cursor().copy("COPY run_allocations (run_id, node, gpu) FROM STDIN") as cp:
            for i in range(runs):
                for n in range(8):
                    for g in range(8):
                        cp.write_row((f"{tag}{i}", f"n{i * 8 + n}", g))
        took = time.perf_counter() - t
        if not marks:
            conn.execute("ALTER TABLE run_allocations ENABLE TRIGGER USER")
    # the runs go again, so the next measurement finds the same GPUs free
    conn.execute("DELETE FROM runs WHERE run_id LIKE %s", (f"{tag}%",))
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="16,64", help="comma-separated numbers of 64-GPU runs per COPY")
    ap.add_argument("--days", type=float, default=30.0, help="how long ago the runs started")
    ap.add_argument("--server", default=None, help="maintenance-database URL (default: the test server)")
    args = ap.parse_args()
    counts = [int(x) for x in args.runs.split(",") if x]
    out: dict[int, tuple[float, float]] = {}
    with scratch_database(args.server or server_url(), "gpufleet_register") as url:
        migrate.upgrade(url, Settings())
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO nodes (node, first_seen) SELECT 'n' || i, now() - %s * interval '1 day' "
                "FROM generate_series(0, %s) i",
                (args.days + 1, max(counts) * 8),
            )
            for n in counts:
                base = _copy(conn, n, args.days, "b", marks=False)
                took = _copy(conn, n, args.days, "m", marks=True)
                out[n] = (took, base)
                say(
                    f"{n} runs, {n * 64} allocations in one COPY: {took:.3f} s (baseline, no marks: {base:.3f} s)"
                )
    top = max(counts)
    print(
        json.dumps(
            {
                "name": "register_runs",
                "value": round(out[top][0], 4),
                "unit": "s",
                "baseline": round(out[top][1], 4),
                "allocations": top * 64,
                "days_back": args.days,
            }
        )
    )


if __name__ == "__main__":
    main()
