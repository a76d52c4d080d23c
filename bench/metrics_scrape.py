"""What one scrape of a collector's ``/metrics`` costs as the fleet grows.

    python bench/metrics_scrape.py [--nodes 12000] [--scrapes 6]

Every replica's page carries two series per node (when it was last seen and
its skew refusals, read from the ``nodes`` table) beside the process's own
metrics, so its size and cost grow with the fleet on every replica.  Starts a
collector process on loopback against a scratch database and scrapes it
``--scrapes`` times with no nodes known (the baseline, in the same run), then
again after ``--nodes`` nodes are registered; each scrape a few seconds after
the last, past the page's 5-s cache of the database read, so every one reads
and renders.  Prints page size, lines and the collector's CPU per scrape
(median); the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx
import psutil
import psycopg

from bench import ingest as ingest_bench
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import free_port
from testsupport.pg import server_url

#: Longer than the page's cache of its database read (IncidentMetrics.cache_s).
PAUSE_S = 5.5


def cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid``: from the scheduler's nanosecond
    counters where Linux has them (a small page's scrape is under the 10-ms
    tick that ``cpu_times`` counts in), else from ``cpu_times``."""
    tasks = Path(f"/proc/{pid}/task")
    if tasks.is_dir():
        total = 0
        for task in tasks.iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
        return total / 1e9
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def scrapes(port: int, pid: int, count: int) -> dict[str, float]:
    cpu, wall, size, lines = [], [], 0, 0
    for _ in range(count):
        time.sleep(PAUSE_S)
        c0, w0 = cpu_s(pid), time.perf_counter()
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
        wall.append(time.perf_counter() - w0)
        cpu.append(cpu_s(pid) - c0)
        size, lines = len(text.encode()), text.count("\n")
    return {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall), "bytes": size, "lines": lines}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=12_000)
    ap.add_argument("--scrapes", type=int, default=6)
    args = ap.parse_args()
    with scratch_database(server_url(), "gpufleet_scrape") as url:
        migrate.upgrade(url, load_settings())
        port = free_port()
        proc = ingest_bench.start_collector(url, port, leader=False)
        try:
            base = scrapes(port, proc.pid, args.scrapes)
            with psycopg.connect(url) as conn:
                conn.execute(
                    "INSERT INTO nodes (node, first_seen, last_seen, gpu_count, facts, rejected_skew) "
                    "SELECT 'gpu-node-' || lpad(i::text, 6, '0'), now(), now(), 8, '{}'::jsonb, 0 "
                    "FROM generate_series(1, %s) AS i",
                    (args.nodes,),
                )
            fleet = scrapes(port, proc.pid, args.scrapes)
        finally:
            proc.terminate()
            proc.wait(30)
    for name, r in (("no nodes (baseline)", base), (f"{args.nodes} nodes", fleet)):
        print(
            f"{name:>22}: {r['bytes'] / 1e6:6.2f} MB, {r['lines']:7d} lines, "
            f"collector CPU {r['cpu_s'] * 1e3:6.1f} ms, wall {r['wall_s'] * 1e3:6.1f} ms per scrape (median)"
        )
    print(
        json.dumps(
            {
                "name": "metrics_scrape",
                "value": round(fleet["cpu_s"] * 1e3, 1),
                "unit": "ms CPU per scrape",
                "nodes": args.nodes,
                "bytes": fleet["bytes"],
                "lines": fleet["lines"],
                "wall_ms": round(fleet["wall_s"] * 1e3, 1),
                "baseline_cpu_ms": round(base["cpu_s"] * 1e3, 1),
                "baseline_bytes": base["bytes"],
                "baseline_lines": base["lines"],
                "scrapes": args.scrapes,
            }
        )
    )


if __name__ == "__main__":
    main()
