"""Remote-write pieces in the database until their (node, time) is whole, then rows like any batch's.

A request is acknowledged once its pieces are committed to
``remote_write_parts`` (one statement); nothing is held in memory that a
crash could lose.  One collector replica at a time (an advisory lock) runs the
:class:`Assembler`: every ``assemble_every_s`` it takes the (node, time)
groups whose last piece arrived ``merge_delay_s`` ago or more, merges them
(:func:`gpufleet.collector.remote_write_rows.assemble`) and stores the rows
with :func:`gpufleet.collector.batch_store.write_batches` -- the same
registration of batch ids, rollup ranges, run sightings and node facts as an
agent's batch -- deleting the pieces in the same transaction.  So a group is
written once or not at all, and a piece that arrives for a (node, time)
already written (a retry whose answer was lost, or a shard later than the
merge delay) finds its batch id taken and is counted, not stored twice.

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

import msgpack
import psycopg

from gpufleet.collector import sightings
from gpufleet.collector.batch_store import NodeTouch, write_batches
from gpufleet.collector.remote_write_pieces import Piece
from gpufleet.collector.remote_write_rows import Assembled, Group, NodeState, assemble_all
from gpufleet.wire import Batch

log = logging.getLogger(__name__)

#: pg_advisory_lock key of the one assembler ("gpufleet-rw" as an integer).
LOCK_KEY = 0x6770_666C_2D72_77

STAGE_SQL = """
INSERT INTO remote_write_parts (node, t_ms, gpu_samples, host_samples, body)
SELECT * FROM unnest(%s::text[], %s::int8[], %s::int4[], %s::int4[], %s::bytea[])"""

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


def stage_params(pieces: list[Piece]) -> tuple[list[str], list[int], list[int], list[int], list[bytes]]:
    return ([p.node for p in pieces], [p.t_ms for p in pieces], [p.gpu_samples for p in pieces],
            [p.host_samples for p in pieces], [p.body for p in pieces])


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

    def __init__(self, url: str, *, merge_delay_s: float, every_s: float, max_groups: int = 5000,
                 on_cycle: Callable[[Cycle, int], None] | None = None, max_gpu_index: int = 32767,
                 max_runs: int = 1 << 30) -> None:
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
            taken = conn.execute(TAKE_SQL, {"delay": self.merge_delay_s, "limit": self.max_groups}).fetchall()
            pieces: dict[tuple[str, int], list[tuple[int, bytes]]] = defaultdict(list)
            for pid, node, t_ms, body in taken:
                pieces[(node, t_ms)].append((pid, bytes(body)))
            groups = [Group(node, t_ms, [b for _, b in sorted(parts)]) for (node, t_ms), parts in sorted(pieces.items())]
            try:
                done = assemble_all(groups, self.states, self.max_gpu_index, self.max_runs)
            except (ValueError, KeyError, TypeError, IndexError, msgpack.UnpackException) as e:
                # Pieces are written by this module only; ones that do not read are a defect, and must
                # not stop every group after them: this cycle's are dropped, with the reason.
                log.error("remote write: %d groups' pieces do not read (%s: %s); dropped", len(groups),
                          e.__class__.__name__, e)
                out.failed += len(groups)
                done = Assembled()
            batches = done.batches
            out.empty += done.empty
            out.failed += done.invalid
            out.groups = len(groups)
            if batches:
                written = write_batches(conn, batches, sightings_cache=self.sightings, touch=self.touch)
                for b in batches:
                    if (b.node, b.batch_id) in written.new:
                        out.stored += 1
                        out.gpu_rows += b.n_gpu
                        out.host_rows += b.n_host
                    else:
                        out.duplicates += 1
                        if b.facts is not None:
                            self.states[b.node].facts = None  # not stored: send them again next time
            self.pending = int(conn.execute(PENDING_SQL).fetchone()[0])  # type: ignore[index]
        if batches:
            self.sightings.stored(written.sightings)
        out.batches = batches
        return out

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
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3,
                                           application_name="gpufleet-remote-write")
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
