"""Where samples showed a run on a GPU: the ingest side of inferred runs.

Agents put the run a GPU worked for into each GPU sample (``run_id``: a
Kubernetes pod's job, a process environment, a job file).  In the same
transaction as the samples, the writer keeps one row per (run, node, GPU) in
``run_sightings`` with the first and last sample time that showed it; the
leader turns those into runs and allocations
(:mod:`gpufleet.store.inferred`).  A sighting already allocated that moves
becomes ``moved``, so the leader looks again only at runs whose samples
moved, not at every run ever seen.  A MIG instance row counts for its
physical GPU, since allocations are of physical GPUs.

Nothing here can refuse a batch: the upsert has no constraint a valid sample
could break, and rows are sorted by key so that two writer threads never
lock two sightings in opposite orders.

Cost: :class:`SightingCache` remembers what each writer last stored, so a
sighting is written again only when it moved by ``step_s`` (30 s) or its
first sample moved earlier; most batches of a running job write none.  The
stored ``last_seen`` may thus lag the newest sample by up to ``step_s``; the
leader reads the exact last sample from ``gpu_samples`` when it ends a run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import psycopg

from gpufleet.collector.copy_binary import PG_EPOCH_S
from gpufleet.wire import Batch

#: (run_id, node, gpu) -> (first, last) sample time, epoch seconds.
Seen = dict[tuple[str, str, int], tuple[float, float]]

#: Arrays travel as text literals and times as microseconds since 2000-01-01 (the samples' COPY
#: rounding): psycopg's per-element adaptation of five lists cost more than the statement itself.
UPSERT_SQL = """
INSERT INTO run_sightings AS s (run_id, node, gpu, first_seen, last_seen)
SELECT r, n, g, timestamptz '2000-01-01 00:00:00+00' + f * interval '1 microsecond',
       timestamptz '2000-01-01 00:00:00+00' + l * interval '1 microsecond'
FROM unnest(%s::text[], %s::text[], %s::int2[], %s::int8[], %s::int8[]) AS u(r, n, g, f, l)
ON CONFLICT (run_id, node, gpu) DO UPDATE
  SET first_seen = LEAST(s.first_seen, EXCLUDED.first_seen), last_seen = GREATEST(s.last_seen, EXCLUDED.last_seen),
      status = CASE WHEN s.status = 'allocated' THEN 'moved' ELSE s.status END
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


class SightingCache:
    """What one writer last stored per sighting, to skip writes that would change (almost) nothing.

    Thread-safe; :meth:`due` picks what to write, :meth:`stored` records it
    only once the transaction committed (a rolled-back write is due again).
    """

    def __init__(self, step_s: float = 30.0, max_keys: int = 200_000) -> None:
        self.step_s = step_s
        self.max_keys = max_keys
        self._stored: dict[tuple[str, str, int], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def due(self, seen: Seen) -> Seen:
        with self._lock:
            out: Seen = {}
            for key, (first, last) in seen.items():
                held = self._stored.get(key)
                if held is None or first < held[0] or last >= held[1] + self.step_s:
                    out[key] = (min(first, held[0]) if held else first, max(last, held[1]) if held else last)
            return out

    def stored(self, written: Seen) -> None:
        with self._lock:
            if len(self._stored) + len(written) > self.max_keys:
                self._stored.clear()  # a cold cache only costs writes
            self._stored.update(written)


def record(conn: psycopg.Connection, batches: Iterable[Batch], cache: SightingCache | None = None) -> Seen:
    """Upsert the sightings of ``batches`` (inside the caller's transaction); returns what was written,
    for ``cache.stored`` once the transaction has committed."""
    seen = collect(batches)
    if cache is not None and seen:
        seen = cache.due(seen)
    if not seen:
        return {}
    keys = sorted(seen)
    times = np.round((np.array([seen[k] for k in keys], dtype=np.float64) - PG_EPOCH_S) * 1e6).astype(
        np.int64
    )
    conn.execute(
        UPSERT_SQL,
        (
            _text_array(k[0] for k in keys),
            _text_array(k[1] for k in keys),
            "{" + ",".join(str(k[2]) for k in keys) + "}",
            "{" + ",".join(map(str, times[:, 0].tolist())) + "}",
            "{" + ",".join(map(str, times[:, 1].tolist())) + "}",
        ),
    )
    return seen


def _text_array(values: Iterable[str]) -> str:
    """A PostgreSQL text[] literal: every element quoted, backslash and double quote escaped."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
