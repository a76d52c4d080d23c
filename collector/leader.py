"""Work that exactly one collector replica does: rollups, inferred runs, detector sweeps, retention.

Each sweep interval, runs are first registered from what agents saw on the
GPUs (:class:`gpufleet.store.inferred.Inferrer`, when ``runs.infer``), so
the sweep that follows covers them.

Leadership is a PostgreSQL session advisory lock held on a dedicated
connection.  When the leader dies its connection closes and the lock is
released; every other replica retries each ``sweep_interval_s``, so a new
leader takes over within one sweep interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg

from gpufleet.collector import rollup
from gpufleet.collector.heap import release_free_memory
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.config import Settings
from gpufleet.db.policies import backend_of, enforce_retention_plain, enforce_span_retention
from gpufleet.store.inferred import Inferrer

log = logging.getLogger(__name__)

#: Advisory lock key: "gpufleet" as an int64.
LEADER_LOCK = 0x67707566_6C656574

SweepFn = Callable[[psycopg.Connection, float], None]


class Leader:
    def __init__(self, url: str, settings: Settings, metrics: CollectorMetrics,
                 sweep: SweepFn | None = None, rollup_interval_s: float = 1.0) -> None:
        self.url = url
        self.settings = settings
        self.metrics = metrics
        self.sweep = sweep
        self.rollup_interval_s = rollup_interval_s
        self.is_leader = False
        self.sweeps = 0
        self.last_sweep_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.inferrer = Inferrer(settings.runs.inferred_end_grace_s) if settings.runs.infer else None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-leader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3,
                                     application_name="gpufleet-leader") as lock_conn:
                    self._contend(lock_conn)
            except psycopg.Error as e:
                log.warning("leader connection lost: %s", e.__class__.__name__)
            self._set_leader(False)
            self._stop.wait(min(1.0, self.settings.detect.sweep_interval_s))

    def _set_leader(self, value: bool) -> None:
        if value != self.is_leader:
            log.info("this replica %s leader", "became" if value else "is no longer")
        self.is_leader = value
        self.metrics.leader.set(1 if value else 0)

    def _contend(self, lock_conn: psycopg.Connection) -> None:
        while not self._stop.is_set():
            got = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
            if got and got[0]:
                self._set_leader(True)
                try:
                    self._lead(lock_conn)
                finally:
                    if not lock_conn.closed:
                        lock_conn.execute("SELECT pg_advisory_unlock(%s)", (LEADER_LOCK,))
                return
            self._stop.wait(self.settings.detect.sweep_interval_s)

    def _lead(self, lock_conn: psycopg.Connection) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="gpufleet-worker") as work:
            plain = backend_of(work) != "timescaledb"
            next_sweep = time.monotonic()
            next_retention = time.monotonic() + 60.0
            while not self._stop.is_set():
                lock_conn.execute("SELECT 1")  # notice a lost lock connection promptly
                res = rollup.run_once(work, self.settings.accounting.max_gap_s, plain)
                backlog = work.execute("SELECT count(*) FROM rollup_queue").fetchone()
                self.metrics.rollup_lag.set(backlog[0] if backlog else 0)
                now = time.monotonic()
                if now >= next_sweep:
                    self._infer(work)
                if self.sweep is not None and now >= next_sweep:
                    next_sweep = now + self.settings.detect.sweep_interval_s
                    t0 = time.perf_counter()
                    try:
                        self.sweep(work, time.time())
                        self.last_sweep_error = None
                    except psycopg.OperationalError:
                        raise
                    except Exception as e:  # a detector bug must not stop rollups
                        self.last_sweep_error = f"{e.__class__.__name__}: {e}"
                        log.exception("detector sweep failed")
                    self.sweeps += 1
                    self.metrics.sweep_seconds.observe(time.perf_counter() - t0)
                    release_free_memory()
                if now >= next_retention:
                    next_retention = now + 3600.0
                    if plain:
                        enforce_retention_plain(work, self.settings)
                    else:  # TimescaleDB's policies keep the rollups; spans are an ordinary table
                        enforce_span_retention(work, self.settings)
                if self.sweep is None and now >= next_sweep:
                    next_sweep = now + self.settings.detect.sweep_interval_s
                if res.ranges == 0:
                    self._stop.wait(self.rollup_interval_s)

    def _infer(self, work: psycopg.Connection) -> None:
        """Register, allocate and end inferred runs; a failure is logged and never stops the leader's work."""
        if self.inferrer is None:
            return
        try:
            res = self.inferrer.run_once(work, datetime.now(UTC))
        except psycopg.OperationalError:
            raise
        except Exception:  # a bug here must not stop rollups or sweeps
            log.exception("inferring runs failed")
            return
        self.metrics.inferred_runs.inc(len(res.created))
        self.metrics.inferred_conflicts.inc(len(res.conflicts))


class DbMonitor:
    """Pings the database each second so readiness and ingest notice an outage
    within seconds, even when no write is in flight."""

    def __init__(self, url: str, on_change: Callable[[bool], None], interval_s: float = 1.0) -> None:
        self.url = url
        self.on_change = on_change
        self.interval_s = interval_s
        self.ok = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-dbmonitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.is_set():
            ok = False
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2,
                                           application_name="gpufleet-monitor")
                conn.execute("SELECT 1")
                ok = True
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            if ok != self.ok:
                log.warning("database is %s", "reachable again" if ok else "unreachable")
            self.ok = ok
            self.on_change(ok)
            self._stop.wait(self.interval_s)
        if conn is not None:
            conn.close()
