"""Per-run accounting latency of this tree beside an earlier one's, on the same data in the same run.

    python bench/accounting_before_after.py --baseline-tree /tmp/acct-base [--gpus 64] [--runs 8] [--days 1]

A change to the accounting (its SQL definition, what the Python around it adds)
is measured against the code before it: ``--baseline-tree`` is a checkout of the
earlier commit (``git worktree add /tmp/acct-base <commit>``).  One scratch
database is filled as ``bench/accounting.py`` fills it (its ``load``: a site
with dated PUE, prices and an hourly carbon series, the GPUs split into
``--runs`` runs, the energy rollups built), migrated to this tree's head, then
copied (``CREATE DATABASE ... TEMPLATE``) and the copy migrated down to the
earlier tree's head with this tree's own downgrades, which put back exactly the
texts each earlier migration installed: each side's Python reads its own SQL
definitions over the same rows.

Each side then runs in a process of its own (its ``gpufleet`` first on the
path): ``account_runs`` over every run from rollups (``source="auto"``, the
API's answer), ``--repeat`` times, the median kept; the sides alternate ``--rounds`` times
and the lowest median of each counts, so a drift of the machine's load weighs
on both alike.  The SQL definition's lines alone are timed beside it.  It also compares the two sides' energies (they must agree; the
money differs by design where the earlier tree rounded it).  The last line is
JSON: ``value`` (this tree's ms), ``baseline_ms``, ``ratio`` and the largest
relative difference of the energies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENERGIES = ("gpu_hours", "gpu_kwh", "host_kwh", "it_kwh", "facility_kwh", "co2e_kg")


def worker(tree: Path, url: str, search_path: str, run_ids: list[str], repeat: int, max_gap_s: float) -> None:
    """Time ``account_runs`` of the ``gpufleet`` in ``tree`` (first on the path) and print JSON."""
    sys.path.insert(0, str(tree))
    import inspect

    import psycopg

    from gpufleet import accounting  # the tree's own

    assert Path(accounting.__file__).resolve().is_relative_to(tree.resolve()), accounting.__file__
    from datetime import UTC, datetime

    from gpufleet.accounting.lines import lines
    from gpufleet.accounting.snapshot import snapshot

    with psycopg.connect(url, autocommit=True, options=f"-c search_path={search_path}") as conn:
        runs = accounting.load_runs(conn, run_ids)
        extra = {"ledger": True} if "ledger" in inspect.signature(accounting.account_runs).parameters else {}
        times, sql, bodies = [], [], []
        for _ in range(repeat):
            t = time.perf_counter()
            bodies = accounting.account_runs(conn, runs, source="auto", max_gap_s=max_gap_s, **extra)
            times.append((time.perf_counter() - t) * 1000)
            # the SQL definition alone, as account_runs calls it
            t = time.perf_counter()
            with snapshot(conn):
                lines(
                    conn, None, None, datetime.now(UTC), run_ids=run_ids, max_gap_s=max_gap_s, source="auto"
                )
            sql.append((time.perf_counter() - t) * 1000)
    totals = {k: sum(float(b[k] or 0.0) for b in bodies) for k in ENERGIES}
    print(
        json.dumps(
            {
                "ms": statistics.median(times),
                "sql_ms": statistics.median(sql),
                "runs": len(bodies),
                "totals": totals,
            }
        )
    )


def _side(
    tree: Path, url: str, search_path: str, run_ids: list[str], repeat: int, max_gap_s: float
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        str(tree),
        "--url",
        url,
        "--search-path",
        search_path,
        "--repeat",
        str(repeat),
        "--max-gap-s",
        str(max_gap_s),
        "--run-ids",
        ",".join(run_ids),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tree)
    if out.returncode != 0:
        sys.exit(f"bench/accounting_before_after.py: the {tree} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _baseline_head(tree: Path) -> str:
    """The revision the earlier tree's migrations end at, as its own code reads them."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from alembic.script import ScriptDirectory; "
        "from gpufleet.db import migrate; "
        "print(ScriptDirectory.from_config(migrate.alembic_config('', False)).get_current_head())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tree)], capture_output=True, text=True, check=False, cwd=tree
    )
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit(
            f"bench/accounting_before_after.py: {tree}: its migrations' head unreadable:\n{out.stderr[-2000:]}"
        )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-tree", type=Path, help="a checkout of the earlier commit")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--interval-s", type=float, default=10.0)
    ap.add_argument(
        "--repeat", type=int, default=5, help="timed calls per side and round (the median counts)"
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="times the two sides alternate (the lowest median counts)"
    )
    ap.add_argument("--max-gap-s", type=float, default=60.0)
    ap.add_argument("--server", default=None, help="maintenance-database URL (default: the test server)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--search-path", default="public", help=argparse.SUPPRESS)
    ap.add_argument("--run-ids", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.url, args.search_path, args.run_ids.split(","), args.repeat, args.max_gap_s)
        return
    if args.baseline_tree is None or not (args.baseline_tree / "gpufleet" / "accounting").is_dir():
        ap.error(
            "--baseline-tree: a checkout of the earlier commit (git worktree add /tmp/acct-base <commit>)"
        )
    # Imported here, not at the top: a --worker process must import the gpufleet of its own tree first.
    import psycopg
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    from psycopg import sql

    from bench import accounting as bench_accounting
    from gpufleet.config import load_settings
    from gpufleet.db import migrate
    from gpufleet.db.connect import with_database
    from gpufleet.db.scratch import scratch_database
    from testsupport.pg import server_url

    server = args.server or server_url()
    base_head = _baseline_head(args.baseline_tree)
    revisions = ScriptDirectory.from_config(migrate.alembic_config("", False))
    try:
        known = revisions.get_revision(base_head) is not None
    except CommandError:
        known = False
    if not known:
        sys.exit(
            f"bench/accounting_before_after.py: {args.baseline_tree} ends at revision {base_head}, not one of this tree's"
        )
    print(
        f"{args.gpus} GPUs in {args.runs} runs x {args.days:g} days at {args.interval_s:g} s; baseline "
        f"{args.baseline_tree}",
        flush=True,
    )
    with scratch_database(server, "gpufleet_bench_before_after") as url:
        migrate.upgrade(url, load_settings(database_url=url))
        bench_accounting.load(
            url,
            argparse.Namespace(
                gpus=args.gpus,
                runs=args.runs,
                days=args.days,
                interval_s=args.interval_s,
                max_gap_s=args.max_gap_s,
            ),
            lambda m: print(m, flush=True),
        )
        name = url.rsplit("/", 1)[1].split("?")[0]
        base_name = name + "_base"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(base_name), sql.Identifier(name)
                )
            )
        base_url = with_database(url, base_name)
        try:
            migrate.downgrade(base_url, base_head)
            print(f"baseline database at revision {migrate.current(base_url)}", flush=True)
            ids = bench_accounting.run_ids(args.runs)
            sides: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
            for _ in range(args.rounds):
                sides["baseline"].append(
                    _side(args.baseline_tree.resolve(), base_url, "public", ids, args.repeat, args.max_gap_s)
                )
                sides["current"].append(_side(ROOT, url, "public", ids, args.repeat, args.max_gap_s))
        finally:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(base_name))
                )
    base_ms = min(s["ms"] for s in sides["baseline"])
    cur_ms = min(s["ms"] for s in sides["current"])
    base_sql = min(s["sql_ms"] for s in sides["baseline"])
    cur_sql = min(s["sql_ms"] for s in sides["current"])
    bt, ct = sides["baseline"][0]["totals"], sides["current"][0]["totals"]
    err = max(abs(ct[k] - bt[k]) / abs(bt[k]) if bt[k] else abs(ct[k]) for k in ENERGIES)
    print(
        f"account_runs of {len(ids)} runs from rollups: {cur_ms:.0f} ms now, {base_ms:.0f} ms at the baseline "
        f"({cur_ms / base_ms:.2f}x); its SQL lines alone {cur_sql:.0f} ms now, {base_sql:.0f} ms at the baseline "
        f"({cur_sql / base_sql:.2f}x); energies agree to {err:.1e}"
    )
    print(
        json.dumps(
            {
                "name": "accounting_before_after",
                "value": round(cur_ms, 1),
                "unit": "ms",
                "baseline_ms": round(base_ms, 1),
                "ratio": round(cur_ms / base_ms, 3),
                "sql_ms": round(cur_sql, 1),
                "baseline_sql_ms": round(base_sql, 1),
                "sql_ratio": round(cur_sql / base_sql, 3),
                "max_rel_err_energies": err,
                "gpus": args.gpus,
                "runs": len(ids),
                "days": args.days,
                "baseline_tree": str(args.baseline_tree),
            }
        )
    )


if __name__ == "__main__":
    main()
