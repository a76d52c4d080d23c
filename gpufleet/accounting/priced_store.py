"""Priced pieces kept between readers: incident costs, ``lost_to_incidents`` and the ledger computed once.

Every reader of a closed run's accounting (the run's page, the finance report, the fleet's ledger, the
Runs page, ``/metrics``) prices the same pieces of GPU-time through ``gpufleet_incident_accounting``,
which reads the samples and rollups of every piece again: most of the time of an accounting with its
ledger.  The answer depends only on the pieces and on inputs the database can watch, so the first
reader keeps it (``priced_pieces``) and the next reads it back, while every input it read is unchanged.

What a kept line rests on is :mod:`gpufleet.db.priced_store_sql`'s marks: the run, its nodes, its site,
the days of samples and of carbon intensity it covers, each recorded as it was in the snapshot the
line was computed in, and compared with the current one on every read.  So a kept answer is always
the one the live computation would give now: a late sample, a price edited back in time, a carbon
series reloaded, a run's end moved or an allocation changed make the lines that read it live again.
Only pieces that end by ``now`` are kept (an open piece grows), never a stale answer (one read from raw
samples while the rollup worker has a range queued), and the reader answers live whatever is not kept.

A closed run's own lines (``gpufleet_accounting``'s, :mod:`gpufleet.accounting.run_lines`) are kept the
same way, under :func:`run_digest` (the run and its window), resting on the same marks.

Keys are digests of what is priced: the run, every piece's GPU, span and lost share, the gap rule, the
source and the accounting functions' text; an incident whose end or evidence changes has other pieces,
so another digest.  A read-only snapshot (``gpufleet.accounting.snapshot``) cannot store: its lines
are stored when it ends, and a hot standby stores none.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors
from psycopg.pq import TransactionStatus

from gpufleet.db import priced_store_sql as S
from gpufleet.db import sql_files

if TYPE_CHECKING:
    from gpufleet.accounting.incidents import Piece
    from gpufleet.store.run_model import Run

log = logging.getLogger(__name__)

#: The texts whose answers are kept, as the database runs them (migration 0022): a change of either
#: makes every digest new.
_SEED = hashlib.sha256(
    (sql_files.text("gpufleet_incident_accounting.v4") + sql_files.text("gpufleet_claim_energy.v3")).encode()
).digest()

#: The text a run's own lines come from (``gpufleet_accounting``, migration 0030) and the energy under it.
_RUN_LINE_SEED = hashlib.sha256(
    b"run line\n"
    + (sql_files.text("gpufleet_accounting.v7") + sql_files.text("gpufleet_claim_energy.v3")).encode()
).digest()

#: Row of ``gpufleet_incident_accounting`` (the columns of :data:`~gpufleet.db.priced_store_sql.LINE_COLUMNS`).
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Fill:
    """What one computed key stores: its lines and the marks they rest on."""

    digest: bytes
    scopes: tuple[str, ...]
    versions: tuple[int, ...]
    nodes: tuple[str, ...]
    gpus: tuple[int, ...]
    lo: datetime
    hi: datetime
    rows: tuple[Row, ...]


#: What a read-only snapshot computed and will store when it ends (:func:`flush`).
_pending: weakref.WeakKeyDictionary[psycopg.Connection, list[Callable[[psycopg.Connection], None]]] = (
    weakref.WeakKeyDictionary()
)


def digest(pieces: Sequence[Piece], max_gap_s: float, source: str) -> bytes:
    """The key of ``pieces`` (one run's) priced with ``max_gap_s`` and ``source``."""
    h = hashlib.sha256(_SEED)
    h.update(f"{max_gap_s!r}|{source}\n".encode())
    for p in sorted(pieces, key=lambda p: (p.run_id, p.node, p.gpu, p.lo, p.hi, p.weight)):
        h.update(
            f"{p.run_id}\t{p.node}\t{p.gpu}\t{p.lo.isoformat()}\t{p.hi.isoformat()}\t{p.weight!r}\n".encode()
        )
    return h.digest()


def whole_window(run: Run, window: tuple[datetime, datetime], now: datetime) -> bool:
    """Whether ``window`` is ``run``'s whole window, ended by ``now``: what every reader of the run asks
    again, so the one window whose answers (its lines, its claims) are kept.  A window a period's edge
    cuts is another question per period, answered and not kept, so ad-hoc periods leave nothing behind."""
    return run.end is not None and run.start < run.end <= now and window == (run.start, run.end)


def run_digest(run_id: str, lo: datetime, hi: datetime, max_gap_s: float, source: str) -> bytes:
    """The key of run ``run_id``'s own lines over its window [lo, hi) (:mod:`gpufleet.accounting.run_lines`).

    Never equal to a key of pieces: the seed is another text's."""
    h = hashlib.sha256(_RUN_LINE_SEED)
    h.update(f"{max_gap_s!r}|{source}\n{run_id}\t{lo.isoformat()}\t{hi.isoformat()}\n".encode())
    return h.digest()


def lookup(conn: psycopg.Connection, digests: Collection[bytes]) -> dict[bytes, list[Row]]:
    """The kept lines of ``digests`` that still hold (a digest with any line that does not: none)."""
    if not digests:
        return {}
    out: dict[bytes, list[Row]] = {}
    for r in conn.execute(S.LOOKUP_SQL, {"digests": list(digests)}).fetchall():
        out.setdefault(bytes(r[0]), []).append(tuple(r[2:]))
    return out


def days_between(lo: datetime, hi: datetime) -> list[str]:
    """The UTC days from ``lo``'s to ``hi``'s, as the marks ``e:<node>:<day>`` name them."""
    d0, d1 = lo.astimezone(UTC).date(), hi.astimezone(UTC).date()
    return [(d0 + timedelta(days=i)).isoformat() for i in range((d1 - d0).days + 1)] if d1 >= d0 else []


def plan(
    conn: psycopg.Connection, keyed: Mapping[str, Sequence[Piece]], digests: Mapping[str, bytes]
) -> dict[str, Fill]:
    """The marks each key's answer will rest on, read before it is computed (in its snapshot, or
    earlier: a change in between leaves a mark newer than the one recorded, never the reverse)."""
    keys = [k for k, ps in keyed.items() if ps]
    if not keys:
        return {}
    spans = {k: (min(p.lo for p in keyed[k]), max(p.hi for p in keyed[k])) for k in keys}
    runs = {k: keyed[k][0].run_id for k in keys}
    ctx: dict[int, list[tuple[Any, ...]]] = {}
    rows = conn.execute(
        S.CONTEXT_SQL,
        {
            "runs": [runs[k] for k in keys],
            "los": [spans[k][0] for k in keys],
            "his": [spans[k][1] for k in keys],
        },
    ).fetchall()
    for r in rows:
        ctx.setdefault(int(r[0]) - 1, []).append(tuple(r[1:]))
    scopes: dict[str, list[str]] = {}
    for i, k in enumerate(keys):
        lo, hi = spans[k]
        days = days_between(lo, hi)
        pairs = sorted({(p.node, p.gpu) for p in keyed[k]})
        nodes = sorted({n for n, _ in pairs})
        got = [f"r:{runs[k]}"]
        site_rows = ctx.get(i, [])
        got.append(f"s:{site_rows[0][0] if site_rows and site_rows[0][0] is not None else ''}")
        got += [f"f:{n}" for n in nodes]
        got += [f"e:{n}" for n in nodes]  # moved by a change of more days than are marked one by one
        got += [f"e:{n}:{d}" for n in nodes for d in days]
        for _site, region, first, last in site_rows:
            if region is None:
                continue
            got += [f"c:{region}", *(f"c:{region}:{d}" for d in days)]
            # a point before the first changes what is carried back to a span ending by the first; one
            # after the last what is carried forward to a span starting after it (the days cover the rest)
            if first is None or hi <= first:
                got.append(f"c:{region}:head")
            if last is None or lo > last:
                got.append(f"c:{region}:tail")
        scopes[k] = sorted(set(got))
    every = sorted({s for v in scopes.values() for s in v})
    marks = current_marks(conn, every)
    out: dict[str, Fill] = {}
    for k in keys:
        pairs = sorted({(p.node, p.gpu) for p in keyed[k]})
        out[k] = Fill(
            digests[k],
            tuple(scopes[k]),
            tuple(int(marks.get(s, 0)) for s in scopes[k]),
            tuple(n for n, _ in pairs),
            tuple(g for _, g in pairs),
            spans[k][0],
            spans[k][1],
            (),
        )
    return out


def defer(conn: psycopg.Connection, write: Callable[[psycopg.Connection], None]) -> None:
    """Run ``write`` (storing what a reader computed) now, or when the caller's read-only snapshot ends;
    never on a session that cannot write (a hot standby)."""
    row = conn.execute("SHOW transaction_read_only").fetchone()
    if row is not None and row[0] == "on":
        if conn.info.transaction_status == TransactionStatus.INTRANS:  # a read-only snapshot: after it
            _pending.setdefault(conn, []).append(write)
        return
    write(conn)


def current_marks(conn: psycopg.Connection, scopes: Collection[str]) -> dict[str, int]:
    """The current mark of each of ``scopes`` that has one (an input never changed has none: 0)."""
    return dict(conn.execute(S.MARKS_SQL, {"scopes": list(scopes)}).fetchall()) if scopes else {}


@dataclass(frozen=True)
class Marks:
    """The marks one kept answer rests on, as they were read before it was computed."""

    scopes: tuple[str, ...]
    versions: tuple[int, ...]


def marks_of(conn: psycopg.Connection, scopes: Mapping[str, Sequence[str]]) -> dict[str, Marks]:
    """The current marks of each key's ``scopes`` (key -> its scopes), read in one query (in, or before,
    the snapshot the answers are computed in: a change in between leaves a newer mark than the one
    recorded)."""
    got = current_marks(conn, sorted({s for v in scopes.values() for s in v}))
    return {k: Marks(tuple(sc), tuple(int(got.get(s, 0)) for s in sc)) for k, sc in scopes.items()}


def keep(conn: psycopg.Connection, fills: Iterable[Fill]) -> None:
    """Store ``fills`` now, or when the caller's read-only snapshot ends."""
    todo = list(fills)
    if todo:
        defer(conn, lambda c: _write(c, todo))


def flush(conn: psycopg.Connection) -> None:
    """Store what a read-only snapshot on ``conn`` computed (called when it has ended)."""
    for write in _pending.pop(conn, []):
        write(conn)


def _write(conn: psycopg.Connection, fills: list[Fill]) -> None:
    values = [
        (f.digest, i, list(f.scopes), list(f.versions), list(f.nodes), list(f.gpus), f.lo, f.hi, *r, f.lo)
        for f in fills
        for i, r in enumerate(f.rows)
    ]

    def store() -> None:
        conn.execute(S.DELETE_SQL, {"digests": [f.digest for f in fills]})
        with conn.cursor() as cur:
            cur.executemany(S.INSERT_SQL, values)

    store_quietly(conn, store)


def keep_rows(conn: psycopg.Connection, statement: str, values: Sequence[Sequence[Any]]) -> None:
    """Run ``statement`` for each of ``values`` in a transaction of its own (:func:`store_quietly`), now
    or when the caller's read-only snapshot ends (:func:`defer`): how what a reader computed is kept."""
    if not values:
        return

    def write(c: psycopg.Connection) -> None:
        def store() -> None:
            with c.cursor() as cur:
                cur.executemany(statement, values)

        store_quietly(c, store)

    defer(conn, write)


def store_quietly(conn: psycopg.Connection, store: Callable[[], None]) -> None:
    """Run ``store`` in a transaction of its own: refused because the session cannot write or another
    reader stores the same key, it keeps nothing, and the answer already given stands."""
    try:
        with conn.transaction():
            store()
    except (
        errors.ReadOnlySqlTransaction,
        errors.InsufficientPrivilege,
        errors.SerializationFailure,
        errors.DeadlockDetected,
    ) as e:
        # a hot standby, a role that only reads, or another reader storing the same lines: the answer
        # given stands, only not kept
        log.debug("priced answer not kept: %s", e)
