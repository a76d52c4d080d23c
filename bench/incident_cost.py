"""What incidents cost, priced from the accounting definition: latency beside the run's own line.

    python bench/incident_cost.py [--gpus 64] [--days 1] [--interval-s 10] [--repeat 5]

Loads one run as ``bench/accounting.py`` does (a scratch database, dated
site settings, an hourly carbon series, rollups built), then adds its
incidents: a job-wide checkpoint stall every 30 minutes (2 minutes, 30 % of
the time lost), throttling of one node's 8 GPUs for one reason every hour
(20 minutes, clocks at 0.7), and a starvation episode every 4 hours (45
minutes, duty cycle 0.6) that overlaps both.  Then, in the same run, it times
(medians of ``--repeat``):

* ``run_line_ms``: the run's own accounting line (``gpufleet_accounting``), the baseline;
* ``lost_line_ms``: its ``lost_to_incidents`` line (the union of every incident's claim);
* ``incidents_ms``: every incident's own ``lost`` block (what ``GET /v1/incidents?run_id=`` prices);
* ``first_read_ms``: that block's first read with nothing kept, and ``first_read_ahead_ms`` the same
  first read after the collector's leader priced the closed incidents ahead (``ahead_ms``, off
  every reader's path: :mod:`gpufleet.accounting.ahead`).

and prints the lost GPU-hours of the union beside the sum of the incidents'
(overlaps counted once).  The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.accounting import GPUS_PER_NODE, T0, load
from bench.common import say
from gpufleet.accounting.ahead import PriceAhead
from gpufleet.accounting.incidents import incident_costs, lost_to_incidents
from gpufleet.accounting.lines import lines
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.store.run_model import load_runs
from testsupport.pg import server_url


def add_incidents(conn: psycopg.Connection, span_s: float, nodes: int) -> int:
    rows: list[tuple[Any, ...]] = []

    def add(
        kind: str,
        start_s: float,
        dur_s: float,
        ev: dict[str, Any],
        node: str | None = None,
        cause: str | None = None,
    ) -> None:
        a, b = T0 + timedelta(seconds=start_s), T0 + timedelta(seconds=min(start_s + dur_s, span_s))
        rows.append((kind, f"{kind}|{len(rows)}", "bench", node, cause, a, b, b, json.dumps(ev)))

    for k in range(int(span_s // 1800)):
        add("checkpoint_stall", 1800 * k + 600, 120, {"run_time_lost_share": 0.3})
    for k in range(int(span_s // 3600)):
        node = f"node{k % nodes:04d}"
        per = {"throttled_share": 0.9, "clock_ratio": 0.7}
        add(
            "throttling",
            3600 * k + 300,
            1200,
            {**per, "gpus": [{"node": node, "gpu": g, **per} for g in range(GPUS_PER_NODE)]},
            node,
            "thermal",
        )
    for k in range(int(span_s // 14_400)):
        add("starvation", 14_400 * k + 200, 2700, {"duty_cycle": 0.6}, cause="io")
    with conn.cursor() as cur:
        cur.executemany(
            'INSERT INTO incidents (kind, scope_key, run_id, node, cause, severity, state, start, "end", last_seen, '
            "evidence) VALUES (%s, %s, %s, %s, %s, 'warning', 'resolved', %s, %s, %s, %s)",
            rows,
        )
    return len(rows)


def median_ms(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-gap-s", type=float, default=60.0)
    ap.add_argument("--server", default=None, help="maintenance-database URL (default: the test server)")
    args = ap.parse_args()

    span_s = args.days * 86_400
    with scratch_database(args.server or server_url(), "gpufleet_bench_incost") as url:
        migrate.upgrade(url, load_settings(database_url=url))
        info = load(url, args, say)
        with psycopg.connect(url, autocommit=True) as conn:
            n = add_incidents(conn, span_s, info["nodes"])
            now = datetime.now(UTC)
            runs = load_runs(conn, ["bench"])
            window = {"bench": runs[0].window(now)}
            cols = ("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence")
            incs = [
                dict(zip(cols, r, strict=True))
                for r in conn.execute(
                    'SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents'
                ).fetchall()
            ]
            costs_of = lambda: incident_costs(conn, incs, now=now, max_gap_s=args.max_gap_s)  # noqa: E731
            conn.execute("TRUNCATE priced_pieces")
            first_ms, _ = median_ms(costs_of, 1)
            conn.execute("TRUNCATE priced_pieces")
            # the fleet is dated (T0), the clock is not: look back to its start
            ahead = PriceAhead(
                args.max_gap_s, recent_s=(now - T0).total_seconds() + 86_400, budget_s=float("inf")
            )
            ahead_ms, (ahead_incidents, _) = median_ms(lambda: ahead.run(conn, now), 1)
            if ahead_incidents != n:
                raise SystemExit(f"the leader's pass priced {ahead_incidents} of the {n} incidents")
            first_ahead_ms, _ = median_ms(costs_of, 1)
            run_ms, run_lines = median_ms(
                lambda: lines(conn, None, None, now, run_ids=["bench"], max_gap_s=args.max_gap_s), args.repeat
            )
            lost_ms, lost = median_ms(
                lambda: lost_to_incidents(conn, runs, window, now=now, max_gap_s=args.max_gap_s), args.repeat
            )
            inc_ms, costs = median_ms(costs_of, args.repeat)
    line = run_lines[0]
    union = lost["bench"]
    summed = sum(c["gpu_hours"] for c in costs.values() if c)
    say(
        f"run: {float(line.gpu_hours):.1f} GPU-h, {float(line.total_cost):.2f} {line.currency}; {n} incidents"
    )
    say(
        f"lost to incidents: {union['gpu_hours']:.3f} GPU-h ({summed:.3f} summed over incidents: overlaps counted "
        f"once), {union['facility_kwh']:.3f} facility kWh, {union['total_cost']:.2f} {union['currency']}"
    )
    say(
        f"run line {run_ms:.1f} ms (baseline); lost_to_incidents {lost_ms:.1f} ms; "
        f"{n} incidents' own costs {inc_ms:.1f} ms"
    )
    say(
        f"incidents' own costs, first read: {first_ms:.1f} ms with nothing kept, {first_ahead_ms:.1f} ms after "
        f"the leader priced them ahead ({ahead_ms:.1f} ms, off the readers' path)"
    )
    print(
        json.dumps(
            {
                "name": "incident_cost",
                "value": round(lost_ms, 2),
                "unit": "ms",
                "baseline_ms": round(run_ms, 2),
                "incidents_ms": round(inc_ms, 2),
                "first_read_ms": round(first_ms, 2),
                "first_read_ahead_ms": round(first_ahead_ms, 2),
                "ahead_ms": round(ahead_ms, 2),
                "incidents": n,
                "gpus": args.gpus,
                "days": args.days,
                "interval_s": args.interval_s,
                "lost_gpu_hours": union["gpu_hours"],
                "summed_gpu_hours": round(summed, 9),
                "run_gpu_hours": float(line.gpu_hours),
                "lost_total_cost": union["total_cost"],
                "run_total_cost": float(line.total_cost),
                "currency": union["currency"],
            }
        )
    )


if __name__ == "__main__":
    main()
