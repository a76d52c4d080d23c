"""The fleet's accounting of each closed hour, priced once by the collector's leader and kept.

A fleet-wide read prices every GPU's time of its period; ``gpufleet_accounting`` answers it from the
hours kept here that still hold and prices only the rest live (:mod:`gpufleet.db.fleet_hours_sql`
says what an hour rests on and what moves its marks).  Nobody is asked to wait for the keeping: the
leader keeps the hours of the last ``accounting.keep_fleet_days`` days that are not kept or no longer
hold, newest first (today's reads first), a few at a time within its pass's budget, and a reader finds
whatever is not kept yet priced live, the same figures.

An hour is kept once it has been closed for :data:`SETTLE_S` (the reader leaves an hour to the live
query while a range before its end waits for the rollup worker, which the agents' last batches of
the hour give it), with the accounting settings the readers use (``accounting.max_gap_s``,
``accounting.gone_after_s``, source ``auto``).  Lines priced from raw samples because a range was
still queued (stale) are not kept: the hour is priced again on a later pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import errors

from gpufleet.accounting.lines import Source
from gpufleet.config import Settings
from gpufleet.db import fleet_hours_sql as H

log = logging.getLogger(__name__)

#: Seconds an hour has been closed before it is kept.
SETTLE_S = 180.0
#: The most hours priced in one call: hours priced together share one pass over the fleet's
#: membership (about 0.45 s on 10,000 GPUs), so a call of several is cheaper than as many of one.
HOURS_PER_CALL = 6

HOUR = timedelta(hours=1)

#: Whole hours in [lo, hi) that are not kept with these settings or whose marks moved, newest first.
_MISSING_SQL = f"""
SELECT h FROM generate_series(%(hi)s - INTERVAL '1 hour', %(lo)s, INTERVAL '-1 hour') h
WHERE NOT EXISTS (
  SELECT 1 FROM fleet_hours_kept k
  WHERE k.max_gap_s = %(gap)s AND k.source = %(source)s AND k.gone_after_s = %(gone)s AND k.hour = h
    AND {H.holds("k", "h")})
ORDER BY h DESC"""

#: The marks of hours, read before their lines are priced: a change after this leaves a newer mark.
_MARKS_SQL = f"""
SELECT h, {H.WHOLE_MARK}, {H.hour_mark("h")} FROM unnest(%(hours)s::timestamptz[]) h"""

_PARTS_SQL = "SELECT * FROM gpufleet_fleet_parts(%s, %s, %s, %s, %s, %s, 'step')"
#: Where a part's hour and stale flag stand in its row.
_HOUR = [c for c, _ in H.PART_COLUMNS].index("hour")
_STALE = [c for c, _ in H.PART_COLUMNS].index("stale")

_FORGET_SQL = """
DELETE FROM fleet_hours_kept
WHERE max_gap_s = %(gap)s AND source = %(source)s AND gone_after_s = %(gone)s AND hour = ANY(%(hours)s)"""

_HEADER_SQL = """
INSERT INTO fleet_hours_kept (max_gap_s, source, gone_after_s, hour, whole_mark, hour_mark)
VALUES (%s, %s, %s, %s, %s, %s)"""

#: A kept line: the key, its number, and a part's columns but its hour (which is in the key).
_LINE_COLUMNS = ("line_no", *(c for c, _ in H.PART_COLUMNS if c != "hour"))
_LINE_SQL = (
    f"INSERT INTO fleet_hour_lines (max_gap_s, source, gone_after_s, hour, {', '.join(_LINE_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * (4 + len(_LINE_COLUMNS)))})"
)


@dataclass(frozen=True)
class Keeping:
    """What the fleet's hours are kept for: the readers' accounting settings, and how far back."""

    max_gap_s: float
    gone_after_s: float
    days: float
    source: Source = "auto"


def keeping_of(settings: Settings) -> Keeping:
    """What the leader keeps under ``settings``: the readers' accounting settings, for
    ``accounting.keep_fleet_days`` capped a day short of retention (whose pass drops older hours)."""
    st = settings.storage
    days = min(settings.accounting.keep_fleet_days, min(st.retention_days, st.rollup_retention_days) - 1)
    return Keeping(settings.accounting.max_gap_s, settings.accounting.gone_after_s, max(0.0, days))


def missing(conn: psycopg.Connection, keeping: Keeping, now: datetime) -> list[datetime]:
    """The closed, settled hours of the last ``keeping.days`` not kept or no longer holding, newest first."""
    hi = _floor_hour(now - timedelta(seconds=SETTLE_S))
    lo = _floor_hour(now - timedelta(days=keeping.days)) + HOUR
    if keeping.days <= 0 or lo >= hi:
        return []
    rows = conn.execute(
        _MISSING_SQL,
        {
            "lo": lo,
            "hi": hi,
            "gap": keeping.max_gap_s,
            "source": keeping.source,
            "gone": keeping.gone_after_s,
        },
    ).fetchall()
    return [r[0] for r in rows]


def keep(conn: psycopg.Connection, keeping: Keeping, now: datetime, budget_s: float) -> int:
    """Price and keep missing hours, newest first, until ``budget_s`` is spent (one call at least; a call
    under way finishes); how many hours were kept.  ``conn`` is in autocommit: each call is its own
    transaction."""
    todo = missing(conn, keeping, now)
    deadline = time.monotonic() + budget_s
    kept = calls = 0
    while todo and (calls == 0 or time.monotonic() < deadline):
        calls += 1
        run = [todo.pop(0)]
        while todo and len(run) < HOURS_PER_CALL and todo[0] == run[-1] - HOUR:
            run.append(todo.pop(0))
        kept += _keep_run(conn, keeping, sorted(run), now)
    if kept:
        log.debug("kept %d fleet hours", kept)
    return kept


def _keep_run(conn: psycopg.Connection, keeping: Keeping, hours: list[datetime], now: datetime) -> int:
    """Price the consecutive ``hours`` in one call and keep those none of whose lines is stale; none if
    another keeper (a leader handing over) stored one of them meanwhile: it stored the same lines."""
    try:
        return _store_run(conn, keeping, hours, now)
    except (errors.UniqueViolation, errors.SerializationFailure, errors.DeadlockDetected) as e:
        log.debug("fleet hours not kept, another keeper stored them: %s", e)
        return 0


def _store_run(conn: psycopg.Connection, keeping: Keeping, hours: list[datetime], now: datetime) -> int:
    with conn.transaction():
        marks = {h: (w, m) for h, w, m in conn.execute(_MARKS_SQL, {"hours": hours}).fetchall()}
        rows = conn.execute(
            _PARTS_SQL,
            (hours[0], hours[-1] + HOUR, now, keeping.max_gap_s, keeping.source, keeping.gone_after_s),
        ).fetchall()
        by_hour: dict[datetime, list[tuple]] = {h: [] for h in hours}
        for r in rows:
            by_hour[r[_HOUR]].append(r)
        good = [h for h in hours if not any(r[_STALE] for r in by_hour[h])]
        key = (keeping.max_gap_s, keeping.source, keeping.gone_after_s)
        conn.execute(
            _FORGET_SQL,
            {"gap": key[0], "source": key[1], "gone": key[2], "hours": good},
        )
        with conn.cursor() as cur:
            cur.executemany(_HEADER_SQL, [(*key, h, *marks[h]) for h in good])
            cur.executemany(
                _LINE_SQL,
                [
                    (*key, h, i, *(v for j, v in enumerate(r) if j != _HOUR))
                    for h in good
                    for i, r in enumerate(by_hour[h])
                ],
            )
    return len(good)


def _floor_hour(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(minute=0, second=0, microsecond=0)
