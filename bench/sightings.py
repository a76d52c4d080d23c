"""Cost of run sightings at ingest: GPU rows labelled with a run vs the same rows unlabelled.

    python bench/sightings.py [--nodes 100] [--batches 10] [--rounds 3]

Every GPU sample that names a run (``run_id``, from the agent's attribution)
makes the writer keep that run's first and last sample per GPU in
``run_sightings``, in the same transaction as the samples
(``gpufleet.collector.sightings``).  This writes ``--nodes`` x ``--batches``
batches (8 GPUs x 5 s at 1 Hz each, every contract column filled, as
``testsupport.loadgen`` makes them) through the collector's own write
path (``GroupWriter._write``, 8 batches per transaction) into a scratch
database three ways, in turn for ``--rounds`` rounds: every row labelled
with its node's run, sightings kept (what ingest does); the same rows with
sightings switched off (the baseline: what the labelled rows cost before
sightings existed, the ``run_id`` text in COPY included); and rows without
``run_id`` (for scale).  Reports the median rows per second of each.  Last
line: JSON with ``value`` (labelled, sightings kept), ``baseline`` (labelled,
no sightings), ``unlabelled`` and ``overhead_pct`` (value vs baseline).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import psycopg

from gpufleet.collector import sightings
from gpufleet.collector.batch_store import NodeTouch, write_batches
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.wire import Batch, validate
from testsupport.loadgen import gpu_columns
from testsupport.pg import server_url

SECONDS = 5


def batches(nodes: int, per_node: int, t0: float, labelled: bool, tag: str) -> list[Batch]:
    out = []
    for n in range(nodes):
        for k in range(per_node):
            cols = gpu_columns(n, t0 + k * SECONDS, SECONDS)
            if labelled:
                cols["run_id"] = [f"ns:job-{n // 4}:0a1b2c3d"] * len(cols["time"])
            out.append(validate({"batch_id": f"{tag}:{n}:{k}", "node": f"{tag}-{n:04d}", "gpu": cols}))
    return out


class _NoSightings(sightings.SightingCache):
    def due(self, seen: sightings.Seen) -> sightings.Seen:
        return {}


def write(conn: psycopg.Connection, items: list[Batch], keep_sightings: bool) -> float:
    cache = sightings.SightingCache() if keep_sightings else _NoSightings()
    t = time.perf_counter()
    for k in range(0, len(items), 8):
        with conn.transaction():
            done = write_batches(conn, items[k : k + 8], sightings_cache=cache, touch=NodeTouch(10.0))
        cache.stored(done.sightings)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    settings = load_settings(data_dir=Path("/tmp/gpufleet-bench-sightings"))
    variants = (("kept", True, True), ("off", True, False), ("unlabelled", False, False))
    rates: dict[str, list[float]] = {v[0]: [] for v in variants}
    with scratch_database(server_url(settings.data_dir / "pg"), "gpufleet_bench_sightings") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            t0 = time.time() - 3600
            for r in range(a.rounds):
                order = variants[r % 3 :] + variants[: r % 3]
                for name, labelled, keep in order:
                    bs = batches(a.nodes, a.batches, t0 + r * a.batches * SECONDS, labelled, f"r{r}{name}")
                    rows = sum(b.n_gpu for b in bs)
                    rates[name].append(rows / write(conn, bs, keep))
            keys = conn.execute("SELECT count(*) FROM run_sightings").fetchone()[0]  # type: ignore[index]
    value, baseline = statistics.median(rates["kept"]), statistics.median(rates["off"])
    plain = statistics.median(rates["unlabelled"])
    overhead = 100.0 * (baseline - value) / baseline
    print(
        f"labelled GPU rows, sightings kept: {value:,.0f} rows/s; baseline, same rows without sightings: "
        f"{baseline:,.0f} rows/s (overhead {overhead:.1f} %); unlabelled rows: {plain:,.0f} rows/s; "
        f"{keys} sightings"
    )
    print(
        json.dumps(
            {
                "name": "ingest_sightings_rows_per_s",
                "value": round(value),
                "baseline": round(baseline),
                "unlabelled": round(plain),
                "overhead_pct": round(overhead, 1),
                "unit": "rows/s",
                "nodes": a.nodes,
                "batches_per_node": a.batches,
                "rounds": a.rounds,
                "sightings": keys,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
