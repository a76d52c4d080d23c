"""The agent loop: tick, collect, merge, attribute, spool; seal and ship in the background.

Each tick (``interval_s``, started after a random share of ``start_jitter_s``
so a fleet does not tick in lockstep):

1. the scheduler starts the sources that are due and gathers what finished
   (:mod:`gpufleet.agent.scheduler`: per-source threads, intervals, timeouts);
2. their readings are merged into one row per ``(gpu, mig_instance)`` and one
   host row (:mod:`gpufleet.agent.merge`), labelled with ``run_id``
   (:mod:`gpufleet.agent.attribution`, Kubernetes included), given the figures of the job's own
   cgroup (:mod:`gpufleet.agent.jobstats`) and made acceptable to the
   collector (:mod:`gpufleet.agent.sanitize`);
3. the tick record -- stamped with the tick's wall-clock ``time`` -- is appended
   to the spool (:mod:`gpufleet.agent.spool`), with the node facts when they
   changed (the node checks of :mod:`gpufleet.agent.diagnose` among them, run
   at each facts refresh);
4. every ``ship_interval_s`` the open segment is sealed into an immutable
   batch, which the shipper thread (:mod:`gpufleet.agent.shipper`) delivers.

Nothing a source does can stop the loop: errors, hangs and malformed rows are
counted per source and logged at a limited rate.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.agent.attribution import Attributor
from gpufleet.agent.batch import encode_batch, tick_record, to_batch
from gpufleet.agent.diagnose.agentfacts import NodeChecks
from gpufleet.agent.jobstats import JobCgroups
from gpufleet.agent.k8s.attribution import KubernetesAttribution, runs_facts
from gpufleet.agent.merge import merge_readings, valid_key
from gpufleet.agent.metrics import AgentMetrics
from gpufleet.agent.ratelog import RateLimitedLog
from gpufleet.agent.sanitize import Sanitizer
from gpufleet.agent.scheduler import FIRST_READ_TIMEOUT_S, Scheduler
from gpufleet.agent.shipper import Shipper, tls_context
from gpufleet.agent.sources.base import Closeable, Source
from gpufleet.agent.sources.facts import node_facts
from gpufleet.agent.sources.nvml_power_cap import follower_from_settings
from gpufleet.agent.spool import Spool
from gpufleet.config import AgentSettings
from gpufleet.metricsauth import MetricsGuard, read_token

log = logging.getLogger(__name__)


@dataclass
class TickStats:
    """What one tick wrote."""

    gpu_rows: int = 0
    host_rows: int = 0
    facts: bool = False
    sealed: bool = False


class Agent:
    """One node's agent.  :meth:`start`, then :meth:`run` until a stop event, then :meth:`shutdown`.

    Tests drive it step by step instead: :meth:`start` with ``ship=False``,
    :meth:`tick`, :meth:`seal`, and the shipper's ``ship_one``.
    """

    def __init__(
        self,
        settings: AgentSettings,
        sources: list[Source],
        *,
        node: str,
        spool_dir: Path,
        metrics: AgentMetrics | None = None,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        facts_of_node: Callable[[], dict[str, Any]] | None = None,
        kubernetes: KubernetesAttribution | None = None,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.node = node
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.rng = rng or random.Random()
        self._wall = wall
        self._mono = mono
        self._facts_of_node = facts_of_node or (lambda: node_facts(settings.sys_root))
        self.scheduler = Scheduler.build(
            sources,
            interval_s=settings.interval_s,
            schedules=settings.source_schedules,
            default_timeout_s=settings.collect_timeout_s,
            metrics=self.metrics,
            want_processes=settings.attribute_processes or settings.job_cgroups,
            rng=self.rng,
            mono=mono,
        )
        self.kubernetes = kubernetes
        self.attributor = Attributor(
            settings.job_files_dir, settings.proc_root, settings.attribute_processes, kubernetes=kubernetes
        )
        self.job_cgroups = (
            JobCgroups(settings.proc_root, settings.sys_root, mono) if settings.job_cgroups else None
        )
        self.node_checks = NodeChecks.from_settings(settings, clock=mono) if settings.node_checks else None
        self.power_caps = follower_from_settings(settings, self.node)
        self.sanitizer = Sanitizer()
        self.spool = Spool(
            spool_dir,
            self._encode,
            max_bytes=settings.spool_max_bytes,
            segment_max_samples=settings.segment_max_samples,
            fsync=settings.spool_fsync,
            dead_max_bytes=settings.dead_letter_max_bytes,
            metrics=self.metrics,
            mono=mono,
        )
        self.shipper: Shipper | None = None
        self.metrics_port = 0
        self._ratelog = RateLimitedLog(log)
        self._tick_no = 0
        self._facts_sent: dict[str, Any] | None = None
        self._node_facts: dict[str, Any] = {}
        self._facts_next = 0.0
        self._facts_wait_until = 0.0
        self._source_facts: dict[str, Any] = {}
        self._checks_due = False
        self._check_facts: dict[str, Any] = {}

    def _encode(self, records: list[dict[str, Any]], batch_id: str) -> bytes:
        agent = {"id": self.spool.agent_id, "version": __version__}
        return encode_batch(to_batch(records, batch_id, self.node, agent))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, ship: bool = True, serve_metrics: bool = True) -> Agent:
        """Recover the spool, start the source threads, the shipper and /metrics."""
        self.spool.open()
        s = self.settings
        if s.keepalive_s <= s.ship_interval_s:
            log.warning(
                "agent: keepalive_s (%g s) is not longer than ship_interval_s (%g s): every shipment "
                "opens a new connection to the collector",
                s.keepalive_s,
                s.ship_interval_s,
            )
        self.shipper = Shipper(
            self.spool,
            s.collector_url,
            s.token,
            timeout_s=s.request_timeout_s,
            keepalive_s=s.keepalive_s,
            retry_base_s=s.retry_base_s,
            retry_max_s=s.retry_max_s,
            verify=tls_context(s.ca_file, s.client_cert, s.client_key),
            metrics=self.metrics,
            rng=self.rng,
            wall=self._wall,
            mono=self._mono,
        )
        self.scheduler.start()
        if self.kubernetes is not None:
            self.kubernetes.start()
        self._facts_wait_until = self._mono() + FIRST_READ_TIMEOUT_S
        if self.power_caps is not None:
            self.power_caps.start()
        if self.node_checks is not None:
            try:
                self.node_checks.prime()
            except OSError as e:
                log.warning("agent: node checks: first reading failed: %s", e)
        if ship:
            self.shipper.start()
        if serve_metrics:
            guard = MetricsGuard(read_token(s.metrics_token, s.metrics_token_file, "agent.metrics_token"))
            self.metrics_port = self.metrics.serve(
                s.metrics_port,
                s.metrics_host,
                guard,
                s.metrics_certfile,
                s.metrics_keyfile,
                s.metrics_client_ca,
            )
        log.info(
            "agent %s for node %s: %d sources (%s), spool %s, collector %s",
            self.spool.agent_id,
            self.node,
            len(self.sources),
            ", ".join(src.name for src in self.sources),
            self.spool.dir,
            s.collector_url,
        )
        return self

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set; a late loop skips ticks rather than bunching them."""
        interval = self.settings.interval_s
        jitter = self.settings.start_jitter_s if self.settings.start_jitter_s is not None else interval
        if stop.wait(self.rng.uniform(0, jitter)):
            return
        t0 = self._mono()
        n = 0
        while not stop.is_set():
            self.tick(n)
            n += 1
            now = self._mono()
            behind = now - (t0 + n * interval)
            if behind > interval:
                skipped = int(behind // interval)
                self._ratelog.log(
                    logging.WARNING,
                    "late",
                    "agent: tick loop %.1f s late; skipping %d ticks",
                    behind,
                    skipped,
                )
                n += skipped
            stop.wait(max(0.0, t0 + n * interval - self._mono()))

    def shutdown(self, ship_s: float | None = None) -> bool:
        """Stop the sources, seal, ship for at most ``ship_s`` (default: settings), close.

        Returns True when everything spooled was delivered.  What was not stays
        sealed in the spool for the next start.
        """
        stuck = self.scheduler.stop(timeout_s=1.0)
        if self.power_caps is not None:
            self.power_caps.stop()  # caps stay on the GPUs: the run goes on without the agent
        if self.kubernetes is not None:
            self.kubernetes.stop()
        if stuck:
            log.warning("agent: sources still inside a read at shutdown: %s", ", ".join(stuck))
        self.spool.seal()
        delivered = False
        if self.shipper is not None:
            delivered = self.shipper.drain(self.settings.shutdown_ship_s if ship_s is None else ship_s)
            self.shipper.close()
        for src in self.sources:
            if isinstance(src, Closeable) and src.name not in stuck:
                try:
                    src.close()
                except Exception as e:
                    log.warning("agent: closing source %s failed: %s", src.name, e, exc_info=True)
        self.spool.close()
        self.metrics.close()
        left = self.spool.pending_samples
        log.info("agent stopped: %s", "spool empty" if delivered else f"{left} samples left in the spool")
        return delivered

    # -- one tick ----------------------------------------------------------------------------

    def tick(self, n: int | None = None) -> TickStats:
        """Collect, merge, attribute and spool one tick; seal when the segment is old enough."""
        if n is None:
            n = self._tick_no
        self._tick_no = n + 1
        t = self._wall()
        self._refresh_facts()
        result = self.scheduler.tick(n)
        readings = []
        for o in result.outcomes:
            if o.reading is None:
                continue
            bad = sum(1 for r in o.reading.gpus if not valid_key(r))
            if bad:
                self.metrics.source_errors.labels(o.source, "malformed").inc()
                self._ratelog.log(
                    logging.WARNING,
                    f"{o.source}:malformed",
                    "source %s returned %d GPU rows without an integer 'gpu'; left out",
                    o.source,
                    bad,
                )
            readings.append(o.reading)
        gpus, host = merge_readings(readings)
        self.attributor.label(gpus, result.processes, self._source_facts)
        if self.job_cgroups is not None:
            try:
                self.job_cgroups.label(gpus, result.processes)
            except (OSError, ValueError) as e:
                self._ratelog.log(logging.WARNING, "job-cgroups", "agent: job cgroup figures left out: %s", e)
        for row in gpus:
            self.sanitizer.gpu(row)
        if host is not None:
            self.sanitizer.host(host)
        facts = self._facts_update(gpus, result.processes)
        stats = TickStats(len(gpus), 1 if host is not None else 0, facts is not None)
        # Seal before appending, with half a tick of slack, so a segment holds
        # ship_interval_s / interval_s ticks whatever the timing jitter.
        if self.spool.open_age_s() >= self.settings.ship_interval_s - 0.5 * self.settings.interval_s:
            stats.sealed = self.seal()
        if gpus or host is not None or facts is not None:
            self.spool.append(tick_record(t, gpus, host, facts))
        return stats

    def seal(self) -> bool:
        return self.spool.seal() is not None

    def _refresh_facts(self) -> None:
        """Every ``facts_interval_s``: re-read the node's facts and have the sources read theirs."""
        now = self._mono()
        if now < self._facts_next:
            return
        self._facts_next = now + self.settings.facts_interval_s
        self.scheduler.request_facts()
        self._checks_due = self.node_checks is not None
        try:
            self._node_facts = self._facts_of_node()
        except OSError as e:
            self._ratelog.log(logging.WARNING, "node-facts", "agent: cannot read node facts: %s", e)

    def _facts_update(
        self, gpus: list[dict[str, Any]], processes: dict[int, list[int]]
    ) -> dict[str, Any] | None:
        """The node facts when they are new or changed (or were lost with a dropped batch), else None."""
        ready, from_sources = self.scheduler.facts()
        self._source_facts = from_sources
        if not ready and self._mono() < self._facts_wait_until:
            return None
        if self._checks_due and self.node_checks is not None:
            self._checks_due = False
            try:
                self._check_facts = self.node_checks.facts(gpus, from_sources, processes)
            except (OSError, ValueError) as e:
                self._ratelog.log(logging.WARNING, "node-checks", "agent: node checks failed: %s", e)
        facts = {**self._node_facts, **from_sources, **self._check_facts}
        if self.power_caps is not None:
            facts.update(self.power_caps.facts())
        if self.attributor.runs:
            facts["runs"] = runs_facts(self.attributor.runs)
        if facts == self._facts_sent and not self.spool.facts_lost.is_set():
            return None
        self.spool.facts_lost.clear()
        self._facts_sent = facts
        return facts
