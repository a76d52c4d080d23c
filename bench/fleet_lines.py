"""The fleet-wide accounting call, installed text against an earlier one, on one synthesised fleet.

    python bench/fleet_lines.py [--gpus 64] [--days 2] [--repeat 5] [--baseline gpufleet_accounting.v4]
                                [--periods 2,7,30] [--database URL]

Every fleet-wide read (``/v1/accounting``, the finance and FOCUS reports, the waste view, the finance
board) is one call of ``gpufleet_accounting`` with its fleet lines.  This times that call over 2, 7 and
30 days (``--periods``) as the database has it installed and, as the baseline in the same run, the earlier text named
by ``--baseline`` (a file of ``gpufleet/db/sql``) installed beside it for this session only
(``pg_temp``), the two called alternately so neither gets the warmer cache.  The fleet is
:mod:`bench.read_side`'s (``--gpus`` GPUs, ``--days`` days of runs, the last two hours raw at 30 s),
or an existing database made by ``bench/read_side.py --keep`` (``--database``).  Before timing, the
fleet's closed hours are kept as the collector's leader keeps them (:mod:`gpufleet.accounting.fleet_hours`):
from accounting V7 on, a fleet-wide call sums those and prices the rest live.  Both texts must give
the same lines (checked on the first call of each period).  The last line is JSON: the installed
text's p50 over the longest period, with the baseline's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg

from bench.common import say
from bench.read_side import Plan, synthesise
from gpufleet.accounting import fleet_hours
from gpufleet.config import load_settings
from gpufleet.db import migrate, sql_files
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url

CALL = "SELECT * FROM {fn}(%s, %s, %s, NULL, true, 60, 'auto', 'line', NULL) ORDER BY 1, 2, 3, 24"


def _time(conn: psycopg.Connection, fn: str, lo: datetime, hi: datetime) -> tuple[float, list[tuple]]:
    t = time.perf_counter()
    rows = conn.execute(CALL.format(fn=fn), (lo, hi, hi)).fetchall()
    return (time.perf_counter() - t) * 1000, rows


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """The same lines, floats and decimals to 1e-12 of their size (or 2e-9): a sum in another order
    differs in its last bits, and the GPU-hours of a day of 10,000 GPUs summed from hundreds of thousands
    of double-precision pieces read 121,343.999999966 one way and 121,344.000000000 the other."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float | Decimal) and isinstance(v, float | Decimal):
                if abs(float(u) - float(v)) > 1e-12 * max(abs(float(u)), abs(float(v))) + 2e-9:
                    return False
            elif u != v:
                return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--days", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", default="gpufleet_accounting.v4", help="a file of gpufleet/db/sql")
    ap.add_argument("--database", help="an existing database made by bench/read_side.py --keep")
    ap.add_argument("--periods", default="2,7,30", help="days before now each call covers, comma-separated")
    args = ap.parse_args()
    try:
        periods = sorted({float(d) for d in args.periods.split(",")})
    except ValueError:
        ap.error(f"--periods must be numbers of days separated by commas, not {args.periods!r}")
    if not periods or periods[0] <= 0:
        ap.error(f"--periods must be positive numbers of days, not {args.periods!r}")
    started = time.perf_counter()
    try:
        text = sql_files.text(args.baseline)
    except OSError as e:
        raise SystemExit(f"{args.baseline}: no such text in gpufleet/db/sql ({e})") from None
    head = "FUNCTION gpufleet_accounting("
    if head not in text:
        raise SystemExit(f"{args.baseline}: not a text of gpufleet_accounting")
    settings = load_settings()
    with contextlib.ExitStack() as stack:
        gpus, days_of_runs = args.gpus, args.days
        if args.database:
            url = args.database
            migrate.upgrade(url, load_settings(database_url=url))
            with psycopg.connect(url) as conn:  # the fleet the database holds, not the arguments' defaults
                row = conn.execute("SELECT plan FROM bench_read_side").fetchone()
            if row is None:
                raise SystemExit(
                    f"{url}: not a database bench/read_side.py synthesised (no bench_read_side row)"
                )
            gpus, days_of_runs = int(row[0]["gpus"]), float(row[0]["days"])
        else:
            url = stack.enter_context(scratch_database(server_url(), "gpufleet_fleet_lines"))
            migrate.upgrade(url, load_settings(database_url=url))
            plan = Plan(args.gpus, args.days, max(args.days - 2 / 24, 0.0), 2.0, 30.0)
            synthesise(url, plan, settings, say)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(text.replace(head, "FUNCTION pg_temp.accounting_baseline(", 1))
            # the closed hours the collector's leader keeps (every one missing, newest first), as it would
            t0 = time.perf_counter()
            kept = fleet_hours.keep(conn, fleet_hours.keeping_of(settings), datetime.now(UTC), math.inf)
            say(
                f"kept {kept} closed hours of the fleet's accounting, as the leader does ({time.perf_counter() - t0:.0f} s)"
            )
            now = datetime.now(UTC)
            results = {}
            for days in periods:
                lo = now - timedelta(days=days)
                got: dict[str, list[float]] = {"installed": [], "baseline": []}
                _, a = _time(conn, "gpufleet_accounting", lo, now)
                _, b = _time(conn, "pg_temp.accounting_baseline", lo, now)
                if not _same(a, b):
                    raise SystemExit(
                        f"{days:g} d: the installed text and {args.baseline} give different lines"
                    )
                for _ in range(args.repeat):
                    got["installed"].append(_time(conn, "gpufleet_accounting", lo, now)[0])
                    got["baseline"].append(_time(conn, "pg_temp.accounting_baseline", lo, now)[0])
                p50 = {k: statistics.median(v) for k, v in got.items()}
                results[f"{days:g}d"] = {k: round(v, 1) for k, v in p50.items()}
                say(
                    f"{days:>4g} d, {len(a)} lines: installed p50 {p50['installed']:7.1f} ms, "
                    f"{args.baseline} p50 {p50['baseline']:7.1f} ms ({p50['baseline'] / p50['installed']:.2f}x)"
                )
    print(
        json.dumps(
            {
                "name": "fleet_lines",
                "value": results[f"{periods[-1]:g}d"]["installed"],
                "unit": f"ms (p50, {periods[-1]:g}-day fleet accounting)",
                "baseline": results[f"{periods[-1]:g}d"]["baseline"],
                "baseline_text": args.baseline,
                "periods": results,
                "gpus": gpus,
                "days": days_of_runs,
                "repeat": args.repeat,
                "seconds": round(time.perf_counter() - started, 1),
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        )
    )


if __name__ == "__main__":
    main()
