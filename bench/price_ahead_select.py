"""The leader's pricing pass: its selects of what closed in the last hour, with and without the end indexes.

    python bench/price_ahead_select.py [--incidents 170000] [--runs 20000] [--days 30] [--repeat 20]

After every sweep the collector's leader selects the incidents that closed and the runs that ended
since its last pass (:mod:`gpufleet.accounting.ahead`).  This fills a scratch database with
``--incidents`` resolved incidents and ``--runs`` ended runs spread over ``--days`` days, and times
both selects as the pass runs them (best of ``--repeat``) with migration 0025's indexes on ``"end"``
and, as the baseline in the same run, with them dropped inside a transaction that is rolled back.
The last line is JSON: the incidents' select with the index, in ms, beside the baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from gpufleet.accounting import ahead
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url

FILL = (
    """
INSERT INTO runs (run_id, start, "end")
SELECT 'r' || i, now() - make_interval(days => %(days)s) + (i * %(run_step)s) * INTERVAL '1 second',
       now() - make_interval(days => %(days)s) + (i * %(run_step)s + 3600) * INTERVAL '1 second'
FROM generate_series(1, %(runs)s) i""",
    """
INSERT INTO incidents (kind, scope_key, run_id, start, "end", last_seen, state)
SELECT 'checkpoint_stall', 'k' || i, 'r' || (1 + i %% %(runs)s),
       now() - make_interval(days => %(days)s) + (i * %(inc_step)s) * INTERVAL '1 second',
       now() - make_interval(days => %(days)s) + (i * %(inc_step)s + 300) * INTERVAL '1 second', now(), 'resolved'
FROM generate_series(1, %(incidents)s) i""",
)


def _best(conn: psycopg.Connection, query: str, params: tuple[Any, ...], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        conn.execute(query, params).fetchall()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--incidents", type=int, default=170_000)
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if min(args.incidents, args.runs, args.days, args.repeat) < 1:
        ap.error("--incidents, --runs, --days and --repeat must be positive")
    span_s = args.days * 86_400
    with scratch_database(server_url(), "gpufleet_price_ahead") as url:
        migrate.upgrade(url, load_settings(database_url=url))
        with psycopg.connect(url, autocommit=True) as conn:
            params = {
                "days": args.days,
                "runs": args.runs,
                "incidents": args.incidents,
                "run_step": span_s / args.runs,
                "inc_step": span_s / args.incidents,
            }
            for stmt in FILL:
                conn.execute(stmt, params)
            conn.execute("ANALYZE incidents")
            conn.execute("ANALYZE runs")
            row = conn.execute("SELECT now() - INTERVAL '1 hour', now()").fetchone()
            assert row is not None
            window = (row[0], row[1])
            indexed = [_best(conn, q, window, args.repeat) for q in (ahead._CLOSED_SQL, ahead._ENDED_SQL)]
            with conn.transaction(force_rollback=True):
                conn.execute("DROP INDEX incidents_end_idx")
                conn.execute("DROP INDEX runs_end_idx")
                bare = [_best(conn, q, window, args.repeat) for q in (ahead._CLOSED_SQL, ahead._ENDED_SQL)]
    print(
        f"{args.incidents:,} incidents, {args.runs:,} runs over {args.days} days; the pass's selects of the last "
        f"hour: incidents {indexed[0]:.3f} ms with the index, {bare[0]:.2f} ms without; runs {indexed[1]:.3f} ms "
        f"with, {bare[1]:.2f} ms without"
    )
    print(
        json.dumps(
            {
                "name": "price_ahead_select",
                "value": round(indexed[0], 3),
                "unit": "ms (closed incidents of the last hour, best of repeats)",
                "baseline": round(bare[0], 3),
                "runs_ms": round(indexed[1], 3),
                "runs_baseline_ms": round(bare[1], 3),
                "incidents": args.incidents,
                "runs": args.runs,
                "days": args.days,
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        )
    )


if __name__ == "__main__":
    main()
