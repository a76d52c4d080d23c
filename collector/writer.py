"""Group commit: many small ingest requests, one COPY transaction.

One node sends ~80 rows every few seconds; a COPY transaction per request
would spend its time on commits.  Requests are queued here, a writer thread
gathers whatever is waiting (up to ``group_max_rows``, lingering ``linger_s``),
writes it all with binary COPY in one transaction and only then resolves each
request's future, so a 2xx always means committed.

Idempotency: every (node, batch id) goes into ``ingest_batches`` in the same
transaction (``ON CONFLICT DO NOTHING``); rows are copied only for the ids
that were new, so a retried batch is acknowledged without being stored twice,
whatever has happened to its chunk since (compression included).  The key
includes the node: another node sending the same id (a cloned agent, or a
token of another node) must not turn this node's batch into a "duplicate".

Runs: the (run, node, GPU) sightings of the samples' ``run_id`` are kept in
the same transaction (:mod:`gpufleet.collector.sightings`), for inferred runs.

Isolation: whatever goes wrong while encoding or writing one batch fails
that batch alone.  A group that fails is retried batch by batch; a batch that
still fails answers 422 when the database refused its content and 500 for
anything else, and the writer carries on.  A writer thread that dies anyway
is restarted by a supervisor (``healthy`` is False until it is), the batches
it held answer 503, and ``stop`` drains within a bounded time, failing with
503 whatever it could not write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import psycopg

from gpufleet.collector import sightings
from gpufleet.collector.batch_store import NodeTouch, write_batches
from gpufleet.wire import Batch

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """Too many rows already waiting: answer 429 with Retry-After."""


class DatabaseUnavailable(Exception):
    """The database cannot take writes now: answer 503 with Retry-After."""


class BatchRejected(Exception):
    """The database refused this batch's content (answer 422)."""


class WriteFailed(Exception):
    """Writing this batch failed for a reason other than its content or the
    database being down (answer 500); the writer itself carries on."""


@dataclass
class Outcome:
    stored: bool  # False: a duplicate of an already committed batch
    gpu_rows: int
    host_rows: int
    rejected_skew: int
    #: Energy counter jumps beyond what a GPU can draw (stored; accounting integrates power instead).
    energy_glitches: int = 0


@dataclass(eq=False)
class _Item:
    batch: Batch
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[Outcome]
    rows: int
    enqueued: float = field(default_factory=time.monotonic)


class WriterStats:
    def __init__(self) -> None:
        self.transactions = 0
        self.batches_stored = 0
        self.batches_duplicate = 0
        self.gpu_rows = 0
        self.host_rows = 0
        self.db_errors = 0
        self.write_errors = 0
        self.restarts = 0
        self.last_commit_s = 0.0


class GroupWriter:
    """Owns ``threads`` writer connections and the queue in front of them."""

    def __init__(
        self,
        url: str,
        *,
        max_rows: int = 20_000,
        linger_s: float = 0.005,
        linger_batches: int = 16,
        queue_max_rows: int = 400_000,
        threads: int = 2,
        node_touch_s: float = 10.0,
    ) -> None:
        self.url = url
        self.max_rows = max_rows
        self.linger_s = linger_s
        #: A lingering writer stops waiting once this many requests are queued.
        self.linger_batches = linger_batches
        self.queue_max_rows = queue_max_rows
        self.threads = threads
        self.node_touch_s = node_touch_s
        self.stats = WriterStats()
        self._q: deque[_Item] = deque()
        self._queued_rows = 0
        lock = threading.Lock()
        #: Idle writers wait here for work; the one lingering writer waits on
        #: ``_linger_cv`` and is woken only when its group is full enough, so a
        #: request arriving during a linger costs no thread wake-up.
        self._cv = threading.Condition(lock)
        self._linger_cv = threading.Condition(lock)
        self._lingering = False
        self._stop = False
        self._db_ok = True
        self._workers: list[threading.Thread] = []
        self._supervisor: threading.Thread | None = None
        #: Items each worker thread has taken and not yet resolved, by thread.
        self._held: dict[int, dict[int, _Item]] = {}
        self._touch = NodeTouch(node_touch_s)
        self.sightings = sightings.SightingCache()

    # -- producer side (event loop) -------------------------------------------

    @property
    def db_ok(self) -> bool:
        return self._db_ok

    def mark_db(self, ok: bool) -> None:
        """Set by the health monitor: while down, requests get 503 at once."""
        self._db_ok = ok

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def submit(self, batch: Batch) -> asyncio.Future[Outcome]:
        if not self._db_ok:
            raise DatabaseUnavailable("database unavailable")
        rows = batch.n_gpu + batch.n_host + 1
        loop = asyncio.get_running_loop()
        with self._cv:
            if self._queued_rows + rows > self.queue_max_rows and self._queued_rows > 0:
                raise Overloaded(f"{self._queued_rows} rows already waiting for the database")
            item = _Item(batch, loop, loop.create_future(), rows)
            self._q.append(item)
            self._queued_rows += rows
            if not self._lingering:
                self._cv.notify()
            elif len(self._q) >= self.linger_batches or self._queued_rows >= self.max_rows // 4:
                self._linger_cv.notify()
        return item.fut

    # -- lifecycle -------------------------------------------------------------

    #: How often the supervisor looks for dead writer threads, seconds.
    supervise_s = 0.2

    def start(self) -> None:
        self._stop = False
        self._workers = [self._spawn(i) for i in range(self.threads)]
        self._supervisor = threading.Thread(
            target=self._supervise, name="gpufleet-writer-supervisor", daemon=True
        )
        self._supervisor.start()

    def _spawn(self, i: int) -> threading.Thread:
        t = threading.Thread(target=self._run, name=f"gpufleet-writer-{i}", daemon=True)
        t.start()
        return t

    @property
    def healthy(self) -> bool:
        """Every writer thread is alive (False between a crash and its restart)."""
        return bool(self._workers) and all(t.is_alive() for t in self._workers)

    def _supervise(self) -> None:
        while not self._stop:
            time.sleep(self.supervise_s)
            for i, t in enumerate(list(self._workers)):
                if t.is_alive() or self._stop:
                    continue
                self.stats.restarts += 1
                held = list(self._held.pop(t.ident or -1, {}).values())
                log.error(
                    "writer thread %s died; restarting it (%d batches it held answer 503)", t.name, len(held)
                )
                self._resolve(held, exc=DatabaseUnavailable("the writer failed; the batch was not stored"))
                self._workers[i] = self._spawn(i)

    def stop(self, timeout: float = 10.0) -> None:
        """Drain what is queued, then stop the threads; within ``timeout`` in all.

        Whatever is still queued or held after that answers 503 (not stored,
        retry), so no request waits on a writer that is gone.
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            self._linger_cv.notify_all()
        if self._supervisor is not None:
            self._supervisor.join(max(deadline - time.monotonic(), 0.0))
            self._supervisor = None
        for t in self._workers:
            t.join(max(deadline - time.monotonic(), 0.0))
        unavailable = DatabaseUnavailable("the collector is stopping; the batch was not stored")
        self._fail_waiting(unavailable)
        for t in self._workers:
            if not t.is_alive():
                self._resolve(list(self._held.pop(t.ident or -1, {}).values()), exc=unavailable)
            else:
                # Stuck in the database: its items may still commit; answer
                # them 503 now (a retry is harmless: batch ids are idempotent).
                self._resolve(list(self._held.get(t.ident or -1, {}).values()), exc=unavailable)
        self._workers.clear()

    # -- consumer side (writer threads) ----------------------------------------

    def _take(self) -> list[_Item]:
        with self._cv:
            # While another writer lingers, the queue is its group: wait for it to take it.
            while (not self._q or self._lingering) and not self._stop:
                self._cv.wait(0.5)
            if not self._q:
                return []
            if self.linger_s and len(self._q) < 4 and not self._stop:
                # Few waiting: linger for the interval until a group's worth of
                # requests (``linger_batches``) or a quarter group of rows is in.
                # One writer lingers at a time and arrivals do not wake it, so
                # at a few hundred requests a second each transaction gathers a
                # dozen requests, not one (transactions and their commits are
                # the larger part of the CPU per sample at moderate fleet sizes,
                # bench/vs_prometheus.py); under load the queue is never short
                # and nothing lingers.
                self._lingering = True
                try:
                    deadline = time.monotonic() + self.linger_s
                    while (
                        len(self._q) < self.linger_batches
                        and self._queued_rows < self.max_rows // 4
                        and not self._stop
                    ):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._linger_cv.wait(left)
                finally:
                    self._lingering = False
            items: list[_Item] = []
            rows = 0
            while self._q and (not items or rows + self._q[0].rows <= self.max_rows):
                it = self._q.popleft()
                items.append(it)
                rows += it.rows
            self._queued_rows -= rows
            self._held[threading.get_ident()] = {id(it): it for it in items}
            if self._q:
                self._cv.notify()  # more than one group waiting: another writer takes the rest
            return items

    def _connect(self) -> psycopg.Connection | None:
        try:
            conn = psycopg.connect(self.url, connect_timeout=3, application_name="gpufleet-writer")
            conn.execute("SET synchronous_commit = on")
            conn.commit()
            self._db_ok = True
            return conn
        except (psycopg.Error, OSError) as e:
            self._db_ok = False
            log.warning("writer cannot reach the database: %s", e.__class__.__name__)
            return None

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while True:
            if conn is None or conn.closed:
                conn = self._connect()
                if conn is None:
                    self._fail_waiting(DatabaseUnavailable("database unavailable"))
                    if self._stop:
                        return
                    time.sleep(0.5)
                    continue
            items = self._take()
            if not items:
                if self._stop:
                    conn.close()
                    return
                continue
            try:
                outcomes = self._write(conn, items)
            except psycopg.OperationalError as e:
                self.stats.db_errors += 1
                log.warning("database write failed (%s); answering 503", e.__class__.__name__)
                self._db_ok = False
                self._resolve(items, exc=DatabaseUnavailable("database unavailable"))
                try:
                    conn.close()
                except psycopg.Error:
                    pass
                conn = None
                continue
            except Exception as e:  # noqa: BLE001 - one batch's failure must not end the writer
                # Content the database refused despite validation, or anything
                # else one batch's encoding or write raised: isolate it by
                # writing batches one at a time so the others still land.
                self.stats.db_errors += isinstance(e, psycopg.Error)
                log.error("group write failed: %s; retrying batches one by one", e.__class__.__name__)
                conn = self._write_singly(_rolled_back(conn), items)
                continue
            self._resolve(items, outcomes=outcomes)

    def _write_singly(self, conn: psycopg.Connection | None, items: list[_Item]) -> psycopg.Connection | None:
        """Write ``items`` one by one, each failing alone; returns the connection
        to go on with (None when it was lost)."""
        for it in items:
            if conn is None or conn.closed:
                self._resolve([it], exc=DatabaseUnavailable("database unavailable"))
                continue
            try:
                out = self._write(conn, [it])
                self._resolve([it], outcomes=out)
            except psycopg.OperationalError:
                self._db_ok = False
                self._resolve([it], exc=DatabaseUnavailable("database unavailable"))
                conn = _rolled_back(conn)
            except psycopg.Error as e:
                conn = _rolled_back(conn)
                diag = getattr(e, "diag", None)
                detail = getattr(diag, "message_primary", None) or e.__class__.__name__
                self._resolve([it], exc=BatchRejected(f"database refused the batch: {detail}"))
            except Exception as e:
                conn = _rolled_back(conn)
                self.stats.write_errors += 1
                log.exception("writing batch %r of node %r failed", it.batch.batch_id, it.batch.node)
                self._resolve(
                    [it], exc=WriteFailed(f"the batch could not be written ({e.__class__.__name__})")
                )
        return conn

    def _fail_waiting(self, exc: Exception) -> None:
        with self._cv:
            items = list(self._q)
            self._q.clear()
            self._queued_rows = 0
        self._resolve(items, exc=exc)

    def _resolve(
        self, items: list[_Item], outcomes: list[Outcome] | None = None, exc: Exception | None = None
    ) -> None:
        """Answer ``items``: one call into each waiting event loop for the whole group."""
        held = self._held.get(threading.get_ident())
        per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Outcome], Outcome | None]]] = {}
        for i, it in enumerate(items):
            per_loop.setdefault(it.loop, []).append((it.fut, None if outcomes is None else outcomes[i]))
            if held is not None:
                held.pop(id(it), None)
        assert exc is not None or outcomes is not None
        for loop, answers in per_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, answers, exc)
            except RuntimeError:  # that event loop is closed: nobody waits
                pass

    def _write(self, conn: psycopg.Connection, items: list[_Item]) -> list[Outcome]:
        t0 = time.perf_counter()
        # Within one group the first copy of a (node, batch id) wins.
        first: dict[tuple[str, str], _Item] = {}
        for it in items:
            first.setdefault((it.batch.node, it.batch.batch_id), it)
        with conn.transaction():
            done = write_batches(
                conn, [it.batch for it in first.values()], sightings_cache=self.sightings, touch=self._touch
            )
        self.sightings.stored(done.sightings)
        new = [b for b in (it.batch for it in first.values()) if (b.node, b.batch_id) in done.new]
        self.stats.transactions += 1
        self.stats.batches_stored += len(new)
        self.stats.batches_duplicate += len(items) - len(new)
        self.stats.gpu_rows += sum(b.n_gpu for b in new)
        self.stats.host_rows += sum(b.n_host for b in new)
        self.stats.last_commit_s = time.perf_counter() - t0
        seen: set[tuple[str, str]] = set()
        out = []
        for it in items:
            b = it.batch
            key = (b.node, b.batch_id)
            stored = key in done.new and key not in seen
            seen.add(key)
            out.append(
                Outcome(
                    stored, b.n_gpu, b.n_host, b.rejected_skew, done.glitches.get(key, 0) if stored else 0
                )
            )
        return out


def _rolled_back(conn: psycopg.Connection) -> psycopg.Connection | None:
    """``conn`` after a rollback, or None (closed) when even that fails."""
    try:
        conn.rollback()
        return conn
    except psycopg.Error:
        with contextlib.suppress(psycopg.Error):
            conn.close()
        return None


def _settle(answers: list[tuple[asyncio.Future[Outcome], Outcome | None]], exc: Exception | None) -> None:
    for fut, value in answers:
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            assert value is not None
            fut.set_result(value)
