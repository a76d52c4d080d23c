"""Work that exactly one collector replica does: rollups, inferred runs, detector sweeps, retention.

Each sweep interval, runs are first registered from what agents saw on the
GPUs (:class:`gpufleet.store.inferred.Inferrer`, when ``runs.infer``), so
the sweep that follows covers them; after it, the costs of incidents that
closed and the ledgers of runs that ended are priced and kept
(:class:`gpufleet.accounting.ahead.PriceAhead`), so their first reader does
not wait for them.

Leadership is a PostgreSQL session advisory lock held on a dedicated
connection.  When the leader dies its connection closes and the lock is
released; every other replica retries each ``sweep_interval_s``, so a new
leader takes over within one sweep interval.

Sharded (``shard_sweep`` given, ``detect.shards`` shards): every replica
works.  Each balancing tick (``balance_interval_s``) a replica counts the
live replicas (sessions of ``REPLICA_APP`` on the database) and holds about
its share of the shards, one advisory lock each (:mod:`shards`): it takes
free shards while below ``ceil(shards / replicas)`` and lets go of the
extra ones above it, so a dead replica's shards (its locks ended with its
session) move to the others within a tick, and a new replica gets some.
It sweeps each shard it holds every ``sweep_interval_s`` and rebuilds the
rollups of the nodes hashed to them.  Retention and run inference, which
are fleet-wide, stay with the holder of the leader lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg

from gpufleet.accounting import fleet_hours
from gpufleet.accounting.ahead import PriceAhead
from gpufleet.collector import rollup
from gpufleet.collector.metrics import CollectorMetrics
from gpufleet.collector.shards import SHARD_LOCK_BASE
from gpufleet.config import Settings
from gpufleet.db.policies import backend_of, enforce_retention
from gpufleet.store.inferred import Inferrer

log = logging.getLogger(__name__)

#: Advisory lock key: "gpufleet" as an int64.
LEADER_LOCK = 0x67707566_6C656574

SweepFn = Callable[[psycopg.Connection, float], None]

#: application_name of the lock connections of sharded replicas: counted to share the shards.
REPLICA_APP = "gpufleet-shards"


class Leader:
    def __init__(
        self,
        url: str,
        settings: Settings,
        metrics: CollectorMetrics,
        sweep: SweepFn | None = None,
        rollup_interval_s: float = 1.0,
        shard_sweep: Callable[[int], SweepFn] | None = None,
        shards: int | None = None,
        balance_interval_s: float | None = None,
    ) -> None:
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
        self.ahead = PriceAhead(settings.accounting.max_gap_s, fleet=fleet_hours.keeping_of(settings))
        self.shard_sweep = shard_sweep
        self.shards = shards if shards is not None else settings.detect.shards
        self.balance_interval_s = (
            balance_interval_s
            if balance_interval_s is not None
            else min(1.0, settings.detect.sweep_interval_s)
        )
        #: Shards held now, with their sweeps; sweeps done per shard.
        self.held: dict[int, SweepFn] = {}
        self.shard_sweeps: dict[int, int] = {}
        #: Server process of the lock connection (where its advisory locks show in pg_locks).
        self.lock_pid: int | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-leader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        if self.shard_sweep is not None:
            self._run_sharded()
            return
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=3, application_name="gpufleet-leader"
                ) as lock_conn:
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
                    self._observe(self.sweep, time.perf_counter() - t0)
                    self._price_ahead(work)
                if now >= next_retention:
                    next_retention = now + 3600.0
                    enforce_retention(work, self.settings, plain)
                if self.sweep is None and now >= next_sweep:
                    next_sweep = now + self.settings.detect.sweep_interval_s
                if res.ranges == 0:
                    self._stop.wait(self.rollup_interval_s)

    # -- sharded ---------------------------------------------------------------

    def _run_sharded(self) -> None:
        while not self._stop.is_set():
            try:
                with (
                    psycopg.connect(
                        self.url, autocommit=True, connect_timeout=3, application_name=REPLICA_APP
                    ) as lock_conn,
                    psycopg.connect(
                        self.url, autocommit=True, connect_timeout=3, application_name="gpufleet-worker"
                    ) as work,
                ):
                    self._work_sharded(lock_conn, work)
            except psycopg.Error as e:
                log.warning("replica connection lost: %s", e.__class__.__name__)
            self.held, self.lock_pid = {}, None  # the session, and every lock with it, is gone
            self._set_leader(False)
            self._stop.wait(min(1.0, self.settings.detect.sweep_interval_s))

    def _balance(self, lock_conn: psycopg.Connection) -> None:
        self.lock_pid = lock_conn.info.backend_pid
        live = lock_conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database()",
            (REPLICA_APP,),
        ).fetchone()
        target = -(-self.shards // max(1, live[0] if live else 1))
        while len(self.held) > target:
            k = max(self.held)
            lock_conn.execute("SELECT pg_advisory_unlock(%s)", (SHARD_LOCK_BASE + k,))
            del self.held[k]
            log.info("released sweep shard %d (%d replicas)", k, live[0] if live else 1)
        if len(self.held) < target:
            # start the search at a place of this session's own, so replicas do not all race for shard 0
            pid = lock_conn.info.backend_pid
            for j in range(self.shards):
                k = (pid + j) % self.shards
                if k in self.held:
                    continue
                got = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (SHARD_LOCK_BASE + k,)).fetchone()
                if got and got[0]:
                    assert self.shard_sweep is not None
                    self.held[k] = self.shard_sweep(k)
                    log.info("took sweep shard %d", k)
                    if len(self.held) >= target:
                        break
        if not self.is_leader:
            got = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
            if got and got[0]:
                self._set_leader(True)

    def _work_sharded(self, lock_conn: psycopg.Connection, work: psycopg.Connection) -> None:
        plain = backend_of(work) != "timescaledb"
        next_balance = time.monotonic()
        next_sweep: dict[int, float] = {}
        next_fleet = time.monotonic()
        next_retention = time.monotonic() + 60.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_balance:
                self._balance(lock_conn)
                next_balance = now + self.balance_interval_s
            res = (
                rollup.run_once(
                    work, self.settings.accounting.max_gap_s, plain, shards=(self.shards, sorted(self.held))
                )
                if self.held
                else None
            )
            if self.is_leader:
                backlog = work.execute("SELECT count(*) FROM rollup_queue").fetchone()
                self.metrics.rollup_lag.set(backlog[0] if backlog else 0)
                if now >= next_fleet:
                    next_fleet = now + self.settings.detect.sweep_interval_s
                    self._infer(work)
                    self._price_ahead(work)
                if now >= next_retention:
                    next_retention = now + 3600.0
                    enforce_retention(work, self.settings, plain)
            for k, fn in list(self.held.items()):
                if self._stop.is_set() or k not in self.held:
                    break
                if now < next_sweep.get(k, 0.0):
                    continue
                next_sweep[k] = now + self.settings.detect.sweep_interval_s
                t0 = time.perf_counter()
                try:
                    fn(work, time.time())
                    self.last_sweep_error = None
                except psycopg.OperationalError:
                    raise
                except Exception as e:  # a detector bug must not stop rollups or the other shards
                    self.last_sweep_error = f"shard {k}: {e.__class__.__name__}: {e}"
                    log.exception("detector sweep of shard %d failed", k)
                self.sweeps += 1
                self.shard_sweeps[k] = self.shard_sweeps.get(k, 0) + 1
                self._observe(fn, time.perf_counter() - t0)
            for k in [k for k in next_sweep if k not in self.held]:
                del next_sweep[k]
            if res is None or res.ranges == 0:
                self._stop.wait(self.rollup_interval_s)

    def _observe(self, fn: SweepFn, seconds: float) -> None:
        """A sweep's duration, and its stages' when the sweep reports them (a Sweeper does)."""
        self.metrics.sweep_seconds.observe(seconds)
        stages: dict[str, float] = getattr(fn, "stages", {})
        for stage, s in stages.items():
            self.metrics.sweep_stage_seconds.labels(stage).observe(s)

    def _price_ahead(self, work: psycopg.Connection) -> None:
        """Price what settled since the last pass; a failure is logged and never stops the leader's work."""
        try:
            self.ahead.run(work, datetime.now(UTC))
        except psycopg.OperationalError:
            raise
        except Exception:  # a bug here must not stop rollups or sweeps
            log.exception("pricing settled incidents and runs failed")

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
        self.metrics.inferred_refused.inc(res.refused)


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
                    conn = psycopg.connect(
                        self.url, autocommit=True, connect_timeout=2, application_name="gpufleet-monitor"
                    )
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
