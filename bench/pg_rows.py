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
backend is counted: no HTTP, no collector, no WAL writer.  Each figure comes
with the WAL the backend wrote per row.

``--variants`` adds the cheap changes to that btree one might try first, each
into a scratch database of its own, all in the same run: the index without
deduplication (its keys are all distinct), the node column collated "C"
(byte comparisons instead of the locale's), and each request's rows sorted
by GPU and time before the COPY (each GPU's rows into one leaf page in
turn).  The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
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


#: What each variant changes in a freshly migrated database before the rows are written.
VARIANTS: dict[str, list[str]] = {
    "as_migrated": [],
    "no_btree": ["DROP INDEX gpu_samples_node_gpu_time_idx"],
    "btree_without_deduplication": ["ALTER INDEX gpu_samples_node_gpu_time_idx SET (deduplicate_items = off)"],
    "node_collated_c": ['ALTER TABLE gpu_samples ALTER COLUMN node TYPE text COLLATE "C"'],
    "rows_sorted_by_gpu": [],
}


def sorted_by_gpu(b: Batch) -> Batch:
    """The batch with its GPU rows in (gpu, time) order."""
    order = np.lexsort((b.gpu["time"].values, b.gpu["gpu"].values))
    return dataclasses.replace(b, gpu={k: c.take(order) for k, c in b.gpu.items()}, span=None)


def backend_us_per_row(server: str, todo: list[Batch], group: int, variant: str) -> dict[str, float]:
    if variant == "rows_sorted_by_gpu":
        todo = [sorted_by_gpu(b) for b in todo]
    with scratch_database(server, "gpufleet_pgrows") as url:
        migrate.upgrade(url, load_settings())
        with psycopg.connect(url, autocommit=True) as c:
            for stmt in VARIANTS[variant]:
                c.execute(stmt)
        with psycopg.connect(url) as conn:
            pid, lsn = conn.execute("SELECT pg_backend_pid(), pg_current_wal_insert_lsn()").fetchone()  # type: ignore[misc]
            conn.commit()
            cache, touch = sightings.SightingCache(), NodeTouch(10.0)
            c0, t0 = vs_prometheus.cpu_s(pid), time.perf_counter()
            for i in range(0, len(todo), group):
                with conn.transaction():
                    write_batches(conn, todo[i:i + group], sightings_cache=cache, touch=touch)
            c1, wall = vs_prometheus.cpu_s(pid), time.perf_counter() - t0
            wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn,)).fetchone()[0]  # type: ignore[index]
            rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]  # type: ignore[index]
    return {"rows": rows, "backend_us_per_row": (c1 - c0) / rows * 1e6, "wall_us_per_row": wall / rows * 1e6,
            "wal_bytes_per_row": float(wal) / rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3000, help="nodes of 8 GPUs")
    ap.add_argument("--seconds", type=int, default=100, help="seconds of samples per node")
    ap.add_argument("--group", type=int, default=120, help="requests per transaction")
    ap.add_argument("--variants", action="store_true",
                    help="also measure the btree without deduplication, node collated \"C\", and rows sorted by GPU")
    args = ap.parse_args()
    if min(args.nodes, args.seconds, args.group) <= 0:
        ap.error("--nodes, --seconds and --group must be positive")
    todo = batches(args.nodes, args.seconds)
    server = server_url()
    names = list(VARIANTS) if args.variants else ["as_migrated", "no_btree"]
    got = {name: backend_us_per_row(server, todo, args.group, name) for name in names}
    with_btree, without = got["as_migrated"], got["no_btree"]
    print(f"{len(todo)} batches, {with_btree['rows']} GPU rows, {args.group} requests a transaction")
    labels = {"as_migrated": "as migrated (per-GPU btree)", "no_btree": "baseline, no per-GPU btree"}
    for name, r in got.items():
        print(f"  {labels.get(name, name):30s} {r['backend_us_per_row']:5.2f} us of the backend per row, "
              f"{r['wal_bytes_per_row']:5.0f} B of WAL")
    print(json.dumps({"name": "pg_rows", "value": round(with_btree["backend_us_per_row"], 2),
                      "unit": "backend us per GPU row", "baseline_without_btree": round(without["backend_us_per_row"], 2),
                      # None where the run was too short for the CPU clock's 10-ms ticks to see
                      "btree_share": round(1 - without["backend_us_per_row"] / with_btree["backend_us_per_row"], 3)
                      if with_btree["backend_us_per_row"] else None,
                      "rows": with_btree["rows"], "group": args.group, "with_btree": with_btree,
                      "without_btree": without, "variants": got}))


if __name__ == "__main__":
    main()
