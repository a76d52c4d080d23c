"""The live detector sweep: window cache -> detectors -> incidents -> alerts."""

from __future__ import annotations

import logging
import time

import psycopg

from gpufleet.collector import incident_store
from gpufleet.collector.alerting import AlertmanagerPusher
from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.quarantine import Quarantine
from gpufleet.collector.window_cache import WindowCache, load_facts, load_runs
from gpufleet.config import Settings
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)


class Sweeper:
    """Called by the leader every ``detect.sweep_interval_s`` with a connection and the time."""

    def __init__(self, settings: Settings, config: DetectorConfig | None = None) -> None:
        self.settings = settings
        # The deployment's thresholds (settings ``detect``), unless a caller overrides them.
        self.config = config if config is not None else settings.detect
        self.cache = WindowCache(settings.detect.window_s)
        url = settings.detect.alertmanager_url
        self.alerts = AlertmanagerPusher(url) if url else None
        self.quarantine = Quarantine(settings.quarantine) if settings.quarantine.enabled else None
        self.last: dict[str, float] = {}

    def __call__(self, conn: psycopg.Connection, now: float) -> None:
        t0 = time.perf_counter()
        fetched = self.cache.refresh(conn, now)
        t1 = time.perf_counter()
        window = self.cache.window(now, load_runs(conn, now - self.cache.window_s, now), load_facts(conn))
        result = run_detectors(window, self.config)
        t2 = time.perf_counter()
        plan = incident_store.sweep(conn, result.findings, now, self.settings.detect.resolve_after_s)
        quarantined = 0
        if self.quarantine is not None:
            try:
                quarantined = len(self.quarantine.run(conn, now))
            except psycopg.OperationalError:
                raise
            except Exception:  # a hook failure must not stop incidents and alerts
                log.exception("quarantine hooks failed this sweep")
        if self.alerts is not None:
            resolved = [r[0] for r in conn.execute(
                "SELECT id FROM incidents WHERE state = 'resolved' AND scope_key = ANY(%s)",
                ([r.scope_key for r in plan.resolves],)).fetchall()] if plan.resolves else []
            self.alerts.sync(conn, resolved)
        self.last = {"fetched_rows": fetched, "refresh_s": t1 - t0, "detect_s": t2 - t1,
                     "store_s": time.perf_counter() - t2, "gpus": len(window.gpus),
                     "findings": len(result.findings), "failures": len(result.failures),
                     "quarantine_actions": quarantined}
        if result.failures:
            log.warning("detectors failed this sweep: %s", result.failures)
