"""The live detector sweep: window cache -> detectors -> incidents -> alerts."""

from __future__ import annotations

import logging
import time

import psycopg

from gpufleet.collector import cyclegc, incident_store, onsets
from gpufleet.collector.actions import RunActions
from gpufleet.collector.alerting import AlertmanagerPusher
from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.collector.heap import release_free_memory
from gpufleet.collector.quarantine import Quarantine
from gpufleet.collector.shards import ShardScope
from gpufleet.collector.window_cache import COMMIT_SLACK_S, WindowCache, load_facts, load_runs
from gpufleet.collector.window_snapshot import WindowSnapshots
from gpufleet.config import Settings
from gpufleet.db.read_routing import HistoryReads
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)

#: A sweep that read at least this share of the samples it then holds was a load (a first
#: sweep, a takeover's restore, a catch-up after an outage), not a steady refresh.
LOAD_SHARE = 0.1


class Sweeper:
    """Called by the leader every ``detect.sweep_interval_s`` with a connection and the time.

    Its first call restores the window its shard's previous owner persisted
    (:mod:`gpufleet.collector.window_snapshot`) and reads only the raw tail;
    without one it loads the window from the sample tables.  Every call then
    persists the segments of the window that aged (``snapshots=False``: never).

    With ``shards`` > 1 it sweeps one shard (:mod:`gpufleet.collector.shards`):
    it reads the nodes hashed to the shard and every node of the runs hashed
    to it, and reports and resolves only what the shard owns.  Quarantine
    hooks and run actions, which act fleet-wide, run on shard 0's sweeper.
    """

    def __init__(
        self,
        settings: Settings,
        config: DetectorConfig | None = None,
        *,
        shard: int = 0,
        shards: int = 1,
        snapshots: bool = True,
    ) -> None:
        self.settings = settings
        # The deployment's thresholds (settings ``detect``), unless a caller overrides them.
        self.config = config if config is not None else settings.detect
        self.scope = ShardScope(shard, shards) if shards > 1 else None
        self.cache = WindowCache(
            settings.detect.window_s, node_filter=self.scope.reads if self.scope else None
        )
        self.snapshots = WindowSnapshots(shard, shards) if snapshots else None
        url = settings.detect.alertmanager_url
        self.alerts = AlertmanagerPusher(url) if url else None
        self.quarantine = (
            Quarantine(settings.quarantine) if settings.quarantine.enabled and shard == 0 else None
        )
        self.actions = RunActions(settings.actions) if settings.actions.enabled and shard == 0 else None
        self.last: dict[str, float] = {}
        #: Seconds of the last sweep by stage: ``refresh`` (new samples into the window),
        #: ``window``, ``frame``, one per detector, ``store`` (incidents, alerts, quarantine)
        #: and ``snapshot``; the leader exports them as ``gpufleet_sweep_stage_seconds``.
        self.stages: dict[str, float] = {}
        #: What the last sweep found (and, sharded, owns).
        self.findings: list[Finding] = []
        #: Where a cold load reads the window: the standby of ``database.read_url`` while it is recent enough.
        self.history = HistoryReads.of(settings, max_lag_s=COMMIT_SLACK_S / 2)

    def _cold_load(self, conn: psycopg.Connection, now: float) -> int:
        """The whole window from the sample tables: from the standby of ``database.read_url`` while it
        is recent enough (:class:`gpufleet.db.read_routing.HistoryReads`), else from the primary.  The
        next refresh, on the primary, re-reads every batch received within its slack of the load, so
        what the standby had not replayed yet arrives then."""
        standby = self.history.connection() if self.history is not None else None
        if standby is not None:
            self.cache.brin.catch_up(conn)  # the primary summarizes; the standby's index follows it
            try:
                return self.cache.load(standby, now - self.cache.window_s, now + 3600, summarize=False)
            except psycopg.Error as e:
                assert self.history is not None
                self.history.failed(e)
        return self.cache.refresh(conn, now)

    def _date_new_incidents(self, conn: psycopg.Connection, findings: list[Finding], window: Window) -> None:
        """Date each new incident from where its data shows it began, looking back past the window when
        its condition was already there when the window began (late data: :mod:`.onsets`)."""
        slack = max(0.25 * self.cache.window_s, 1.0)
        edge = [f for f in findings if f.run_id is not None and onsets.at_window_start(f, window, slack)]
        if not edge:
            return
        open_scopes = {
            r[0]
            for r in conn.execute(
                "SELECT scope_key FROM incidents WHERE state = 'open' AND scope_key = ANY(%s)",
                ([f.scope_key for f in edge],),
            ).fetchall()
        }
        onsets.backdate(conn, edge, window, self.config, self.cache.window_s, open_scopes)

    def __call__(self, conn: psycopg.Connection, now: float) -> None:
        with cyclegc.paused():
            self._sweep(conn, now)

    def _sweep(self, conn: psycopg.Connection, now: float) -> None:
        t0 = time.perf_counter()
        self.stages = {}  # a sweep that fails part-way reports no stages, not the last sweep's
        runs = load_runs(conn, now - self.cache.window_s, now)
        moved = self.scope.update(runs) if self.scope is not None else set()
        restored = None
        first = not self.cache.loaded
        if not self.cache.loaded and self.snapshots is not None:
            restored = self.snapshots.restore(conn, self.cache, now)
        if restored is not None:
            fetched = restored
            if self.scope is not None:  # the snapshot's owner may have held other runs' nodes
                self.cache.drop_nodes(self.scope.reads)
                have = {k[0] for k in self.cache.gpus} | set(self.cache.hosts)
                missing = {
                    n
                    for n in self.scope.run_nodes | set(self.scope.node_home)
                    if n not in have and self.scope.reads(n)
                }
                added = self.cache.add_nodes(conn, missing, now)
                fetched += added
                if added and self.snapshots is not None:
                    self.snapshots.invalidate()
        elif not self.cache.loaded:
            fetched = self._cold_load(conn, now)
        else:
            if self.scope is not None:
                self.cache.drop_nodes(self.scope.reads)
            # nodes a run of this shard just reached: their window first, then what is new everywhere
            added = self.cache.add_nodes(conn, moved, now)
            fetched = added + self.cache.refresh(conn, now)
            if added and self.snapshots is not None:
                self.snapshots.invalidate()
        t1 = time.perf_counter()
        window = self.cache.window(now, runs, load_facts(conn))
        t_window = time.perf_counter()
        result = run_detectors(window, self.config)
        if self.scope is not None:
            result.findings = [f for f in result.findings if self.scope.owns_finding(f)]
        self._date_new_incidents(conn, result.findings, window)
        self.findings = result.findings
        t2 = time.perf_counter()
        plan = incident_store.sweep(
            conn,
            result.findings,
            now,
            self.settings.detect.resolve_after_s,
            owns=self.scope.owns_incident if self.scope is not None else None,
        )
        quarantined = 0
        if self.quarantine is not None:
            try:
                quarantined = len(self.quarantine.run(conn, now))
            except psycopg.OperationalError:
                raise
            except Exception:  # a hook failure must not stop incidents and alerts
                log.exception("quarantine hooks failed this sweep")
        acted = 0
        if self.actions is not None:
            try:
                acted = len(self.actions.run(conn, now))
            except psycopg.OperationalError:
                raise
            except Exception:  # as the quarantine hooks: incidents and alerts go on
                log.exception("run actions failed this sweep")
        if self.alerts is not None:
            resolved = (
                [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM incidents WHERE state = 'resolved' AND scope_key = ANY(%s)",
                        ([r.scope_key for r in plan.resolves],),
                    ).fetchall()
                ]
                if plan.resolves
                else []
            )
            self.alerts.sync(conn, resolved, owns=self.scope.owns if self.scope is not None else None)
        t3 = time.perf_counter()
        saved = 0
        if self.snapshots is not None:
            try:
                saved = self.snapshots.save(conn, self.cache, now)
            except psycopg.OperationalError:
                raise
            except Exception:  # a new owner then reads more raw samples; detection goes on
                log.exception("persisting the detector window failed")
        self.last = {
            "fetched_rows": fetched,
            "refresh_s": t1 - t0,
            "detect_s": t2 - t1,
            "store_s": t3 - t2,
            "gpus": len(window.gpus),
            "findings": len(result.findings),
            "failures": len(result.failures),
            "quarantine_actions": quarantined,
            "run_actions": acted,
            "restored": restored is not None,
            "snapshot_segments": saved,
            "snapshot_s": time.perf_counter() - t3,
        }
        if restored is not None or first or fetched >= LOAD_SHARE * self.cache.samples():
            # A load's temporaries are freed but their pages stay in the heap: hand them back
            # once.  Not after every sweep: a steady sweep reuses the same ~150-200 MB of scratch
            # at 10,000 GPUs, and every page handed back is faulted in again by the next sweep
            # (0.08 to 0.19 s of it at 10,000 GPUs: bench/sweep.py's sweep_trim_each_s against sweep_s).
            release_free_memory()
        self.stages = {
            "refresh": t1 - t0,
            "window": t_window - t1,
            **result.seconds,
            "store": t3 - t2,
            "snapshot": self.last["snapshot_s"],
        }
        if result.failures:
            log.warning("detectors failed this sweep: %s", result.failures)
