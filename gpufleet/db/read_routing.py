"""Reads off the primary: a streaming-replication hot standby serves what may be a few seconds old.

The API's reads, the web view's pages and Grafana's panels can be a second or
two behind the primary without anyone noticing; every write, every token check
(a revocation must bite at once) and the detector sweep's fresh window cannot.
:class:`ReadRouter` sends a read to the standby while the standby's view is no
older than the read allows, and to the primary otherwise: when the standby lags
past ``database.max_read_lag_s``, when it cannot be reached, when it stopped
being a standby (promoted, so no longer following this primary), or when the
caller asks for fresher data than it has.

How old the standby's view is, is measured by WAL position (:class:`LagProbe`),
not by the replay timestamp PostgreSQL reports: ``pg_last_xact_replay_timestamp``
is the commit time of the last transaction replayed, which grows without bound
while the primary is idle and the standby perfectly current.  Every check reads
the primary's WAL insert position and then the standby's replay position; the
standby holds everything the primary had committed at the newest check whose
position it has replayed, so its view is as old as that check.  The checks run
on connections of their own, never on the pools' (a busy pool must not stall
them, nor they a request), every ``database.lag_check_s`` on a thread of their
own (:class:`StandbyLag`), and the processes export the result as
``gpufleet_db_standby_lag_seconds`` (:class:`StandbyLagMetrics`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg_pool import ConnectionPool, PoolTimeout

from gpufleet.config import Settings

log = logging.getLogger(__name__)

Target = Literal["standby", "primary"]

#: The primary's WAL positions kept to date the standby's view, each with the time it was read
#: (an hour of checks at the default second: a standby further behind is dated by the oldest).
HISTORY = 3600


def lsn(text: str) -> int:
    """A ``pg_lsn`` (``16/B374D848``) as a byte position."""
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


class StandbyUnavailable(Exception):
    """The standby cannot serve reads now; the message says why."""


@dataclass(frozen=True)
class Reading:
    """One check of the standby: how old its view was (seconds; None when it cannot serve reads) and why not."""

    lag_s: float | None
    at: float  # the clock's seconds when measured
    reason: str | None = None


class LagProbe:
    """Measures how far behind the primary the standby's view is, by WAL position (module docstring)."""

    def __init__(
        self,
        primary_url: str,
        standby_url: str,
        *,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.urls: dict[Target, str] = {"primary": primary_url, "standby": standby_url}
        self.timeout_s = timeout_s
        self.clock = clock
        self._conns: dict[Target, psycopg.Connection] = {}
        #: (clock seconds, primary WAL insert position), oldest first.
        self.marks: deque[tuple[float, int]] = deque(maxlen=HISTORY)

    def _query(self, which: Target, query: str) -> tuple[object, ...]:
        conn = self._conns.get(which)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(
                    self.urls[which],
                    autocommit=True,
                    connect_timeout=max(1, round(self.timeout_s)),
                    application_name="gpufleet-standby-lag",
                )
                conn.execute(f"SET statement_timeout = {max(1, round(self.timeout_s * 1000))}")
                self._conns[which] = conn
            row = conn.execute(query).fetchone()
        except psycopg.Error:
            self._close(which)
            raise
        assert row is not None
        return tuple(row)

    def measure(self) -> float:
        """Seconds the standby's view is behind the primary's present; raises :class:`StandbyUnavailable`."""
        try:
            (pos,) = self._query("primary", "SELECT pg_current_wal_lsn()::text")
        except psycopg.Error as e:
            # Without the primary's position the standby cannot be dated: reads go to the primary,
            # whose own failure the read then meets and reports.
            raise StandbyUnavailable(
                f"the primary's WAL position could not be read ({type(e).__name__})"
            ) from e
        self.marks.append((self.clock(), lsn(str(pos))))
        try:
            recovering, replayed = self._query(
                "standby", "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"
            )
        except psycopg.Error as e:
            raise StandbyUnavailable(f"the standby does not answer ({type(e).__name__})") from e
        if not recovering or replayed is None:
            # Promoted (or never a standby): it no longer follows this primary, so its data can be any age.
            raise StandbyUnavailable("the standby is not in recovery: it does not follow the primary")
        done = lsn(str(replayed))
        now = self.clock()
        reached = [t for t, p in self.marks if p <= done]
        if reached:
            return max(0.0, now - reached[-1])
        return now - self.marks[0][0]  # behind every position kept: at least as old as the oldest

    def _close(self, which: Target) -> None:
        conn = self._conns.pop(which, None)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        self._close("primary")
        self._close("standby")


class StandbyLag:
    """The standby's lag, kept current: measured every ``check_s`` on a thread once started, else on
    demand by the first caller that finds the last reading older than ``check_s``."""

    def __init__(self, probe: LagProbe, check_s: float = 1.0) -> None:
        self.probe = probe
        self.check_s = check_s
        self.clock = probe.clock
        self.reading = Reading(None, -1e18, "not measured yet")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Reading:
        """Measure now (one measurement at a time)."""
        with self._lock:
            try:
                self.reading = Reading(self.probe.measure(), self.clock())
            except StandbyUnavailable as e:
                if self.reading.reason != str(e):
                    log.warning("reads stay on the primary: %s", e)
                self.reading = Reading(None, self.clock(), str(e))
        return self.reading

    def mark_unavailable(self, reason: str) -> None:
        """A read found the standby gone: no read goes there until a check finds it back."""
        self.reading = Reading(None, self.clock(), reason)

    def seconds(self) -> float | None:
        """How old the standby's view is now, as far as known (None: it cannot serve reads)."""
        r = self.reading
        if self._thread is None and self.clock() - r.at >= self.check_s:
            r = self.check()
        if r.lag_s is None:
            return None
        # Between checks the standby may fall behind by as much as the time since the last one.
        return r.lag_s + max(0.0, self.clock() - r.at)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self.check()
                self._stop.wait(self.check_s)

        self._thread = threading.Thread(target=loop, name="gpufleet-standby-lag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.probe.close()


class ReadRouter:
    """Chooses, per read, the standby or the primary.  Without a standby every read goes to the primary."""

    def __init__(
        self,
        primary: ConnectionPool,
        standby: ConnectionPool | None = None,
        lag: StandbyLag | None = None,
        *,
        max_lag_s: float = 10.0,
    ) -> None:
        if (standby is None) != (lag is None):
            raise ValueError("a standby pool and its StandbyLag go together")
        self.primary = primary
        self.standby = standby
        self.lag = lag
        self.max_lag_s = max_lag_s
        self.reads: dict[Target, int] = {"standby": 0, "primary": 0}
        #: Reads sent to the primary although a standby is configured, by reason: ``lag`` (further
        #: behind than the read allows), ``unavailable`` (down, promoted, or its pool failed),
        #: ``fresh`` (the caller wanted the primary's present).
        self.fallbacks: dict[str, int] = {}

    def choose(self, max_lag_s: float | None = None) -> tuple[Target, str | None]:
        """Where a read that may be ``max_lag_s`` old (default ``self.max_lag_s``) goes, and why not the standby."""
        if self.standby is None or self.lag is None:
            return "primary", None
        bound = self.max_lag_s if max_lag_s is None else max_lag_s
        if bound <= 0:
            return "primary", "fresh"
        lag = self.lag.seconds()
        if lag is None:
            return "primary", "unavailable"
        return ("standby", None) if lag <= bound else ("primary", "lag")

    @contextlib.contextmanager
    def connection(
        self, max_lag_s: float | None = None, timeout: float | None = None
    ) -> Iterator[psycopg.Connection]:
        """A connection for a read: the standby's while its view is fresh enough, else the primary's.

        A standby whose pool cannot hand out a connection (it went away since the last check)
        sends this read to the primary and stays out of use until a check finds it back."""
        target, reason = self.choose(max_lag_s)
        with contextlib.ExitStack() as stack:
            conn: psycopg.Connection | None = None
            if target == "standby":
                assert self.standby is not None and self.lag is not None
                try:
                    conn = stack.enter_context(self.standby.connection(timeout=timeout))
                except (psycopg.OperationalError, PoolTimeout) as e:
                    log.warning("the standby's pool failed (%s); reads go to the primary", type(e).__name__)
                    self.lag.mark_unavailable(f"the standby's pool failed ({type(e).__name__})")
                    reason = "unavailable"
                else:
                    self.reads["standby"] += 1
            if conn is None:
                self.reads["primary"] += 1
                if reason is not None:
                    self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
                conn = stack.enter_context(self.primary.connection(timeout=timeout))
            yield conn


class RoutedPool:
    """The pool readers hold: :meth:`connection` gives the router's choice for a read, :meth:`open` and
    :meth:`close` manage both pools and the lag checks.  Writers use :attr:`primary`."""

    def __init__(self, router: ReadRouter) -> None:
        self.router = router
        self.primary = router.primary

    def connection(
        self, timeout: float | None = None, max_lag_s: float | None = None
    ) -> contextlib.AbstractContextManager[psycopg.Connection]:
        return self.router.connection(max_lag_s=max_lag_s, timeout=timeout)

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        self.router.primary.open(wait=wait, timeout=timeout)
        if self.router.standby is not None and self.router.lag is not None:
            self.router.standby.open(wait=False)
            self.router.lag.start()

    def close(self) -> None:
        if self.router.standby is not None and self.router.lag is not None:
            self.router.lag.stop()
            self.router.standby.close()
        self.router.primary.close()


class StandbyLagMetrics:
    """``gpufleet_db_standby_lag_seconds`` (absent while the standby cannot serve reads),
    ``gpufleet_db_standby_up`` and the routed reads, for a process's ``/metrics``."""

    def __init__(self, lag: StandbyLag, router: ReadRouter | None = None) -> None:
        self.lag = lag
        self.router = router

    def collect(self) -> Iterable[Metric]:
        r = self.lag.reading
        up = GaugeMetricFamily(
            "gpufleet_db_standby_up",
            "1 while the standby of database.read_url follows the primary and answers",
        )
        up.add_metric([], 0.0 if r.lag_s is None else 1.0)
        yield up
        if r.lag_s is not None:
            g = GaugeMetricFamily(
                "gpufleet_db_standby_lag_seconds",
                "How old the standby's view of the data is: seconds since the primary had "
                "written everything it has replayed, as of the last check",
            )
            g.add_metric([], r.lag_s)
            yield g
        if self.router is not None:
            c = CounterMetricFamily(
                "gpufleet_db_reads",
                "Reads routed, by where they went and why not the standby",
                labels=["target", "reason"],
            )
            c.add_metric(["standby", ""], self.router.reads["standby"])
            fell = sum(self.router.fallbacks.values())
            c.add_metric(["primary", ""], self.router.reads["primary"] - fell)
            for reason, n in sorted(self.router.fallbacks.items()):
                c.add_metric(["primary", reason], n)
            yield c


class HistoryReads:
    """Where the detector sweep's history read (a cold load of its whole window) goes: the standby
    while its view is at most ``max_lag_s`` old, checked just before the read, else the primary.
    Used on the leader's thread only; the standby connection is its own, opened when first needed."""

    def __init__(self, primary_url: str, standby_url: str, max_lag_s: float) -> None:
        self.standby_url = standby_url
        self.lag = StandbyLag(LagProbe(primary_url, standby_url), check_s=0.0)
        self.max_lag_s = max_lag_s
        self._conn: psycopg.Connection | None = None
        #: Cold loads read from the standby, and sent to the primary instead (with the last reason).
        self.reads: dict[Target, int] = {"standby": 0, "primary": 0}
        self.last_reason: str | None = None

    @classmethod
    def of(cls, settings: Settings, max_lag_s: float) -> HistoryReads | None:
        """From ``database.read_url`` (None: no standby), within the lag the settings and the caller allow."""
        db = settings.database
        if not db.read_url or not settings.database_url:
            return None
        return cls(settings.database_url, db.read_url, min(db.max_read_lag_s, max_lag_s))

    def connection(self) -> psycopg.Connection | None:
        """The standby's connection when its view is recent enough now, else None (read the primary)."""
        reading = self.lag.check()
        if reading.lag_s is None or reading.lag_s > self.max_lag_s:
            self.last_reason = reading.reason or f"the standby is {reading.lag_s:.1f} s behind"
            self.reads["primary"] += 1
            return None
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.standby_url,
                    autocommit=True,
                    connect_timeout=3,
                    application_name="gpufleet-sweep-history",
                )
        except psycopg.Error as e:
            self.failed(e)
            return None
        self.reads["standby"] += 1
        return self._conn

    def failed(self, e: BaseException) -> None:
        """The standby failed a read: this one goes to the primary, the connection is opened afresh next time."""
        log.warning("the sweep's history read goes to the primary: the standby failed (%s)", type(e).__name__)
        self.last_reason = f"the standby failed ({type(e).__name__})"
        self.reads["primary"] += 1
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None


def standby_lag(primary_url: str, settings: Settings) -> StandbyLag | None:
    """The lag measurement of ``database.read_url``'s standby (None when none is configured)."""
    db = settings.database
    if not db.read_url:
        return None
    return StandbyLag(LagProbe(primary_url, db.read_url), db.lag_check_s)


def read_router(
    primary_url: str,
    settings: Settings,
    primary: ConnectionPool,
    configure: Callable[[psycopg.Connection], None] | None,
    application_name: str,
) -> ReadRouter:
    """The router of a process whose primary pool is ``primary``: with a standby pool (the primary's size
    and connection setup, opened with it) when ``database.read_url`` is set."""
    db = settings.database
    lag = standby_lag(primary_url, settings)
    if lag is None or not db.read_url:
        return ReadRouter(primary, max_lag_s=db.max_read_lag_s)
    standby = ConnectionPool(
        db.read_url,
        min_size=1,
        max_size=primary.max_size,
        open=False,
        timeout=primary.timeout,
        kwargs={"autocommit": True, "application_name": f"{application_name}-reads"},
        configure=configure,
    )
    return ReadRouter(primary, standby, lag, max_lag_s=db.max_read_lag_s)
