"""A running run's minutes of each closed hour, kept between requests (migration 0032).

An ended run's points are kept (:mod:`gpufleet.advisor.kept_points`), but a running run's window grows
with every request, so its minutes were all read again each time: on 10,000 GPUs with 412 runs
running, about 220 ms a run, so a fleet-wide advice answered 503 at its budget and one run's proposal
(which compares it with every running run of its model) took 28 s (``bench/read_side.py``).

The minutes of an hour that has closed (:data:`~gpufleet.db.power_cap_sql.RANGES_MINUTES_SQL`'s rows: each
minute's limits over the run's GPUs, GPUs reporting, energy and coverage) depend only on

* the run's window and allocations: the mark ``r:<run>`` (triggers on ``runs``, ``run_allocations``);
* that hour's samples and rollups: ``h:<hour>``, which the rollup worker moves for every hour from a
  rebuilt range's previous sample to now, and ``h``, moved instead by a change reaching too many
  hours (:mod:`gpufleet.db.fleet_hours_sql`);
* the query that reads them: its text is in the key.

So a request keeps each closed hour's rows (``kept_power_minutes``) and the next reads them back while
the three marks are the ones recorded, reading live only the hours whose marks moved and the minutes
since the last closed hour.  The marks are read before the minutes are (a change in between leaves a
newer mark than the one recorded, never the reverse), so what is read back is always what reading
the hour again would give.  The progress reports are read live on every request (they grow with the
run).  An hour is kept once it has been closed for :data:`~gpufleet.accounting.fleet_hours.SETTLE_S`
(the agents' last batches of the hour land first), and never for a run retention reaches
(:data:`gpufleet.db.priced_store_sql.HORIZON`).
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import psycopg

from gpufleet.accounting import priced_store
from gpufleet.accounting.fleet_hours import SETTLE_S
from gpufleet.db import power_cap_sql as Q

HOUR = 3600.0

#: A run's minutes: rows of these, float64, in bucket order (a NaN limit: no GPU reported one).
COLUMNS = ("bucket", "least limit W", "greatest limit W", "GPUs reporting", "energy J", "covered GPU-s")
_WIDTH = len(COLUMNS)
#: As kept: the rows' float64 values, little-endian.
_DTYPE = np.dtype("<f8")


@dataclass(frozen=True)
class Running:
    """A running run whose minutes are read: its id and start (epoch s)."""

    run_id: str
    start: float


def key(run: Running) -> bytes:
    """The key of ``run``'s kept hours: the run, its start and the query that reads its minutes."""
    h = hashlib.sha256(b"power-cap minutes v1\n" + Q.RANGES_MINUTES_SQL.encode())
    h.update(f"{run.run_id}\t{run.start!r}\n".encode())
    return h.digest()


def empty() -> np.ndarray:
    return np.empty((0, _WIDTH))


def encode(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype=_DTYPE).tobytes()


def decode(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=_DTYPE).reshape(-1, _WIDTH)


def read_ranges(conn: psycopg.Connection, ranges: Sequence[tuple[str, float, float]]) -> list[np.ndarray]:
    """The minutes of each (run, from, to) of ``ranges``, in one query, each range's in bucket order."""
    got: list[list[tuple[object, ...]]] = [[] for _ in ranges]
    if ranges:
        for i, *row in conn.execute(
            Q.RANGES_MINUTES_SQL,
            {
                "runs": [r[0] for r in ranges],
                "los": [datetime.fromtimestamp(r[1], UTC) for r in ranges],
                "his": [datetime.fromtimestamp(r[2], UTC) for r in ranges],
            },
        ):
            got[i - 1].append(tuple(row))
    # None (no limit) becomes NaN
    return [np.array(rows, dtype=np.float64).reshape(-1, _WIDTH) for rows in got]


def hour_scope(hour: float) -> str:
    """The mark of the hour starting at ``hour`` (epoch s), as :mod:`gpufleet.db.fleet_hours_sql` names it."""
    return "h:" + datetime.fromtimestamp(hour, UTC).strftime("%Y-%m-%dT%H")


def minutes(conn: psycopg.Connection, runs: Sequence[Running], now: float) -> dict[str, np.ndarray]:
    """Each of ``runs``' minutes from its start to ``now``: closed hours as kept while they hold, the
    rest read (and the closed, settled hours among them kept)."""
    if not runs:
        return {}
    cut = _floor_hour(now - SETTLE_S)
    keys = {r.run_id: key(r) for r in runs}
    kept = _lookup(conn, keys, cut)
    todo = {r.run_id: [h for h in _hours(r.start, cut) if h not in kept.get(r.run_id, {})] for r in runs}
    got = _read_and_keep(conn, runs, keys, todo, cut, now)
    out = {}
    for r in runs:
        parts = [*kept.get(r.run_id, {}).values(), *got[r.run_id]]
        rows = np.concatenate(parts) if parts else empty()
        out[r.run_id] = rows[np.argsort(rows[:, 0], kind="stable")]
    return out


#: GPU-hours of minutes the leader reads in one statement when it keeps running runs' hours (about
#: 0.5 s on 2 cores); it checks its budget between statements.
KEEP_GPU_HOURS = 1500.0


def keep_closed(
    conn: psycopg.Connection, runs: Sequence[Running], gpus: Mapping[str, int], now: float, deadline: float
) -> int:
    """Read and keep the closed, settled hours of ``runs`` (``gpus``: each one's GPU count) that are not
    kept or no longer hold, newest first, a statement of about :data:`KEEP_GPU_HOURS` at a time until
    ``deadline`` (``time.monotonic()``; one statement at least): what the collector's leader does, so the
    advisor's first reader finds them.  Returns how many hours were kept."""
    cut = _floor_hour(now - SETTLE_S)
    keys = {r.run_id: key(r) for r in runs}
    run_of = _run_of(keys)
    have: dict[str, set[float]] = defaultdict(set)
    for digest, hour in conn.execute(
        Q.KEPT_HOURS_SQL, {"keys": list(keys.values()), "cut": datetime.fromtimestamp(cut, UTC)}
    ):
        have[run_of[bytes(digest)]].add(hour.timestamp())
    todo = sorted(
        ((h, r) for r in runs for h in _hours(r.start, cut) if h not in have[r.run_id]),
        key=lambda x: (-x[0], x[1].run_id),
    )
    done = 0
    while todo and (done == 0 or time.monotonic() < deadline):
        batch: dict[str, list[float]] = defaultdict(list)
        size = 0.0
        while todo and (not batch or size + gpus.get(todo[0][1].run_id, 1) <= KEEP_GPU_HOURS):
            h, r = todo.pop(0)
            batch[r.run_id].append(h)
            size += gpus.get(r.run_id, 1)
        chosen = [r for r in runs if r.run_id in batch]
        _read_and_keep(conn, chosen, keys, {rid: sorted(hs) for rid, hs in batch.items()}, cut, None)
        done += sum(len(hs) for hs in batch.values())
    return done


def _read_and_keep(
    conn: psycopg.Connection,
    runs: Sequence[Running],
    keys: Mapping[str, bytes],
    todo: Mapping[str, Sequence[float]],
    cut: float,
    now: float | None,
) -> dict[str, list[np.ndarray]]:
    """Read the closed hours ``todo`` of each run (and, with ``now``, its minutes from ``cut`` to
    ``now``) in one statement, and keep the hours, each resting on the marks read before it was read."""
    scopes = {"h"} | {f"r:{rid}" for rid, hs in todo.items() if hs}
    scopes |= {hour_scope(h) for hs in todo.values() for h in hs}
    marks = priced_store.current_marks(conn, sorted(scopes)) if any(todo.values()) else {}
    ranges: list[tuple[str, float, float]] = []
    for r in runs:
        for lo, hi in _spans(todo.get(r.run_id, ())):
            ranges.append((r.run_id, max(r.start, lo), hi))
        if now is not None:
            ranges.append((r.run_id, max(r.start, cut), now))
    got: dict[str, list[np.ndarray]] = {r.run_id: [] for r in runs}
    fills: list[tuple[object, ...]] = []
    start_of = {r.run_id: datetime.fromtimestamp(r.start, UTC) for r in runs}
    for (rid, lo, hi), rows in zip(ranges, read_ranges(conn, ranges), strict=True):
        got[rid].append(rows)
        if hi > cut:  # the minutes since the last closed hour: read, never kept
            continue
        hour_of = np.floor(rows[:, 0] / HOUR) * HOUR
        h = _floor_hour(lo)
        while h < hi:
            fills.append(
                (
                    keys[rid],
                    datetime.fromtimestamp(h, UTC),
                    rid,
                    start_of[rid],
                    int(marks.get(f"r:{rid}", 0)),
                    int(marks.get("h", 0)),
                    int(marks.get(hour_scope(h), 0)),
                    encode(rows[hour_of == h]),
                    start_of[rid],
                )
            )
            h += HOUR
    priced_store.keep_rows(conn, Q.KEEP_MINUTES_SQL, fills)
    return got


def _run_of(keys: Mapping[str, bytes]) -> dict[bytes, str]:
    return {k: rid for rid, k in keys.items()}


def _lookup(
    conn: psycopg.Connection, keys: dict[str, bytes], cut: float
) -> dict[str, dict[float, np.ndarray]]:
    """The kept hours before ``cut`` of each run of ``keys`` whose three marks are still the recorded ones."""
    run_of = _run_of(keys)
    out: dict[str, dict[float, np.ndarray]] = defaultdict(dict)
    for digest, hour, blob in conn.execute(
        Q.LOOKUP_MINUTES_SQL, {"keys": list(keys.values()), "cut": datetime.fromtimestamp(cut, UTC)}
    ):
        out[run_of[bytes(digest)]][hour.timestamp()] = decode(bytes(blob))
    return out


def _hours(start: float, cut: float) -> list[float]:
    """The hours (their starts) from ``start``'s to the last one ending by ``cut``."""
    out, h = [], _floor_hour(start)
    while h + HOUR <= cut:
        out.append(h)
        h += HOUR
    return out


def _spans(hours: Sequence[float]) -> list[tuple[float, float]]:
    """Consecutive ``hours`` (sorted) as [from, to) spans: one read each."""
    out: list[tuple[float, float]] = []
    for h in hours:
        if out and out[-1][1] == h:
            out[-1] = (out[-1][0], h + HOUR)
        else:
            out.append((h, h + HOUR))
    return out


def _floor_hour(t: float) -> float:
    return float(int(t // HOUR) * HOUR)
