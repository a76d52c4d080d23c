"""The collector's own Prometheus metrics (one registry per collector instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The process's CPU, memory and descriptors, and its garbage collections by
        # generation (``python_gc_collections_total``): what an operator sizing
        # collectors reads, and what bench/vs_prometheus.py reads in its window.
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        self.requests = Counter(
            "gpufleet_ingest_requests", "Ingest requests by HTTP status", ["code"], registry=r
        )
        self.samples = Counter("gpufleet_ingest_samples", "Samples committed", ["kind"], registry=r)
        self.duplicates = Counter(
            "gpufleet_ingest_duplicate_batches", "Retried batches acknowledged, not re-stored", registry=r
        )
        self.rejected_skew = Counter(
            "gpufleet_ingest_rejected_skew_samples",
            "Samples refused for clock skew, per node",
            ["node"],
            registry=r,
        )
        self.errors = Counter("gpufleet_ingest_errors", "Refused batches by reason", ["reason"], registry=r)
        self.energy_glitches = Counter(
            "gpufleet_ingest_energy_glitches",
            "Energy counter jumps beyond what a GPU can draw over the interval, "
            "per node (stored; accounting integrates power over those intervals instead)",
            ["node"],
            registry=r,
        )
        self.client_gone = Counter(
            "gpufleet_ingest_client_gone",
            "Shipments whose client left before the body was whole (nothing "
            "stored; the agent sends the batch again; counted in gpufleet_ingest_requests as code 499)",
            registry=r,
        )
        self.latency = Histogram(
            "gpufleet_ingest_latency_seconds",
            "Request latency until commit",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.connections_aged = Counter(
            "gpufleet_ingest_connections_aged",
            "Agent connections ended after ingest.max_connection_age_s "
            "(the agent reconnects; a balancer places it afresh)",
            registry=r,
        )
        self.connections_cut = Counter(
            "gpufleet_http_connections_cut",
            "Connections closed for a slow or excess client, by reason: "
            "header_timeout, body_timeout, bodies_in_flight (answered 503), pending_per_ip",
            ["reason"],
            registry=r,
        )
        self.queue_rows = Gauge("gpufleet_ingest_queue_rows", "Rows waiting for the writer", registry=r)
        self.db_up = Gauge("gpufleet_database_up", "1 when the database accepts writes", registry=r)
        self.leader = Gauge("gpufleet_leader", "1 on the replica running sweeps and rollups", registry=r)
        self.sweep_seconds = Histogram(
            "gpufleet_sweep_seconds",
            "Detector sweep duration",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.sweep_stage_seconds = Histogram(
            "gpufleet_sweep_stage_seconds",
            "Detector sweep duration by stage: refresh, window, frame, each detector by kind, store, snapshot",
            ["stage"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
        self.rollup_lag = Gauge(
            "gpufleet_rollup_queue_rows", "Ranges waiting for the rollup worker", registry=r
        )
        self.inferred_runs = Counter(
            "gpufleet_inferred_runs", "Runs registered from the runs agents saw on GPUs", registry=r
        )
        self.inferred_conflicts = Counter(
            "gpufleet_inferred_run_conflicts",
            "Inferred allocations or run windows the one-run-per-GPU rule refused (samples still stored)",
            registry=r,
        )
        self.inferred_refused = Counter(
            "gpufleet_inferred_sightings_refused",
            "GPUs samples showed on an inferred run that did not become its allocations: shown from before the "
            "run began or long after (samples still stored; run_sightings.detail says why)",
            registry=r,
        )
        # gpufleet_incident_open comes from collector.alerting.IncidentMetrics (read from the
        # database by every replica); a second family of that name here would make the whole
        # exposition unparseable ("second HELP line").
