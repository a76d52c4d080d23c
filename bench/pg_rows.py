"""PostgreSQL's CPU per stored GPU-sample, and the per-GPU btree's share of it.

    python bench/pg_rows.py [--nodes 3000] [--seconds 100] [--group 120]

Writes the same batches ``bench/vs_prometheus.py`` ships (8 GPUs a node, 25
values a GPU, the agents' 10-s batches, decoded and validated as the
collector does) through the collector's own storing step
(``write_batches``), ``--group`` requests to a transaction as group commit
gathers them, into a scratch database of the plain-PostgreSQL layout, and
reads the CPU of the database backend that did it from /proc.  Then the same
into a second scratch database without the ``(node, gpu, time)`` btree,
which serves per-GPU reads: the baseline, in the same run.  Only the
backend is counted: no HTTP, no collector, no WAL writer.  The last line is
JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgpack
import psycopg
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import vs_prometheus  # noqa: E402

from gpufleet.collector import sightings  # noqa: E402
from gpufleet.collector.batch_store import NodeTouch, write_batches  # noqa: E402
from gpufleet.config import load_settings  # noqa: E402
from gpufleet.db import migrate  # noqa: E402
from gpufleet.db.scratch import scratch_database  # noqa: E402
from gpufleet.testing.pg import server_url  # noqa: E402
from gpufleet.wire import Batch, validate  # noqa: E402


def batches(nodes: int, seconds: int) -> list[Batch]:
    due = vs_prometheus.gpufleet_bodies(vs_prometheus.value_model(), nodes, ["unused"] * nodes,
                                        int(time.time()) - 2 * seconds, seconds)
    d = zstandard.ZstdDecompressor()
    return [validate(msgpack.unpackb(d.decompress(body), raw=False)) for t in sorted(due) for _, body, _ in due[t]]


def backend_us_per_row(server: str, todo: list[Batch], group: int, btree: bool) -> dict[str, float]:
    with scratch_database(server, "gpufleet_pgrows") as url:
        migrate.upgrade(url, load_settings())
        if not btree:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("DROP INDEX gpu_samples_node_gpu_time_idx")
        with psycopg.connect(url) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            conn.commit()
            cache, touch = sightings.SightingCache(), NodeTouch(10.0)
            c0, t0 = vs_prometheus.cpu_s(pid), time.perf_counter()
            for i in range(0, len(todo), group):
                with conn.transaction():
                    write_batches(conn, todo[i:i + group], sightings_cache=cache, touch=touch)
            c1, wall = vs_prometheus.cpu_s(pid), time.perf_counter() - t0
            rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
    return {"rows": rows, "backend_us_per_row": (c1 - c0) / rows * 1e6, "wall_us_per_row": wall / rows * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3000, help="nodes of 8 GPUs")
    ap.add_argument("--seconds", type=int, default=100, help="seconds of samples per node")
    ap.add_argument("--group", type=int, default=120, help="requests per transaction")
    args = ap.parse_args()
    if min(args.nodes, args.seconds, args.group) <= 0:
        ap.error("--nodes, --seconds and --group must be positive")
    todo = batches(args.nodes, args.seconds)
    server = server_url()
    with_btree = backend_us_per_row(server, todo, args.group, btree=True)
    without = backend_us_per_row(server, todo, args.group, btree=False)
    print(f"{len(todo)} batches, {with_btree['rows']} GPU rows, {args.group} requests a transaction")
    print(f"  as migrated (per-GPU btree): {with_btree['backend_us_per_row']:.2f} us of the backend per row")
    print(f"  baseline, no per-GPU btree:  {without['backend_us_per_row']:.2f} us")
    print(json.dumps({"name": "pg_rows", "value": round(with_btree["backend_us_per_row"], 2),
                      "unit": "backend us per GPU row", "baseline_without_btree": round(without["backend_us_per_row"], 2),
                      "btree_share": round(1 - without["backend_us_per_row"] / with_btree["backend_us_per_row"], 3),
                      "rows": with_btree["rows"], "group": args.group, "with_btree": with_btree,
                      "without_btree": without}))


if __name__ == "__main__":
    main()
