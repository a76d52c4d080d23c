"""Runs every source on its own thread, interval and timeout, so one bad source never stalls the others.

The agent ticks at its base interval.  On each tick the sources that are due
are started on their own worker threads and the tick waits for them, but only
until each one's deadline and never longer than the tick's gather budget.
What finishes in time joins this tick; what finishes later but within its
timeout joins the next tick; what finishes after its timeout is discarded and
counted.  A source still busy when it is due again is skipped for that tick
(counted), never started a second time: a slow NVML call cannot pile up
threads.  Errors are counted per source and logged at a limited rate.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.metrics import AgentMetrics
from gpufleet.agent.ratelog import RateLimitedLog
from gpufleet.agent.sources.base import FactsSource, Reading, Source, SourceError

log = logging.getLogger(__name__)

#: The first read of a source opens its library or device (nvmlInit on 8 GPUs
#: takes seconds); it gets this long before it counts as a timeout, seconds.
FIRST_READ_TIMEOUT_S = 30.0

ProcessMap = dict[int, list[int]]


@dataclass
class Outcome:
    """What one read of a source produced."""

    source: str
    reading: Reading | None = None
    #: PIDs per GPU index, from sources with a ``processes()`` ability.
    processes: ProcessMap | None = None
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class SourceStats:
    """Per-source counts, readable without Prometheus (tests, logs)."""

    reads: int = 0
    errors: int = 0
    timeouts: int = 0
    skipped: int = 0
    samples: int = 0


@dataclass
class _Job:
    seq: int
    deadline: float
    collect: bool
    facts: bool
    started: float | None = None
    timed_out: bool = False
    #: The facts this job carries have been read (answered or failed).
    facts_read: bool = False


class SourceWorker:
    """One source on one daemon thread, fed one job at a time."""

    def __init__(
        self,
        source: Source,
        *,
        every_ticks: int,
        phase: int,
        timeout_s: float,
        metrics: AgentMetrics,
        want_processes: bool = False,
        mono: Callable[[], float] = time.monotonic,
        ratelog: RateLimitedLog | None = None,
    ) -> None:
        self.source = source
        self.name = source.name
        self.every_ticks = every_ticks
        self.phase = phase
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.want_processes = want_processes and callable(getattr(source, "processes", None))
        self.has_facts = isinstance(source, FactsSource)
        self.stats = SourceStats()
        self._mono = mono
        self._ratelog = ratelog or RateLimitedLog(log)
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._running: _Job | None = None
        self._done: list[tuple[_Job, Outcome]] = []
        self._facts: dict[str, Any] | None = None
        self._facts_answered = False
        self._facts_wanted = False
        self._seq = 0
        self._first = True
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"source-{self.name}", daemon=True)

    # -- control (agent thread) --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def due(self, tick: int) -> bool:
        return tick % self.every_ticks == self.phase

    def request_facts(self) -> None:
        """Read the facts with the next job this worker runs (they share the source's thread)."""
        if self.has_facts:
            with self._cond:
                self._facts_wanted = True

    def submit(self, *, collect: bool = True) -> _Job | None:
        """Start a read now (plus facts when requested); None while the previous job still runs
        (a skipped read is counted when ``collect``)."""
        with self._cond:
            if self._pending is not None or self._running is not None:
                if collect:
                    self.stats.skipped += 1
                    self.metrics.source_errors.labels(self.name, "skipped").inc()
                return None
            if not collect and not self._facts_wanted:
                return None
            self._seq += 1
            timeout = self.timeout_s
            if collect and self._first:
                timeout = max(timeout, FIRST_READ_TIMEOUT_S)
                self._first = False
            job = _Job(self._seq, self._mono() + timeout, collect, self._facts_wanted)
            self._facts_wanted = False
            self._pending = job
            self._cond.notify_all()
            return job

    def wait(self, job: _Job, until: float) -> None:
        """Block until ``job`` finished, its facts included, or ``min(until, its deadline)`` passed.

        The facts are read after the collection, on the same thread: a tick that only waited for the
        reading would see the facts a tick late, or (on a busy host) not before the first-read grace ran
        out, so the first batch would go without them.
        """
        end = min(until, job.deadline)
        with self._cond:
            while not self._finished(job):
                left = end - self._mono()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _finished(self, job: _Job) -> bool:
        """Under ``_cond``: ``job``'s reading is published (or it had none) and its facts are read."""
        if job.facts and not job.facts_read:
            return False
        return any(j is job for j, _ in self._done) or not (self._pending is job or self._running is job)

    def harvest(self) -> list[Outcome]:
        """Outcomes finished in time since the last harvest; counts a timeout once for an overdue read."""
        now = self._mono()
        with self._cond:
            done, self._done = self._done, []
            running = self._running or self._pending
            if running is not None and running.collect and not running.timed_out and now > running.deadline:
                running.timed_out = True
                self._count_timeout(running, now)
        return [o for job, o in done if not job.timed_out]

    def take_facts(self) -> tuple[bool, dict[str, Any] | None]:
        """(answered at least once, the latest facts or None)."""
        with self._cond:
            return self._facts_answered, self._facts

    def busy(self) -> bool:
        with self._cond:
            return self._pending is not None or self._running is not None

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._pending
                assert job is not None
                self._pending, self._running = None, job
                job.started = self._mono()
            if job.collect:
                self._finish(job, self._read(job))
            if job.facts:
                self._read_facts(job)
            if not job.collect:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()

    def _finish(self, job: _Job, outcome: Outcome) -> None:
        """Publish a read's outcome; a read past its deadline is counted and discarded."""
        finished = self._mono()
        with self._cond:
            self._running = None
            late = job.timed_out or finished > job.deadline
            if late and not job.timed_out:
                job.timed_out = True
                self._count_timeout(job, finished)
            if late:
                self._ratelog.log(
                    logging.INFO,
                    f"{self.name}:late",
                    "source %s: a read finished after %.2f s and was discarded",
                    self.name,
                    outcome.duration_s,
                )
            self._done.append((job, outcome))
            self._cond.notify_all()

    def _read(self, job: _Job) -> Outcome:
        t0 = time.perf_counter()
        out = Outcome(self.name)
        try:
            out.reading = self.source.collect()
            if self.want_processes:
                out.processes = self.source.processes()  # type: ignore[attr-defined]
        except SourceError as e:
            out.error = str(e)
        except Exception as e:
            # A plug-in bug must cost this source's reading, not the agent.
            log.error("source %s raised %s", self.name, type(e).__name__, exc_info=True)
            out.error = f"{type(e).__name__}: {e}"
        out.duration_s = time.perf_counter() - t0
        self._account(job, out)
        return out

    def _account(self, job: _Job, out: Outcome) -> None:
        self.stats.reads += 1
        self.metrics.source_seconds.labels(self.name).set(out.duration_s)
        if out.error is not None:
            self.stats.errors += 1
            self.metrics.source_errors.labels(self.name, "error").inc()
            self._ratelog.log(
                logging.WARNING, f"{self.name}:error", "source %s failed: %s", self.name, out.error
            )
        elif out.reading is not None:
            n = len(out.reading.gpus) + (1 if out.reading.host is not None else 0)
            self.stats.samples += n
            self.metrics.samples_collected.labels(self.name).inc(n)

    def _count_timeout(self, job: _Job, now: float) -> None:
        self.stats.timeouts += 1
        self.metrics.source_errors.labels(self.name, "timeout").inc()
        self._ratelog.log(
            logging.WARNING,
            f"{self.name}:timeout",
            "source %s: read #%d still running after %.2f s (timeout); its result will be discarded",
            self.name,
            job.seq,
            now - (job.started if job.started is not None else now),
        )

    def _read_facts(self, job: _Job) -> None:
        facts: dict[str, Any] | None = None
        try:
            facts = self.source.facts()  # type: ignore[attr-defined]
        except SourceError as e:
            self._ratelog.log(
                logging.WARNING, f"{self.name}:facts", "source %s: facts unavailable: %s", self.name, e
            )
        except Exception as e:
            log.error("source %s: facts() raised %s", self.name, type(e).__name__, exc_info=True)
        with self._cond:
            self._facts_answered = True
            job.facts_read = True
            if facts is not None:
                self._facts = facts
            self._cond.notify_all()


@dataclass
class TickResult:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def readings(self) -> list[Reading]:
        return [o.reading for o in self.outcomes if o.reading is not None]

    @property
    def processes(self) -> ProcessMap:
        merged: ProcessMap = {}
        for o in self.outcomes:
            for gpu, pids in (o.processes or {}).items():
                merged.setdefault(gpu, []).extend(pids)
        return merged


class Scheduler:
    """Starts due sources each tick and gathers what finished, in source order."""

    def __init__(
        self, workers: list[SourceWorker], gather_s: float, mono: Callable[[], float] = time.monotonic
    ) -> None:
        self.workers = workers
        self.gather_s = gather_s
        self._mono = mono

    @classmethod
    def build(
        cls,
        sources: list[Source],
        *,
        interval_s: float,
        schedules: dict[str, Any],
        default_timeout_s: float | None,
        metrics: AgentMetrics,
        want_processes: bool,
        rng: random.Random,
        mono: Callable[[], float] = time.monotonic,
    ) -> Scheduler:
        """Workers for ``sources``; a source's interval is rounded to whole ticks, its phase drawn at random."""
        workers = []
        ratelog = RateLimitedLog(log)
        for src in sources:
            sched = schedules.get(src.name)
            own_interval = getattr(sched, "interval_s", None) or interval_s
            every = max(1, round(own_interval / interval_s))
            timeout = getattr(sched, "timeout_s", None) or default_timeout_s or 0.5 * every * interval_s
            workers.append(
                SourceWorker(
                    src,
                    every_ticks=every,
                    phase=rng.randrange(every),
                    timeout_s=timeout,
                    metrics=metrics,
                    want_processes=want_processes,
                    mono=mono,
                    ratelog=ratelog,
                )
            )
        return cls(workers, gather_s=0.5 * interval_s, mono=mono)

    def start(self) -> None:
        for w in self.workers:
            w.start()

    def request_facts(self) -> None:
        """Have every facts-capable source read its facts with its next job."""
        for w in self.workers:
            w.request_facts()

    def tick(self, tick: int) -> TickResult:
        """Start the sources due on ``tick`` (and pending facts reads) and gather what finishes."""
        started = self._mono()
        jobs = []
        for w in self.workers:
            job = w.submit(collect=w.due(tick))
            if job is not None:
                jobs.append((w, job))
        until = started + self.gather_s
        for w, job in jobs:
            w.wait(job, until)
        result = TickResult()
        for w in self.workers:
            result.outcomes.extend(w.harvest())
        return result

    def facts(self) -> tuple[bool, dict[str, Any]]:
        """(every facts source answered at least once, their facts merged in source order)."""
        ready = True
        merged: dict[str, Any] = {}
        for w in self.workers:
            if not w.has_facts:
                continue
            answered, facts = w.take_facts()
            ready = ready and answered
            if facts:
                merged.update(facts)
        return ready, merged

    def stop(self, timeout_s: float = 2.0) -> list[str]:
        """Stop the workers; returns the names of those still stuck in a read (left as daemon threads)."""
        for w in self.workers:
            w.stop()
        deadline = self._mono() + timeout_s
        stuck = []
        for w in self.workers:
            if not w.join(max(0.0, deadline - self._mono())):
                stuck.append(w.name)
        return stuck
