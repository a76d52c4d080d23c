"""An ended run's power-cap points, kept between requests (migration 0028).

The advisor reads every run's minutes of its lookback again on each request, one run at a time: on
10,000 GPUs with a month of runs, past 300 s (``bench/read_side.py``), and almost all of it the same
answer as the request before.  Over an ended run's whole window, its points (stretches at one power
limit) and the minutes it leaves out depend only on

* the run's window and allocations: the mark ``r:<run>`` (triggers on ``runs``, ``run_allocations``);
* its progress reports: ``p:<run>`` (a trigger on ``run_progress``, migration 0028);
* its nodes' minute rollups on the days it covers: ``e:<node>:<day>`` and ``e:<node>`` (the rollup
  worker moves them with every range it rebuilds);
* how the advisor reads them: this package's code and the settings that shape a point (:func:`key`).

So the first request keeps them (``kept_power_points``) and the next reads them back while every mark
is the one recorded.  The marks are read before the run is read (a change in between leaves a newer
mark than the one recorded, never the reverse), so a kept answer is always the one computing it again
would give.  A running run is never kept (its window grows), nor one retention reaches
(:data:`gpufleet.db.priced_store_sql.HORIZON`); which runs a request looks at (GPU model, model,
lookback) is decided again on every request, from the runs table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg.types.json import Jsonb

from gpufleet.accounting import priced_store
from gpufleet.db import priced_store_sql as S

if TYPE_CHECKING:
    from gpufleet.advisor.power_cap import AdvisorSettings, Point

#: Settings that do not shape a run's points (which runs are looked at, not what each one gives).
_NOT_PER_RUN = frozenset({"lookback", "budget_s"})


@cache
def _code() -> bytes:
    """A digest of the code that makes points: points kept by another release are never read."""
    h = hashlib.sha256(b"power-cap points\n")
    here = Path(__file__).parent
    for name in ("power_cap.py", "kept_points.py"):
        h.update((here / name).read_bytes())
    return h.digest()


def key(run_id: str, start: float, end: float, gpus: int, cfg: AdvisorSettings) -> bytes:
    """The key of run ``run_id``'s points over its whole window [start, end) on ``gpus`` GPUs."""
    h = hashlib.sha256(_code())
    shaping = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in _NOT_PER_RUN}
    h.update(f"{run_id}\t{start!r}\t{end!r}\t{gpus}\t{sorted(shaping.items())!r}\n".encode())
    return h.digest()


@dataclass(frozen=True)
class Kept:
    """One run's points and the minutes it left out, by reason."""

    points: list[dict[str, object]]
    excluded: dict[str, int]


def lookup(conn: psycopg.Connection, keys: Mapping[str, bytes]) -> dict[str, Kept]:
    """The kept points of each run of ``keys`` (run id -> :func:`key`) whose marks are all current."""
    if not keys:
        return {}
    run_of = {k: rid for rid, k in keys.items()}
    out: dict[str, Kept] = {}
    for digest, points, excluded in conn.execute(S.POINTS_LOOKUP_SQL, {"keys": list(keys.values())}):
        out[run_of[bytes(digest)]] = Kept(list(points), {str(k): int(v) for k, v in excluded.items()})
    return out


@dataclass(frozen=True)
class Run:
    """An ended run whose points are computed: what its key and marks are made of."""

    run_id: str
    start: float
    end: float
    nodes: tuple[str, ...]


def _scopes(run: Run) -> tuple[str, ...]:
    days = priced_store.days_between(
        datetime.fromtimestamp(run.start, UTC), datetime.fromtimestamp(run.end, UTC)
    )
    nodes = sorted(set(run.nodes))
    got = [f"r:{run.run_id}", f"p:{run.run_id}"]
    got += [f"e:{n}" for n in nodes]  # moved by a change of more days than are marked one by one
    got += [f"e:{n}:{d}" for n in nodes for d in days]
    return tuple(sorted(got))


def marks(conn: psycopg.Connection, runs: Collection[Run]) -> dict[str, priced_store.Marks]:
    """The current marks each run's points rest on, read before the run is read."""
    return priced_store.marks_of(conn, {r.run_id: _scopes(r) for r in runs})


@dataclass(frozen=True)
class Fill:
    run: Run
    key: bytes
    marks: priced_store.Marks
    points: Sequence[Point]
    excluded: Mapping[str, int]


def point_dicts(points: Sequence[Point]) -> list[dict[str, object]]:
    """Points as kept: without the model, which the run's labels give and may change unmarked."""
    return [{k: v for k, v in asdict(p).items() if k != "model"} for p in points]


def keep(conn: psycopg.Connection, fills: Sequence[Fill]) -> None:
    """Store ``fills`` now (each batch in a transaction of its own, so a request cut short keeps what it
    computed), or when the caller's read-only snapshot ends; a hot standby stores nothing."""
    values = [
        (
            f.key,
            f.run.run_id,
            datetime.fromtimestamp(f.run.start, UTC),
            datetime.fromtimestamp(f.run.end, UTC),
            list(f.marks.scopes),
            list(f.marks.versions),
            Jsonb(point_dicts(f.points)),
            Jsonb(dict(f.excluded)),
            datetime.fromtimestamp(f.run.start, UTC),
        )
        for f in fills
    ]
    priced_store.keep_rows(conn, S.POINTS_INSERT_SQL, values)
