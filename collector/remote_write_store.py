"""Remote-write pieces in the database until their (node, time) is whole, then rows like any batch's.

A request is acknowledged once its pieces are committed to
``remote_write_parts`` (one statement); nothing is held in memory that a
crash could lose.  One collector replica at a time (an advisory lock) runs the
:class:`Assembler`: every ``assemble_every_s`` it takes the (node, time)
groups whose last piece arrived ``merge_delay_s`` ago or more, merges them
(:func:`gpufleet.collector.remote_write_rows.assemble_all`) and stores them
as an agent's batches are stored (:mod:`gpufleet.collector.batch_store`):
each group's batch id ``rw:<ms>`` registered in ``ingest_batches`` with its
time range queued for the rollups, then the new groups' rows copied, one part
per node, their run sightings kept and their nodes touched -- deleting the
pieces in the same transaction.  So a group is written once or not at all,
and a piece that arrives for a (node, time) already written (a retry whose
answer was lost, or a shard later than the merge delay) finds its batch id
taken and is counted, not stored twice.

The merge delay is what a scrape's pieces have to arrive in: Prometheus sends
a shard's batch after ``batch_send_deadline`` (5 s by default) at the latest,
and retries a refused one with a backoff of up to ``max_backoff`` (5 s), so
10 s covers a scrape split over shards and batches unless the collector was
refusing requests meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import psycopg
from psycopg import sql

from gpufleet.collector import sightings
from gpufleet.collector.batch_store import (
    GPU_SPECS,
    HOST_SPECS,
    REGISTER_SQL,
    NodeTouch,
    copy_data,
    register_params,
    touch_nodes,
    write_batches,
)
from gpufleet.collector.remote_write_pieces import Piece
from gpufleet.collector.remote_write_rows import (
    Assembled,
    Group,
    GroupRows,
    NodeState,
    assemble_all,
    node_batch,
)
from gpufleet.wire import Batch

log = logging.getLogger(__name__)

#: pg_advisory_lock key of the one assembler ("gpufleet-rw" as an integer).
LOCK_KEY = 0x6770_666C_2D72_77

STAGE_SQL = """
INSERT INTO remote_write_parts (node, t_ms, gpu_samples, host_samples, body)
SELECT * FROM unnest(%s::text[], %s::int8[], %s::int4[], %s::int4[], %b::bytea[])"""

#: The groups whose last piece is at least the merge delay old, oldest first, taken out whole.
TAKE_SQL = """
WITH ready AS (
  SELECT node, t_ms FROM remote_write_parts GROUP BY node, t_ms
  HAVING max(received_at) <= clock_timestamp() - make_interval(secs => %(delay)s)
  ORDER BY min(id) LIMIT %(limit)s
)
DELETE FROM remote_write_parts p USING ready r WHERE p.node = r.node AND p.t_ms = r.t_ms
RETURNING p.id, p.node, p.t_ms, p.body"""

PENDING_SQL = "SELECT count(*) FROM remote_write_parts"


def copy_rows(
    conn: psycopg.Connection, table: str, specs: list[Any], parts: list[tuple[str, Any, int]]
) -> None:
    """The writer's binary COPY of columnar parts (gpufleet.collector.batch_store.copy_data)."""
    present, chunks = copy_data(specs, parts)
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(sp.name) for sp in present)
    )
    with conn.cursor().copy(stmt) as cp:
        for chunk in chunks:
            cp.write(chunk)


def stage_params(pieces: list[Piece]) -> tuple[list[str], list[int], list[int], list[int], list[bytes]]:
    return (
        [p.node for p in pieces],
        [p.t_ms for p in pieces],
        [p.gpu_samples for p in pieces],
        [p.host_samples for p in pieces],
        [p.body for p in pieces],
    )


@dataclass
class Cycle:
    """What one assembly cycle did."""

    groups: int = 0
    #: Groups whose pieces could not be read (logged; their pieces are deleted with the others).
    failed: int = 0
    stored: int = 0
    duplicates: int = 0
    empty: int = 0
    gpu_rows: int = 0
    host_rows: int = 0
    batches: list[Batch] = field(default_factory=list)


class Assembler:
    """Merges whole (node, time) groups into rows; one replica at a time, in a thread of its own."""

    def __init__(
        self,
        url: str,
        *,
        merge_delay_s: float,
        every_s: float,
        max_groups: int = 5000,
        on_cycle: Callable[[Cycle, int], None] | None = None,
        max_gpu_index: int = 32767,
        max_runs: int = 1 << 30,
    ) -> None:
        self.url = url
        self.max_gpu_index = max_gpu_index
        self.max_runs = max_runs
        self.merge_delay_s = merge_delay_s
        self.every_s = every_s
        self.max_groups = max_groups
        self.on_cycle = on_cycle
        self.states: dict[str, NodeState] = {}
        self.sightings = sightings.SightingCache()
        self.touch = NodeTouch(10.0)
        #: Pieces waiting, as last counted (the ingest side answers 503 above its bound).
        self.pending = 0
        self.holds_lock = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one cycle (also what tests and the benchmark call) ------------------------------

    def cycle(self, conn: psycopg.Connection) -> Cycle:
        """Take the ready groups, store their rows and delete their pieces, in one transaction."""
        out = Cycle()
        with conn.transaction():
            # Binary: the pieces come back as the bytes they are, not as hexadecimal text to decode.
            taken = conn.execute(
                TAKE_SQL, {"delay": self.merge_delay_s, "limit": self.max_groups}, binary=True
            ).fetchall()
            pieces: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)
            for pid, node, t_ms, body in taken:
                pieces[(node, t_ms)].append((pid, bytes(body)))
            groups = [
                Group(node, t_ms, [b for _, b in sorted(parts)])
                for (node, t_ms), parts in sorted(pieces.items())
            ]
            try:
                done = assemble_all(groups, self.states, self.max_gpu_index, self.max_runs)
            except (ValueError, KeyError, TypeError, IndexError, msgpack.UnpackException) as e:
                # Pieces are written by this module only; ones that do not read are a defect, and must
                # not stop every group after them: this cycle's are dropped, with the reason.
                log.error(
                    "remote write: %d groups' pieces do not read (%s: %s); dropped",
                    len(groups),
                    e.__class__.__name__,
                    e,
                )
                out.failed += len(groups)
                done = Assembled()
            out.empty += done.empty
            out.failed += done.invalid
            out.groups = len(groups)
            batches, seen = self._store(conn, done, out)
            self.pending = int(conn.execute(PENDING_SQL).fetchone()[0])  # type: ignore[index]
        if seen is not None:
            self.sightings.stored(seen)
        out.batches = batches
        return out

    def _store(self, conn: psycopg.Connection, done: Assembled, out: Cycle) -> tuple[list[Batch], Any]:
        """Register every group's batch id (a (node, time) is stored once), then store the new groups'
        rows as one batch per node -- the writer's COPY, run sightings and node facts -- in ``conn``'s
        transaction; what was stored, and the sightings written."""
        if done.rows is None:  # groups checked one by one: each its own batch
            if not done.batches:
                return [], None
            written = write_batches(conn, done.batches, sightings_cache=self.sightings, touch=self.touch)
            for b in done.batches:
                self._count(out, b.node, (b.node, b.batch_id) in written.new, b.n_gpu, b.n_host, b.facts)
            return [b for b in done.batches if (b.node, b.batch_id) in written.new], written.sightings
        if not done.groups:
            return [], None
        rows: list[tuple[str, str, int, int, float | None, float | None]] = [
            (g.batch_id, g.node, g.b - g.a, g.hb - g.ha, g.t_ms / 1000.0, g.t_ms / 1000.0)
            for g in done.groups
        ]
        new = {(r[1], r[0]) for r in conn.execute(REGISTER_SQL, register_params(rows)).fetchall()}
        per_node: dict[str, list[GroupRows]] = defaultdict(list)
        for g in done.groups:
            stored = (g.node, g.batch_id) in new
            self._count(out, g.node, stored, g.b - g.a, g.hb - g.ha, g.facts)
            if stored:
                per_node[g.node].append(g)
        batches = [node_batch(done.rows, node, gs[0].batch_id, gs) for node, gs in per_node.items()]
        if any(b.n_gpu for b in batches):
            copy_rows(conn, "gpu_samples", GPU_SPECS, [(b.node, b.gpu, b.n_gpu) for b in batches if b.n_gpu])
        if any(b.n_host for b in batches):
            copy_rows(
                conn, "host_samples", HOST_SPECS, [(b.node, b.host, b.n_host) for b in batches if b.n_host]
            )
        seen = sightings.record(conn, batches, self.sightings)
        touch_nodes(conn, batches, self.touch)
        return batches, seen

    def _count(
        self, out: Cycle, node: str, stored: bool, gpu_rows: int, host_rows: int, facts: dict[str, Any] | None
    ) -> None:
        if stored:
            out.stored += 1
            out.gpu_rows += gpu_rows
            out.host_rows += host_rows
        else:
            out.duplicates += 1
            if facts is not None:
                self.states[node].facts = None  # not stored: send them again next time

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-remote-write", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    self.holds_lock = False
                    conn = psycopg.connect(
                        self.url, autocommit=True, connect_timeout=3, application_name="gpufleet-remote-write"
                    )
                if not self.holds_lock:
                    got = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
                    if not (got and got[0]):
                        self._stop.wait(self.every_s * 5)
                        continue
                    # Another replica may have assembled meanwhile: what this one knew is stale.
                    self.states.clear()
                    self.holds_lock = True
                t0 = time.monotonic()
                done = self.cycle(conn)
                if self.on_cycle is not None:
                    self.on_cycle(done, self.pending)
                if done.groups < self.max_groups:
                    self._stop.wait(max(0.0, self.every_s - (time.monotonic() - t0)))
            except psycopg.Error as e:
                log.warning("remote write: assembling failed (%s: %s); retrying", e.__class__.__name__, e)
                self.holds_lock = False
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                conn = None
                self._stop.wait(1.0)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
