"""The agent's own Prometheus metrics: what it collected, spooled, shipped and lost.

Each agent gets its own registry (not the process-global one) so tests and the
benchmark can run several agents in one process.  The loss accounting is exact:
``samples_spooled = samples_delivered + samples_dropped + samples still in the
spool``, so an operator can tell a quiet node from one losing data.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.agent import metrics_http
from gpufleet.metricsauth import MetricsGuard

log = logging.getLogger(__name__)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.samples_collected = Counter(
            "gpufleet_agent_samples_collected",
            "Rows a source returned (GPU rows plus host rows)",
            ["source"],
            registry=r,
        )
        self.source_errors = Counter(
            "gpufleet_agent_source_errors",
            "Source reads that failed, by kind (error, timeout, skipped)",
            ["source", "kind"],
            registry=r,
        )
        self.source_seconds = Gauge(
            "gpufleet_agent_source_last_duration_seconds",
            "Duration of the source's last completed read",
            ["source"],
            registry=r,
        )
        self.samples_spooled = Counter(
            "gpufleet_agent_samples_spooled", "Merged samples written to the spool", registry=r
        )
        self.spool_bytes = Gauge(
            "gpufleet_agent_spool_bytes", "Bytes in the spool (sealed and open)", registry=r
        )
        self.spool_segments = Gauge(
            "gpufleet_agent_spool_segments", "Sealed segments waiting to ship", registry=r
        )
        self.batches_sent = Counter(
            "gpufleet_agent_batches_sent",
            "Batches the collector acknowledged, by answer (stored, duplicate)",
            ["status"],
            registry=r,
        )
        self.samples_delivered = Counter(
            "gpufleet_agent_samples_delivered", "Samples in acknowledged batches", registry=r
        )
        self.batches_retried = Counter(
            "gpufleet_agent_batches_retried",
            "Send attempts that will be retried, by reason",
            ["reason"],
            registry=r,
        )
        self.batches_dead_lettered = Counter(
            "gpufleet_agent_batches_dead_lettered",
            "Batches the collector refused for good, by HTTP status",
            ["status"],
            registry=r,
        )
        self.samples_dropped = Counter(
            "gpufleet_agent_samples_dropped",
            "Samples lost, by reason (spool_full, dead_letter, torn_record, corrupt_segment)",
            ["reason"],
            registry=r,
        )
        self.torn_records = Counter(
            "gpufleet_agent_spool_torn_records",
            "Records cut short by a crash and discarded on recovery",
            registry=r,
        )
        self.last_ship_success = Gauge(
            "gpufleet_agent_last_ship_success_timestamp_seconds",
            "Time of the last acknowledged batch",
            registry=r,
        )
        self._server: Any = None

    def serve(
        self,
        port: int,
        host: str = "0.0.0.0",
        guard: MetricsGuard | None = None,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        client_ca: Path | None = None,
    ) -> int:
        """Serve /metrics on ``port`` (0 disables); returns the port bound (0 when off).

        ``guard`` asks for a bearer token; ``certfile`` serves TLS, ``client_ca`` then requires a
        client certificate it signed (see :mod:`gpufleet.agent.metrics_http`)."""
        if port == 0:
            return 0
        server = metrics_http.serve(self.registry, port, host, guard, certfile, keyfile, client_ca)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample, 0 when absent (tests and the benchmark read it)."""
        v = self.registry.get_sample_value(name, labels or None)
        return float(v) if v is not None else 0.0
