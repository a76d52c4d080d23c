"""Where samples showed a run on a GPU: the ingest side of inferred runs.

Agents put the run a GPU worked for into each GPU sample (``run_id``: a
Kubernetes pod's job, a process environment, a job file).  In the same
transaction as the samples, the writer keeps one row per (run, node, GPU) in
``run_sightings`` with the first and last sample time that showed it; the
leader turns those into runs and allocations
(:mod:`gpufleet.store.inferred`).  A MIG instance row counts for its
physical GPU, since allocations are of physical GPUs.

Nothing here can refuse a batch: the upsert has no constraint a valid sample
could break, and rows are sorted by key so that two writer threads never
lock two sightings in opposite orders.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import psycopg

from gpufleet.wire import Batch

#: (run_id, node, gpu) -> (first, last) sample time, epoch seconds.
Seen = dict[tuple[str, str, int], tuple[float, float]]

UPSERT_SQL = """
INSERT INTO run_sightings AS s (run_id, node, gpu, first_seen, last_seen)
SELECT * FROM unnest(%s::text[], %s::text[], %s::int2[], %s::timestamptz[], %s::timestamptz[])
ON CONFLICT (run_id, node, gpu) DO UPDATE
  SET first_seen = LEAST(s.first_seen, EXCLUDED.first_seen), last_seen = GREATEST(s.last_seen, EXCLUDED.last_seen)
  WHERE EXCLUDED.first_seen < s.first_seen OR EXCLUDED.last_seen > s.last_seen"""


def collect(batches: Iterable[Batch]) -> Seen:
    """First and last time each (run, node, GPU) appears in the GPU rows of ``batches``."""
    seen: Seen = {}
    for b in batches:
        col = b.gpu.get("run_id") if b.n_gpu else None
        if col is None or (col.null is not None and bool(col.null.all())):
            continue
        runs = col.tolist()
        times = b.gpu["time"].values.tolist()
        gpus = b.gpu["gpu"].values.tolist()
        for run, t, g in zip(runs, times, gpus, strict=True):
            if run is None:
                continue
            if isinstance(run, bytes):
                run = run.decode()
            key = (run, b.node, int(g))
            cur = seen.get(key)
            seen[key] = (t, t) if cur is None else (min(cur[0], t), max(cur[1], t))
    return seen


def record(conn: psycopg.Connection, batches: Iterable[Batch]) -> int:
    """Upsert the sightings of ``batches`` (inside the caller's transaction); returns how many keys."""
    seen = collect(batches)
    if not seen:
        return 0
    keys = sorted(seen)
    conn.execute(UPSERT_SQL, (
        [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
        [datetime.fromtimestamp(seen[k][0], UTC) for k in keys],
        [datetime.fromtimestamp(seen[k][1], UTC) for k in keys]))
    return len(keys)
