"""A run as every reader sees it: the GPUs it holds over [start, end).

"Is this run active in this window?" has one answer, written here: a run
holds its allocations from its start (inclusive) to its end (exclusive); a run
with no end holds them until it is given one.  So a run overlaps a window
[lo, hi) when ``start < hi`` and (no end, or ``end > lo``); at an instant
``t`` it is *pending* before its start, *running* from its start until its end
and *ended* from its end on.  Accounting, the API's run states, the web view,
the detectors' window cache and replay all ask through :class:`Run` or through
the SQL twins :func:`overlaps_sql` and :func:`state_sql`, which say the same.

Times may be datetimes (the store, accounting) or epoch seconds (the
detectors' windows): the rules only compare them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from psycopg.rows import dict_row

RunState = Literal["pending", "running", "ended"]


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...
    def __le__(self, other: Any, /) -> bool: ...


T = TypeVar("T", bound=_Ordered)


def overlaps(start: T, end: T | None, lo: T | None, hi: T | None) -> bool:
    """Whether [start, end) meets [lo, hi) (an open end, or an open side of the window, is unbounded)."""
    return (hi is None or start < hi) and (end is None or lo is None or lo < end)


def state_at(start: T, end: T | None, t: T) -> RunState:
    """``pending`` before ``start``, ``running`` on [start, end), ``ended`` from ``end`` on."""
    if t < start:
        return "pending"
    return "running" if end is None or t < end else "ended"


def overlaps_sql(alias: str = "r", lo: str | None = None, hi: str | None = None) -> str:
    """:func:`overlaps` of the ``runs`` row ``alias`` and [lo, hi) (SQL expressions; None: unbounded)."""
    parts = [f"{alias}.start < {hi}"] if hi is not None else []
    if lo is not None:
        parts.append(f'({alias}."end" IS NULL OR {alias}."end" > {lo})')
    return "(" + " AND ".join(parts) + ")" if parts else "TRUE"


def state_sql(alias: str = "r", at: str = "now()") -> str:
    """:func:`state_at` of the ``runs`` row ``alias`` at ``at`` (a SQL expression)."""
    return (
        f"CASE WHEN {alias}.start > {at} THEN 'pending' "
        f"WHEN {alias}.\"end\" IS NULL OR {alias}.\"end\" > {at} THEN 'running' ELSE 'ended' END"
    )


@dataclass(frozen=True)
class Run:
    """One run with the GPUs it holds, as the ``runs`` and ``run_allocations`` tables have it."""

    run_id: str
    start: datetime
    end: datetime | None = None
    #: (node, gpu) pairs, ordered by node then GPU.
    allocations: tuple[tuple[str, int], ...] = ()
    site: str | None = None
    team: str | None = None
    name: str | None = None
    params: int | None = None
    labels: dict[str, Any] = field(default_factory=dict)

    def overlaps(self, lo: datetime | None, hi: datetime | None) -> bool:
        return overlaps(self.start, self.end, lo, hi)

    def state_at(self, t: datetime) -> RunState:
        return state_at(self.start, self.end, t)

    def window(
        self, now: datetime, since: datetime | None = None, until: datetime | None = None
    ) -> tuple[datetime, datetime]:
        """The part of [start, end) up to ``now``, clipped to [since, until); empty as (lo, lo)."""
        hi = now if self.end is None else min(self.end, now)
        lo = self.start if since is None else max(self.start, since)
        if until is not None:
            hi = min(hi, until)
        return lo, max(lo, hi)


_RUNS_SQL = """
SELECT r.run_id, r.name, r.site, r.team, r.start, r."end", r.params, r.labels,
  COALESCE((SELECT array_agg(a.node ORDER BY a.node, a.gpu) FROM run_allocations a WHERE a.run_id = r.run_id),
           '{}') AS nodes,
  COALESCE((SELECT array_agg(a.gpu ORDER BY a.node, a.gpu) FROM run_allocations a WHERE a.run_id = r.run_id),
           '{}') AS gpus
FROM runs r"""


def load_runs(
    conn: psycopg.Connection,
    run_ids: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Run]:
    """Runs by id, or those overlapping [since, until), by start then id, with their allocations."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    if run_ids is not None:
        where.append("r.run_id = ANY(%s)")
        params.append(list(run_ids))
    if until is not None:
        where.append(overlaps_sql("r", hi="%s"))
        params.append(until)
    if since is not None:
        where.append(overlaps_sql("r", lo="%s"))
        params.append(since)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            _RUNS_SQL + " WHERE " + " AND ".join(where) + " ORDER BY r.start, r.run_id", params
        ).fetchall()
    return [
        Run(
            run_id=r["run_id"],
            start=r["start"],
            end=r["end"],
            allocations=tuple(zip(r["nodes"], (int(g) for g in r["gpus"]), strict=True)),
            site=r["site"],
            team=r["team"],
            name=r["name"],
            params=r["params"],
            labels=r["labels"] or {},
        )
        for r in rows
    ]
