"""Typed settings for every gpufleet process, in one pydantic-settings model.

Built by :func:`load_settings`, never at import time, so tests and the demo can
point each process at their own database.  Environment variables use the
prefix ``GPUFLEET_`` and ``__`` for nesting (``GPUFLEET_INGEST__MAX_BODY_BYTES``);
a YAML file given with ``--config`` (or ``GPUFLEET_CONFIG``) fills what the
environment leaves unset.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpufleet.detectconfig import DetectorConfig


class ConfigError(ValueError):
    """A settings file or variable is malformed; the message names it."""


class IngestSettings(BaseModel):
    model_config = {"extra": "forbid"}

    #: Largest request body accepted on the wire (compressed), bytes.
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    #: Largest body after decompression, bytes; guards against zip bombs.  A bomb
    #: costs the collector this much memory while it is cut off, so it is kept just
    #: above the largest legal batch (50,000 samples with every field as row-format
    #: JSON: 31 MiB; the agent's columnar msgpack of the same: 7.5 MiB).
    max_decompressed_bytes: int = Field(32 * 1024 * 1024, gt=0)
    #: Most GPU + host samples in one batch.
    max_samples_per_batch: int = Field(50_000, gt=0)
    #: Samples stamped further than this in the future are refused, seconds.
    future_grace_s: float = Field(300.0, ge=0)
    #: Samples older than this are refused, seconds (the agent spool keeps
    #: about this long, so a drained backlog still lands).
    past_grace_s: float = Field(14 * 86400.0, ge=0)
    #: Group commit: most rows gathered into one COPY transaction.
    group_max_rows: int = Field(20_000, gt=0)
    #: Group commit: how long the writer waits for more requests, seconds
    #: (less when ``group_linger_batches`` requests or a quarter of
    #: ``group_max_rows`` are already waiting).  Agents ship every 10 s, so
    #: 200 ms of latency is nothing to them, and at a hundred requests a second
    #: it gathers about 20 into each transaction instead of 4 or 5: about a
    #: sixth less CPU per sample, collector and PostgreSQL together, when it
    #: was measured (bench/vs_prometheus.py, 4,000 GPUs shipping every 5 s).
    group_linger_s: float = Field(0.2, ge=0)
    #: Group commit: a lingering writer stops waiting once this many requests
    #: are queued.  Past a few hundred requests a second this, not the linger,
    #: sets the size of a transaction; 64 instead of 16 takes 8 to 9 % off the
    #: CPU per sample, collector and PostgreSQL together, at 24,000 GPUs (600
    #: requests a second; p99 acknowledgement 36 -> 130 ms), and 128 takes no
    #: more off while doubling the p99 (docs/capacity.md, "Group size").
    group_linger_batches: int = Field(64, gt=0)
    #: Rows waiting for the writer beyond which ingest answers 429.
    queue_max_rows: int = Field(400_000, gt=0)
    #: Writer connections.  Two keep the database busy: while one waits for
    #: its COPY and commit, the other encodes the next group.  With one, every
    #: request waits for the whole serial cycle and, on a loaded database
    #: host, one process ingests about half as much (bench/ingest.py).
    writers: int = Field(2, ge=1, le=32)
    #: Per-token request rate limit (requests/s, burst = 2 s worth); 0 = off.
    rate_limit_per_s: float = Field(0.0, ge=0)
    #: Seconds a client should wait after 429/503.
    retry_after_s: int = Field(2, ge=1)
    #: How long an idle agent connection is held open for its next batch, seconds.
    #: Longer than the agents' ``ship_interval_s`` (10 s) and their own
    #: ``keepalive_s`` (20 s), so a node ships every batch over one connection,
    #: and over TLS one handshake, instead of racing the server's timer each
    #: time; at uvicorn's default of 5 s, equal to the ship interval, a share of
    #: the shipments reconnected (bench/vs_prometheus.py's connection count).
    keep_alive_s: int = Field(30, ge=1)
    #: A connection older than this (less up to a quarter, at random) is closed after its
    #: next answer, seconds; 0 = never.  Agents then reconnect, so a connection-level
    #: balancer in front of the replicas spreads them again after a scale-out or a
    #: replica's restart instead of leaving them where they first landed
    #: (gpufleet.collector.connection_age).
    max_connection_age_s: float = Field(300.0, ge=0)
    #: How long a batch id is remembered for de-duplication, days.
    dedup_days: float = Field(21.0, gt=0)
    #: Highest GPU index a batch may name (far above any node built; each index a node sends is a GPU
    #: its node is billed and reported for).
    max_gpu_index: int = Field(255, ge=0, le=32767)
    #: Most runs one batch may name (samples' ``run_id`` and facts' ``runs``): each new one becomes
    #: an inferred run.  A node with 8 GPUs in 7 MIG instances runs 56 at once.
    max_runs_per_batch: int = Field(256, ge=1)
    #: A connection must send a request's headers within this long of its first byte, seconds.
    header_timeout_s: float = Field(10.0, gt=0)
    #: ... and its body within this long of its headers, seconds.
    body_timeout_s: float = Field(60.0, gt=0)
    #: Request bodies the collector holds at once, bytes; a request beyond it answers 503 at once
    #: (agents retry) instead of growing the process.
    max_body_bytes_in_flight: int = Field(128 * 1024 * 1024, gt=0)
    #: Connections one client address may hold before its requests' headers are complete (the
    #: part anyone can reach without a token); more are closed at once.
    max_pending_connections_per_ip: int = Field(64, ge=1)


def _postgres_url(v: str | None) -> str | None:
    if v is not None and not v.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise ValueError("must start with postgresql://")
    if v is not None and v.startswith("postgresql+psycopg://"):
        v = "postgresql://" + v.removeprefix("postgresql+psycopg://")
    return v


class DatabaseSettings(BaseModel):
    """Where reads may go besides the primary (``database_url``): :mod:`gpufleet.db.read_routing`."""

    model_config = {"extra": "forbid"}

    #: A streaming-replication hot standby of the primary (``pg_basebackup -R``).  Set, the API's
    #: reads and the web view's pages go to it while its view is at most ``max_read_lag_s`` old,
    #: and the detector sweep's history reads while it is within their own bound; writes, token
    #: checks and the sweep's fresh window stay on the primary.  Unset: everything on the primary.
    read_url: str | None = None
    #: Oldest view of the data a read may be served from, seconds; a standby further behind
    #: (or unreachable, or promoted) sends reads to the primary until it catches up.
    max_read_lag_s: float = Field(10.0, ge=0)
    #: How often the standby's lag is measured, seconds (two one-row queries, one on each server).
    lag_check_s: float = Field(1.0, gt=0)

    @field_validator("read_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return _postgres_url(v or None)  # empty (an unset variable in a compose file): no standby


class ApiSettings(BaseModel):
    model_config = {"extra": "forbid"}

    #: Largest request body of any /v1 route, bytes (the biggest legal one is a carbon or price
    #: series of 100,000 points, about 7 MiB).  Checked before the body is read, and bodies are
    #: read only after the token is checked; the web view's forms have limits of their own.
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    #: Database connections of the API process.
    pool_size: int = Field(8, ge=2, le=256)
    #: Longest one statement of a request may run, seconds (PostgreSQL cancels it; the request
    #: answers 503 naming the limit, and nothing keeps running after the client gave up).
    statement_timeout_s: float = Field(30.0, gt=0)
    #: Requests one token (or web session) may have in progress at once; more answer 429 with
    #: Retry-After.
    max_concurrent_per_token: int = Field(2, ge=1)
    #: Requests of one role in progress at once: one role's expensive readers never hold the whole
    #: pool, so the others are answered (default: half the pool).
    max_concurrent_per_role: int | None = Field(None, ge=1)
    #: How long a request waits for its token's or role's turn before answering 429, seconds.
    concurrency_wait_s: float = Field(1.0, ge=0)
    #: Connection hygiene, as for the collector (``ingest.header_timeout_s`` ...).
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    max_body_bytes_in_flight: int = Field(128 * 1024 * 1024, gt=0)
    max_pending_connections_per_ip: int = Field(64, ge=1)


class MetricsSettings(BaseModel):
    """Who may read the collector's ``/metrics``, and what it shows.

    By default it is open, as Prometheus endpoints usually are, but it names nodes, run ids and
    incident evidence; set a token (Prometheus ``authorization: credentials_file``) and/or client
    certificate names (mTLS, with ``tls.client_ca``), and ``redact`` to leave run ids and evidence out.
    """

    model_config = {"extra": "forbid"}

    #: Bearer token a scrape must present (prefer ``token_file``; never logged).
    token: str | None = Field(None, min_length=16)
    #: File holding that token (first line), read at start.
    token_file: Path | None = None
    #: When set, a scrape must come with a verified client certificate whose CN or DNS name is one of
    #: these (needs ``tls.client_ca`` and ``tls.client_cert`` optional or required).
    client_names: list[str] = Field(default_factory=list)
    #: Leave run ids (the label is empty) and incident evidence out of ``/metrics``; alerts that need
    #: them then come from the Alertmanager push (``detect.alertmanager_url``).
    redact: bool = False
    #: Whether ``/metrics`` carries the fleet's series (open incidents, every node's last-seen time
    #: and skew refusals, quarantine actions).  They are read from the database and are the same on
    #: every replica, so each replica's page holds two series per node (1.9 MB at 12,000 nodes,
    #: ``bench/metrics_scrape.py``) and Prometheus stores each once per replica.  ``/metrics/fleet``
    #: always serves them alone: a large fleet turns this off and scrapes that path once, through
    #: the replicas' balancer.
    fleet_on_metrics: bool = True


class StorageSettings(BaseModel):
    model_config = {"extra": "forbid"}

    #: Raw samples kept this long (TimescaleDB retention policy / plain DELETE).
    retention_days: int = Field(90, ge=1)
    #: Rollups kept this long.
    rollup_retention_days: int = Field(3 * 365, ge=1)
    #: TimescaleDB chunks older than this are compressed.
    compress_after_hours: int = Field(24, ge=1)
    #: Rows of one GPU per compressed batch (TimescaleDB 2.20+
    #: ``timescaledb.compression_batch_size_limit``; its default is 1,000).
    #: Each compressed column of a batch is a TOASTed value with a few dozen
    #: bytes of overhead, about 2.5 B per sample over a 1,000-row batch of
    #: ~50 columns; 10,000 rows (under 3 h at 1 Hz) cut that tenfold.
    #: Queries on old data decompress whole batches: at 10,000 rows still
    #: well under a millisecond of CPU per GPU.
    compress_batch_rows: int = Field(10000, ge=1, le=32767)
    #: Use TimescaleDB when the extension is installable ("auto"), or insist.
    timescale: Literal["auto", "on", "off"] = "auto"


class AccountingSettings(BaseModel):
    model_config = {"extra": "forbid"}

    #: Power integration does not bridge intervals longer than this, seconds.
    max_gap_s: float = Field(60.0, gt=0)
    #: A GPU silent this long has left the fleet (retired, moved, its node taken down): its time after
    #: that counts nowhere, instead of as GPU time without telemetry, seconds.
    gone_after_s: float = Field(86400.0, gt=0)
    #: Days of closed hours whose fleet-wide accounting the collector's leader keeps, so fleet-wide
    #: reads price only what is not kept (gpufleet.accounting.fleet_hours); 0 keeps none.  Capped a day
    #: short of the storage retention, past which kept hours are dropped.
    keep_fleet_days: float = Field(35.0, ge=0)


class TeamSettings(BaseModel):
    """The team a run is billed to when whoever registered it named none, from where the job came from
    (gpufleet.teams): a Slurm job's account, a Kubernetes job's namespace, mapped by ``map``."""

    model_config = {"extra": "forbid"}

    #: Run labels read in order; the first one a run carries names its team.
    from_labels: list[str] = Field(default_factory=lambda: ["slurm.account", "k8s.namespace"])
    #: label -> {value -> team}: accounts, partitions or namespaces whose team has another name.
    map: dict[str, dict[str, str]] = Field(default_factory=dict)
    #: A value without an entry in ``map`` is the team's name itself (false: such a run has no team).
    unmapped_is_team: bool = True


class CarbonSource(BaseModel):
    """One carbon-intensity source the collector fetches on a schedule (gpufleet.carbon)."""

    model_config = ConfigDict(extra="forbid")

    region: str = Field(min_length=1, max_length=128, description="carbon region the points are stored under")
    provider: Literal["electricitymaps", "watttime"]
    zone: str | None = Field(None, description="the provider's zone or region id (default: region)")
    token_file: Path = Field(description="file with the API token (watttime: 'username:password')")
    base_url: str | None = Field(None, description="the service's base URL (default: its public one)")
    every_s: float = Field(3600.0, ge=60.0, description="fetch interval")
    lookback_s: float = Field(2 * 86400.0, ge=3600.0, description="each fetch asks for this much history")


class CarbonSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[CarbonSource] = Field(default_factory=list)


class RemoteWriteSettings(BaseModel):
    """Prometheus remote write into the collector (``POST /api/v1/write``, gpufleet.collector.remote_write)."""

    model_config = {"extra": "forbid"}

    #: Labels naming the node a series is of, the first a series has wins; ``instance`` loses its
    #: ``:port``.  dcgm-exporter labels its series ``Hostname``; node_exporter's have only ``instance``
    #: unless a relabelling adds ``node`` (which is why it comes first).
    node_labels: list[str] = Field(
        default_factory=lambda: ["node", "Hostname", "hostname", "instance"], min_length=1
    )
    #: A (node, time) is assembled into rows once its last piece is this old, seconds: the pieces of one
    #: scrape arrive in several requests (Prometheus's shards and batches), within its
    #: ``batch_send_deadline`` (5 s) and retry backoff.  A piece later than this is counted, not merged.
    merge_delay_s: float = Field(10.0, ge=0, le=3600)
    #: Whether this replica contends to assemble (one replica at a time does, whichever holds the lock;
    #: independent of ``leader``).
    assemble: bool = True
    #: How often the assembling replica looks for whole groups, seconds.
    assemble_every_s: float = Field(1.0, gt=0, le=60)
    #: Pieces waiting beyond which remote write answers 503 (Prometheus retries): the assembler is behind.
    max_pending_parts: int = Field(500_000, gt=0)


class RunMetricsSettings(BaseModel):
    """Per-run energy, cost, CO2e, GPU-hours and goodput on the collector's ``/metrics``
    (gpufleet.collector.run_metrics): computed by the leader every ``refresh_s``, never per scrape."""

    model_config = {"extra": "forbid"}

    enabled: bool = True
    #: How often the leader recomputes them, seconds.
    refresh_s: float = Field(60.0, ge=5)
    #: Runs ended longer ago than this leave the series, seconds (running runs are always in).
    horizon_s: float = Field(86400.0, ge=0)
    #: At most this many runs are exported (the most recent first); the rest are counted.
    max_runs: int = Field(2000, ge=1)
    #: Also export per GPU: the energy attributed to its run and whether an incident is open on it.
    per_gpu: bool = False


class RunsSettings(BaseModel):
    """Runs the collector registers from the runs agents attribute to GPU samples (gpufleet.store.inferred)."""

    model_config = {"extra": "forbid"}

    #: Register a run (``source: inferred``) and its GPUs when samples name a run nobody registered.
    infer: bool = True
    #: An inferred run ends at its last sample once no GPU has shown it for this long, seconds:
    #: longer than a pod restart or a rescheduled worker, shorter than the gap between two jobs.
    inferred_end_grace_s: float = Field(300.0, gt=0)


class DetectSettings(DetectorConfig):
    """The sweep's cadence plus every detector threshold (inherited from
    :class:`DetectorConfig`, where each one's reasoning is documented)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Detector sweep period, seconds.
    sweep_interval_s: float = Field(5.0, gt=0)
    #: Window of samples each sweep looks at, seconds.
    window_s: float = Field(600.0, gt=0)
    #: Sweep shards spread over the collector replicas (nodes and runs hashed to
    #: shards, one advisory lock each; rollups follow the nodes).  1: the leader
    #: sweeps the whole fleet.
    shards: int = Field(1, ge=1)
    #: An incident resolves after being clear this long, seconds.
    resolve_after_s: float = Field(120.0, ge=0)
    #: Alertmanager base URL for direct pushes (None: export metrics only).
    alertmanager_url: str | None = None

    @model_validator(mode="after")
    def _durations_fit_the_window(self) -> DetectSettings:
        # A detector sees one window: a condition it must see last longer than that is never seen.
        for name in ("idle_min_s", "hung_min_s"):
            if getattr(self, name) > self.window_s:
                raise ValueError(
                    f"{name} ({getattr(self, name):g} s) must not exceed window_s "
                    f"({self.window_s:g} s): each sweep sees one window"
                )
        return self


class QuarantineSettings(BaseModel):
    """Take a failing node out of scheduling and put it back once it passes (on, in dry run, by default).

    The leader, after each sweep, drains the node in Slurm (``scontrol update
    nodename=N state=drain reason=...``) or cordons and taints it in Kubernetes,
    for an open health incident of ``kinds`` (critical) or ``warning_kinds``
    (any severity) or a failed node check of ``checks``; once nothing holds it,
    it is resumed (uncordoned, untainted) after ``hold_down_s`` of passing.
    Every action is logged (``quarantine_log``) and the triggering incident's
    record says what was done.  XIDs the application causes and node settings
    (governor, quota) never quarantine.  ``dry_run`` (the default) works out,
    logs and records every action and takes none."""

    model_config = {"extra": "forbid"}

    enabled: bool = True
    backend: Literal["slurm", "kubernetes"] = "slurm"
    #: Log and record the action without running it.
    dry_run: bool = True
    #: Incident kinds whose critical incidents quarantine their node.  A
    #: repeated-XID ``host_misconfig`` counts only when an XID points at the
    #: hardware (gpufleet.xid); node settings (governor, quota) never do.
    kinds: tuple[str, ...] = ("gpu_health", "nvlink_degraded", "host_misconfig", "pcie_degraded")
    #: Kinds whose warnings quarantine too: a PCIe link trained below its maximum under load.
    warning_kinds: tuple[str, ...] = ("pcie_degraded",)
    #: Node checks (gpufleet diagnose, the agent's node facts) whose failure quarantines the node.
    checks: tuple[str, ...] = (
        "pcie_link",
        "nvlink",
        "clocks_event_reasons",
        "kernel_xid",
        "dcgm_diag",
        "ib_port",
    )
    #: Put a node back once nothing has held it for ``hold_down_s`` seconds.
    release: bool = True
    hold_down_s: float = Field(1800.0, ge=0)
    #: At most this many nodes quarantined per hour, fleet-wide: a fault that
    #: hits everything at once (a bad driver roll-out) must not drain the fleet.
    max_nodes_per_hour: int = Field(3, ge=1)
    #: A failed action is retried after this long, at most ``max_attempts`` times per episode.
    retry_after_s: float = Field(300.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    #: The scontrol binary (a name on PATH or a path) and how long it may take, seconds.
    scontrol: str = "scontrol"
    command_timeout_s: float = Field(30.0, gt=0)
    #: Kubernetes API server and the service account's token and CA (the in-cluster defaults).
    k8s_api_url: str = "https://kubernetes.default.svc"
    k8s_token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    k8s_ca_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    #: Besides cordoning, taint the Node ``gpufleet.io/quarantine:NoSchedule`` (the other taints kept).
    k8s_taint: bool = True
    #: gpufleet node name -> scheduler node name, where they differ (default: the same name).
    node_names: dict[str, str] = Field(default_factory=dict)


RunActionKind = Literal["idle_allocation", "hung_collective"]
RunAction = Literal["notify", "requeue", "cancel", "annotate"]


def _notify_only() -> dict[RunActionKind, RunAction]:
    return {"idle_allocation": "notify", "hung_collective": "notify"}


class RunActionSettings(BaseModel):
    """Act on runs that hold GPUs without using them: ``idle_allocation`` and ``hung_collective`` incidents
    (off by default; gpufleet.collector.actions).

    Per kind one action: ``notify`` (record only: the alert is the notification), Slurm ``requeue``
    (``scontrol requeue``) or ``cancel`` (``scancel``), Kubernetes ``annotate`` (an annotation on the run's
    owner: its PyTorchJob, JobSet, RayJob, Job... or its pod).  Only runs of the allow-listed ``teams`` or
    (Slurm) ``partitions`` are acted on; with both lists empty, none.  ``dry_run`` (the default) records
    and logs what would be done; turn it off once the records look right.  Every action is recorded on the
    incident (``incidents.actions``) with who decided it and why."""

    model_config = {"extra": "forbid"}

    enabled: bool = False
    backend: Literal["slurm", "kubernetes"] = "slurm"
    #: Log and record the action without running it.
    dry_run: bool = True
    #: Incident kind -> action.  A kind not listed is not acted on.
    kinds: dict[RunActionKind, RunAction] = Field(default_factory=_notify_only)
    #: Runs of these teams may be acted on (the run's ``team``).
    teams: list[str] = Field(default_factory=list)
    #: Runs in these Slurm partitions may be acted on (the run's ``slurm.partition`` label, which the
    #: deploy/slurm prolog sets).
    partitions: list[str] = Field(default_factory=list)
    #: An incident is acted on once it has been open this long, seconds (on top of the detector's own
    #: ``idle_min_s`` / ``hung_min_s``): time for its owner to react to the alert first.
    wait_s: float = Field(0.0, ge=0)
    #: At most this many runs acted on per hour, fleet-wide (dry runs count).
    max_per_hour: int = Field(10, ge=1)
    #: A failed action is retried after this long, at most ``max_attempts`` times per incident.
    retry_after_s: float = Field(300.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    #: Slurm binaries (a name on PATH or a path) and how long a command may take, seconds.
    scontrol: str = "scontrol"
    scancel: str = "scancel"
    command_timeout_s: float = Field(30.0, gt=0)
    #: Prefix the Slurm prolog puts before the job id in run ids (its GPUFLEET_RUN_PREFIX).
    slurm_run_prefix: str = ""
    #: Kubernetes API server and the service account's token and CA (the in-cluster defaults).
    k8s_api_url: str = "https://kubernetes.default.svc"
    k8s_token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    k8s_ca_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    #: Owner kind -> "<group>/<version>/<plural>" (core: "v1/<plural>") for kinds beyond the built-in table.
    k8s_resources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fits_backend(self) -> RunActionSettings:
        allowed = {"slurm": ("notify", "requeue", "cancel"), "kubernetes": ("notify", "annotate")}[
            self.backend
        ]
        bad = {k: a for k, a in self.kinds.items() if a not in allowed}
        if bad:
            raise ValueError(
                f"actions.kinds: {', '.join(f'{k}: {a}' for k, a in bad.items())} is not an action of "
                f"the {self.backend} backend (one of {', '.join(allowed)})"
            )
        return self


class TLSSettings(BaseModel):
    model_config = {"extra": "forbid"}

    certfile: Path | None = None
    keyfile: Path | None = None
    #: CA bundle for client certificates; set to require mTLS.
    client_ca: Path | None = None
    #: "optional" accepts clients without a certificate, "required" refuses them.
    client_cert: Literal["none", "optional", "required"] = "none"


class SourceSchedule(BaseModel):
    """How often one source is read and how long a read may take (unset: the agent-wide values)."""

    model_config = {"extra": "forbid"}

    #: Sampling period of this source, seconds; rounded to a whole number of agent ticks.
    interval_s: float | None = Field(None, gt=0)
    #: A read running longer than this is counted as a timeout and its result discarded, seconds.
    timeout_s: float | None = Field(None, gt=0)


class KubernetesSettings(BaseModel):
    """Kubernetes attribution on the node (gpufleet.agent.k8s): which pod holds which GPU, and its run."""

    model_config = {"extra": "forbid"}

    #: Ask the kubelet's pod-resources API which container holds which GPU.
    enabled: bool = False
    #: The kubelet's pod-resources socket (mounted read-only into the agent's pod).
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    #: Extended resources that are GPUs (shell patterns): whole GPUs, shared replicas, MIG devices.
    gpu_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"]
    )
    #: A pod annotation (or label) whose value is the run id, verbatim.
    run_id_key: str = "gpufleet.io/run-id"
    #: Owner kinds that are runs; the topmost in a pod's owner chain names the run (else the pod).
    run_kinds: list[str] = Field(
        default_factory=lambda: [
            "TrainJob",
            "PyTorchJob",
            "TFJob",
            "MPIJob",
            "XGBoostJob",
            "PaddleJob",
            "JAXJob",
            "JobSet",
            "RayJob",
            "Job",
        ]
    )
    #: Labels naming the team, first found on the pod or its owners wins.
    team_labels: list[str] = Field(default_factory=lambda: ["gpufleet.io/team", "team"])
    #: Without a team label, the namespace is the team.
    team_from_namespace: bool = True
    #: A team label's value or a namespace -> the team it belongs to (a namespace per project, say).
    team_map: dict[str, str] = Field(default_factory=dict)
    #: Read pod labels, annotations and owners from the API server (the agent's service account).
    pod_metadata: bool = True
    #: API server URL (unset: in-cluster, from KUBERNETES_SERVICE_HOST/PORT).
    api_server: str | None = None
    token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    #: How often the kubelet is asked, seconds (it limits this API's request rate; a few seconds is light).
    refresh_s: float = Field(5.0, gt=0)
    #: How often the node's pod metadata is re-listed (new pods are read when first seen), seconds.
    metadata_refresh_s: float = Field(60.0, gt=0)
    #: Longest a kubelet or API server request may take, seconds.
    timeout_s: float = Field(2.0, gt=0)


class SimSettings(BaseModel):
    """The simulated fleet the ``sim`` and ``fake-nvml`` sources read (demo, tests, benchmarks).

    Those sources are plug-ins of :mod:`gpufleet.sim`; the agent knows them by
    name only, so these settings are all it holds of the simulator.
    """

    model_config = {"extra": "forbid"}

    #: Scenario the ``sim`` source plays when no fleet was attached in-process (a name or a YAML path).
    scenario: str = "demo"
    #: Seed of that scenario (unset: the scenario's own).
    seed: int | None = None
    #: Simulated seconds per wall-clock second.
    speed: float = Field(1.0, gt=0)
    #: H100s the ``fake-nvml`` source presents.
    fake_nvml_gpus: int = Field(8, ge=1, le=64)


class AgentSettings(BaseModel):
    model_config = {"extra": "forbid"}

    collector_url: str = "http://127.0.0.1:8410"
    token: str | None = None
    #: Host name the samples are filed under (unset: this machine's short host name).
    node: str | None = None
    #: Sampling period of the GPU and host sources, seconds (the agent's tick).
    interval_s: float = Field(1.0, gt=0)
    #: Longest a source read may take before it is counted as a timeout, seconds
    #: (unset: half the source's interval, so a tick is never late by more than that).
    collect_timeout_s: float | None = Field(None, gt=0)
    #: Per-source interval and timeout by source name, e.g. ``{"dcgm": {"interval_s": 5}}``.
    source_schedules: dict[str, SourceSchedule] = Field(default_factory=dict)
    #: The first tick waits a random share of this, seconds (unset: one interval), so a
    #: fleet started together does not sample and ship in lockstep.
    start_jitter_s: float | None = Field(None, ge=0)
    #: How often node facts (GPU models, driver, governor...) are re-read; they are
    #: sent with the first batch and again only when they change, seconds.
    facts_interval_s: float = Field(300.0, gt=0)
    #: How often a spool segment is sealed and shipped, seconds.  Samples are
    #: taken every ``interval_s`` whatever this is; it sets how late they reach
    #: the collector (at most this long, plus the sweep) and how many a request
    #: carries.  Each request costs the collector a fixed share (HTTP, auth,
    #: decoding) whatever its size, so 10 s instead of 5 s takes about 30 % off
    #: the CPU per GPU-sample of collector and PostgreSQL together at 24,000
    #: GPUs, and 15 s about 40 % (bench/vs_prometheus.py --ship-interval;
    #: docs/capacity.md, "Ship interval"), for 5 s more delay to dashboards and
    #: alerts that wait a minute or more anyway.
    ship_interval_s: float = Field(10.0, gt=0)
    #: Spool directory (unset: ``<data_dir>/agent-spool``).
    spool_dir: Path | None = None
    #: Spool size cap, bytes; beyond it the oldest sealed segments are dropped (and counted).
    spool_max_bytes: int = Field(256 * 1024 * 1024, gt=0)
    #: A segment is sealed early once it holds this many samples (keeps a batch
    #: under the collector's per-batch limit whatever the GPU count).
    segment_max_samples: int = Field(10_000, gt=0)
    #: fsync every spooled record: survives power loss, not just a killed agent,
    #: at the price of one disk flush per tick.
    spool_fsync: bool = False
    #: Cap of the dead-letter folder (batches the collector refused), bytes; oldest go first.
    dead_letter_max_bytes: int = Field(64 * 1024 * 1024, ge=0)
    #: Sources to run, by registered name.
    sources: list[str] = Field(default_factory=lambda: ["nvml", "host"])
    #: The simulated fleet behind the ``sim`` and ``fake-nvml`` sources.
    sim: SimSettings = Field(default_factory=SimSettings)
    #: Prometheus /metrics port of the agent itself; 0 disables it.
    metrics_port: int = Field(9410, ge=0, le=65535)
    #: Address the agent's /metrics listens on.
    metrics_host: str = "0.0.0.0"
    #: Bearer token a scrape of the agent's /metrics must present (prefer ``metrics_token_file``).
    metrics_token: str | None = Field(None, min_length=16)
    metrics_token_file: Path | None = None
    #: Serve /metrics over TLS with this certificate and key.
    metrics_certfile: Path | None = None
    metrics_keyfile: Path | None = None
    #: With TLS: require a client certificate signed by this CA (mTLS).
    metrics_client_ca: Path | None = None
    #: A host power reading in watts when no RAPL/BMC source exists.
    host_power_w: float | None = Field(None, ge=0)
    #: dcgm-exporter URL for the ``dcgm_exporter`` source.
    dcgm_exporter_url: str = "http://127.0.0.1:9400/metrics"
    #: Directory of per-GPU job files a scheduler hook writes.
    job_files_dir: Path | None = None
    #: Label GPU rows with the run of the processes on the GPU (environment or pod cgroup).
    attribute_processes: bool = True
    #: Kubernetes attribution from the kubelet's pod-resources API (off unless enabled).
    kubernetes: KubernetesSettings = KubernetesSettings()
    #: Put the cgroup figures of the processes on each GPU (CPU used, quota, throttling,
    #: CPU and I/O pressure: the ``job_*`` columns) on the GPU's rows.
    job_cgroups: bool = True
    #: Run the node checks (``gpufleet diagnose``) at each facts refresh and send them as facts.
    node_checks: bool = True
    #: Run DCGM's own diagnostic (``dcgmi diag -r dcgm_diag_level``) this often where DCGM is
    #: installed, and send its result with the node checks, seconds; 0 turns it off.  Level 1
    #: (deployment checks, seconds) leaves the GPUs alone; levels 2 and 3 load them for minutes.
    dcgm_diag_interval_s: float = Field(21600.0, ge=0)
    dcgm_diag_level: int = Field(1, ge=1, le=4)
    #: The newest DCGM diagnostic result: the agent's runs write it, and so does the Slurm
    #: prolog's (deploy/slurm/prolog.sh, GPUFLEET_DCGM_DIAG_FILE); the node checks read it.
    dcgm_diag_result_file: Path = Path("/var/lib/gpufleet/dcgm-diag.json")
    #: The dcgmi binary (a name on PATH or a path).
    dcgmi: str = "dcgmi"
    #: Apply the power caps planned for runs on this node (``PUT /v1/runs/{id}/power-cap``) through
    #: NVML, to every GPU of the run here or none, and restore each GPU's limit after; off by default.
    #: Setting a limit needs root.  The plans are read from ``api_url`` with this node's token.
    power_caps: bool = False
    api_url: str | None = None
    power_cap_poll_s: float = Field(60.0, gt=0)
    #: The limits to restore, kept across agent restarts.
    power_cap_state_file: Path = Path("/var/lib/gpufleet/power-caps.json")
    #: Where the host's /proc and /sys are (a container mounts them elsewhere).
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    request_timeout_s: float = Field(10.0, gt=0)
    #: How long the idle connection to the collector is kept for the next
    #: shipment, seconds.  Longer than ``ship_interval_s``, so shipments reuse
    #: it (and its TLS session); shorter than the collector's
    #: ``ingest.keep_alive_s`` (30 s), so the agent drops an idle connection
    #: before the collector does and never sends a batch into one being closed.
    keepalive_s: float = Field(20.0, gt=0)
    #: Retries wait a random time up to ``retry_base_s * 2**attempt``, capped here, seconds.
    retry_base_s: float = Field(0.5, gt=0)
    retry_max_s: float = Field(60.0, gt=0)
    #: On SIGTERM the agent seals its spool and ships for at most this long, seconds.
    shutdown_ship_s: float = Field(5.0, ge=0)
    #: CA bundle to verify the collector's certificate (unset: the system store).
    ca_file: Path | None = None
    #: Client certificate (and key, if not in the same file) for mTLS.
    client_cert: Path | None = None
    client_key: Path | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPUFLEET_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    #: PostgreSQL URL (postgresql://...). Unset: an embedded server is started
    #: in ``data_dir/pg``.
    database_url: str | None = None
    #: Read replicas (``database.read_url``) and how stale a read may be.
    database: DatabaseSettings = DatabaseSettings()
    data_dir: Path = Path(".gpufleet")
    collector_host: str = "127.0.0.1"
    collector_port: int = Field(8410, ge=0, le=65535)
    api_host: str = "127.0.0.1"
    api_port: int = Field(8420, ge=0, le=65535)
    #: "development" allows the demo's generated tokens; "production" refuses
    #: to start without explicit configuration.
    environment: Literal["development", "production"] = "development"
    log_level: str = "INFO"
    #: Whether this collector contends for leadership (rollups, sweeps).
    #: Turn off on ingest-only replicas.
    leader: bool = True
    #: The collector's and the API's young-generation threshold for Python's
    #: cyclic garbage collector, set once the process is built, when
    #: everything built at start-up is also frozen out of later collections; 0
    #: keeps Python's defaults (700, nothing frozen).  Why, with the figures:
    #: gpufleet.collector.cyclegc.
    gc_young_threshold: int = Field(10_000, ge=0)

    ingest: IngestSettings = IngestSettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings = MetricsSettings()
    storage: StorageSettings = StorageSettings()
    accounting: AccountingSettings = AccountingSettings()
    teams: TeamSettings = Field(default_factory=TeamSettings)
    runs: RunsSettings = RunsSettings()
    detect: DetectSettings = DetectSettings()
    quarantine: QuarantineSettings = QuarantineSettings()
    actions: RunActionSettings = RunActionSettings()
    tls: TLSSettings = TLSSettings()
    agent: AgentSettings = AgentSettings()
    carbon: CarbonSettings = CarbonSettings()
    remote_write: RemoteWriteSettings = RemoteWriteSettings()
    run_metrics: RunMetricsSettings = RunMetricsSettings()

    @model_validator(mode="after")
    def _production(self) -> Settings:
        # Defaults that suit a laptop must not silently carry a deployment:
        # no embedded database in production.
        if self.environment == "production" and not self.database_url:
            raise ValueError(
                "environment is 'production' but database_url is not set "
                "(the embedded PostgreSQL is for development and the demo only)"
            )
        return self

    @model_validator(mode="after")
    def _standby_of_a_primary(self) -> Settings:
        if self.database.read_url and not self.database_url:
            raise ValueError(
                "database.read_url needs database_url: a standby follows a configured primary, "
                "never the embedded development server"
            )
        return self

    @model_validator(mode="after")
    def _metrics_mtls(self) -> Settings:
        if self.metrics.client_names and not self.tls.client_ca:
            raise ValueError(
                "metrics.client_names needs tls.client_ca (and tls.client_cert optional or required): "
                "only a verified client certificate has names"
            )
        return self

    @field_validator("database_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError("must start with postgresql://")
        if v is not None and v.startswith("postgresql+psycopg://"):
            v = "postgresql://" + v.removeprefix("postgresql+psycopg://")
        return v


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build settings from (lowest first) a YAML file, the environment, overrides.

    Raises :class:`ConfigError` naming the file and the offending key.
    """
    config_file = config_file or os.environ.get("GPUFLEET_CONFIG")
    file_values: dict[str, Any] = {}
    where = "environment"
    if config_file:
        path = Path(config_file)
        where = str(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"{path}: no such config file") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of settings")
        file_values = loaded
    try:
        env_settings = Settings(**overrides)
        if not file_values:
            return env_settings
        # Environment and explicit overrides win over the file.
        explicit = env_settings.model_dump(exclude_unset=True)
        merged = _deep_merge(file_values, explicit)
        return Settings.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_describe(e, where)) from e


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _describe(e: ValidationError, where: str) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return f"invalid settings ({where}): " + "; ".join(parts)
