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
from collections import defaultdict
from collections.abc import Sequence
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
    # the hours to read again (not kept, or their marks moved), and their marks, read before they are
    todo: dict[str, list[float]] = {}
    for r in runs:
        have = kept.get(r.run_id, {})
        todo[r.run_id] = [h for h in _hours(r.start, cut) if h not in have]
    scopes = {"h"} | {f"r:{rid}" for rid, hs in todo.items() if hs}
    scopes |= {hour_scope(h) for hs in todo.values() for h in hs}
    marks = priced_store.current_marks(conn, sorted(scopes)) if any(todo.values()) else {}
    ranges: list[tuple[str, float, float]] = []
    for r in runs:
        for lo, hi in _spans(todo[r.run_id]):
            ranges.append((r.run_id, max(r.start, lo), hi))
        ranges.append((r.run_id, max(r.start, cut), now))
    read = read_ranges(conn, ranges)
    got: dict[str, list[np.ndarray]] = {r.run_id: list(kept.get(r.run_id, {}).values()) for r in runs}
    fills: list[tuple[object, ...]] = []
    start_of = {r.run_id: r.start for r in runs}
    for (rid, lo, hi), rows in zip(ranges, read, strict=True):
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
                    datetime.fromtimestamp(start_of[rid], UTC),
                    int(marks.get(f"r:{rid}", 0)),
                    int(marks.get("h", 0)),
                    int(marks.get(hour_scope(h), 0)),
                    encode(rows[hour_of == h]),
                    datetime.fromtimestamp(start_of[rid], UTC),
                )
            )
            h += HOUR
    priced_store.keep_rows(conn, Q.KEEP_MINUTES_SQL, fills)
    out = {}
    for rid, parts in got.items():
        rows = np.concatenate(parts) if parts else empty()
        out[rid] = rows[np.argsort(rows[:, 0], kind="stable")]
    return out


def _lookup(
    conn: psycopg.Connection, keys: dict[str, bytes], cut: float
) -> dict[str, dict[float, np.ndarray]]:
    """The kept hours before ``cut`` of each run of ``keys`` whose three marks are still the recorded ones."""
    run_of = {k: rid for rid, k in keys.items()}
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
