"""What node activity adds to a rollup pass: the worker's pass over a fleet's newest batches, timed.

    python bench/rollup_pass.py [--nodes 1250] [--minutes 50] [--batch-s 10] [--repeat 5]

Fills a scratch database with ``--nodes`` nodes of 8 GPUs (and their host
rows) sampled every second for the last ``--minutes`` minutes, rolls them up
once, then times the pass the collector's leader runs as the fleet's newest
batches arrive (every node's last ``--batch-s`` seconds,
:func:`gpufleet.collector.rollup.rebuild`, plain-PostgreSQL stats included),
``--repeat`` times: the whole pass, and beside it, on the same ranges in the
same run, the node-activity statements alone (``node_activity_1m`` from the
samples, ``node_activity_1h`` from the minutes).  The baseline is the pass
without them (the whole pass less their time).  The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta

import psycopg

from bench.common import say
from gpufleet.collector import rollup
from gpufleet.config import load_settings
from gpufleet.db import activity_sql, migrate
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url

FILL_SQL = """
INSERT INTO gpu_samples (time, node, gpu, util_pct, sm_active, tensor_active, power_w, energy_mj)
SELECT t, 'node-' || lpad(n::text, 5, '0'), g, (n * 7 + g * 13 + extract(epoch FROM t)::int) %% 101,
  0.5, 0.25, 300 + (n + g) %% 400, (extract(epoch FROM t - %(t0)s) * 400000)::bigint
FROM generate_series(%(t0)s::timestamptz, %(t1)s::timestamptz, interval '1 second') t,
  generate_series(0, %(nodes)s - 1) n, generate_series(0, 7) g"""

HOST_SQL = """
INSERT INTO host_samples (time, node, cpu_user_pct, host_power_w)
SELECT t, 'node-' || lpad(n::text, 5, '0'), 20, 500
FROM generate_series(%(t0)s::timestamptz, %(t1)s::timestamptz, interval '1 second') t,
  generate_series(0, %(nodes)s - 1) n"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--minutes", type=int, default=50, help="raw history before the timed batches")
    ap.add_argument("--batch-s", type=float, default=10.0, help="the span of each node's newest batch")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    settings = load_settings()
    gap = settings.accounting.max_gap_s
    t1 = datetime.now(UTC).replace(microsecond=0)
    t0 = t1 - timedelta(minutes=args.minutes)
    with scratch_database(server_url(), "gpufleet_bench") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.perf_counter()
            params = {"t0": t0, "t1": t1, "nodes": args.nodes}
            conn.execute(FILL_SQL, params)
            conn.execute(HOST_SQL, params)
            conn.execute("VACUUM ANALYZE gpu_samples, host_samples")
            nodes = [f"node-{n:05d}" for n in range(args.nodes)]
            with conn.transaction():
                rollup.rebuild(conn, {n: (t0, t1) for n in nodes}, gap, plain_stats=True)
            conn.execute("VACUUM ANALYZE")
            say(
                f"filled {args.nodes * 8:,} GPUs x {args.minutes} min at 1 s and rolled them up "
                f"({time.perf_counter() - started:.0f} s)"
            )

            lo = t1 - timedelta(seconds=args.batch_s)
            ranges = {n: (lo, t1) for n in nodes}
            bind = {"nodes": nodes, "lo": [lo] * len(nodes), "hi": [t1] * len(nodes)}
            whole, activity = [], []
            for _ in range(args.repeat):
                with conn.transaction():
                    a = time.perf_counter()
                    rollup.rebuild(conn, ranges, gap, plain_stats=True)
                    whole.append((time.perf_counter() - a) * 1000)
                with conn.transaction():
                    a = time.perf_counter()
                    for delete, insert in (
                        activity_sql.rebuild_minutes_sql(),
                        activity_sql.rebuild_hours_sql(),
                    ):
                        conn.execute(delete, bind)
                        conn.execute(insert, bind)
                    activity.append((time.perf_counter() - a) * 1000)
    whole_ms, act_ms = statistics.median(whole), statistics.median(activity)
    base_ms = whole_ms - act_ms
    say(
        f"a pass over {args.nodes} nodes' last {args.batch_s:g} s ({args.nodes * 8 * args.batch_s:,.0f} GPU "
        f"samples), median of {args.repeat}: {whole_ms:.0f} ms with node activity; its statements alone "
        f"{act_ms:.0f} ms; the pass without them (baseline) {base_ms:.0f} ms: +{act_ms / base_ms:.0%}"
    )
    print(
        json.dumps(
            {
                "name": "rollup_pass_node_activity",
                "value": round(act_ms, 1),
                "unit": "ms per pass",
                "baseline_ms": round(base_ms, 1),
                "whole_ms": round(whole_ms, 1),
                "added": round(act_ms / base_ms, 3),
                "nodes": args.nodes,
                "batch_s": args.batch_s,
                "repeat": args.repeat,
            }
        )
    )


if __name__ == "__main__":
    main()
