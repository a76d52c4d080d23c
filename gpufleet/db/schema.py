"""The gpufleet schema as SQLAlchemy Core metadata.

This is the model the migrations must produce (a test compares them with
Alembic's autogenerate).  Queries are written in SQL against these names;
SQLAlchemy is used for the schema only, not as an ORM on the hot paths.
"""

from __future__ import annotations

from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.types import TypeEngine

from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS, Field
from gpufleet.db import activity_sql

metadata = MetaData()

_TYPES: dict[str, type[TypeEngine]] = {
    "real": REAL,
    "double": Double,
    "smallint": SmallInteger,
    "integer": Integer,
    "bigint": BigInteger,
    "text": Text,
}


def _tz(name: str, nullable: bool = False, **kw: object) -> Column:
    return Column(name, DateTime(timezone=True), nullable=nullable, **kw)  # type: ignore[arg-type]


def _catalog_columns(fields: tuple[Field, ...]) -> list[Column]:
    return [
        Column(f.name, _TYPES[f.kind](), nullable=True, comment=f"{f.doc} [{f.unit}]" if f.unit else f.doc)
        for f in fields
    ]


sites = Table(
    "sites",
    metadata,
    Column("site", Text, primary_key=True),
    #: Money of every price of the site (ISO 4217); prices are never converted.
    Column("currency", Text, nullable=False, server_default=text("'USD'")),
)

#: Dated site settings (migration 0004): each value holds from ``valid_from`` (``-infinity``: from the
#: beginning) until the next of the same (site, setting, gpu_model).  ``gpu_model`` is non-empty only for
#: a GPU-hour price of one GPU model (NULL ``num`` there: the site's default price applies again).
site_settings = Table(
    "site_settings",
    metadata,
    Column("site", Text, ForeignKey("sites.site", ondelete="CASCADE"), nullable=False),
    Column("setting", Text, nullable=False),
    Column("gpu_model", Text, nullable=False, server_default=text("''")),
    _tz("valid_from"),
    Column("num", Double, nullable=True),
    Column("txt", Text, nullable=True),
    _tz("set_at", server_default=text("now()")),
    PrimaryKeyConstraint("site", "setting", "gpu_model", "valid_from", name="site_settings_pkey"),
    CheckConstraint(
        "setting IN ('pue', 'price_per_kwh', 'gpu_hour_price', 'carbon_region', 'carbon_g_per_kwh', "
        "'currency')",
        name="site_settings_setting",
    ),
    CheckConstraint("gpu_model = '' OR setting = 'gpu_hour_price'", name="site_settings_model_price"),
)

carbon_intensity = Table(
    "carbon_intensity",
    metadata,
    Column("region", Text, nullable=False),
    _tz("time"),
    Column("g_co2e_per_kwh", Double, nullable=False),
    PrimaryKeyConstraint("region", "time"),
    CheckConstraint("g_co2e_per_kwh >= 0", name="carbon_nonneg"),
)

#: What a carbon series is (migration 0014): ``average`` (the grid mix's intensity, as Electricity Maps and
#: most inventories give it) or ``marginal`` (the generator that answers a change in demand, as WattTime's
#: MOER), a readable name for reports, and where the series came from.
carbon_regions = Table(
    "carbon_regions",
    metadata,
    Column("region", Text, primary_key=True),
    Column("method", Text, nullable=False, server_default=text("'average'")),
    Column("name", Text, nullable=True),
    Column("provider", Text, nullable=True),
    _tz("updated_at", server_default=text("now()")),
    CheckConstraint("method IN ('average', 'marginal')", name="carbon_regions_method"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("node", Text, primary_key=True),
    Column("site", Text, ForeignKey("sites.site", ondelete="SET NULL"), nullable=True),
    _tz("first_seen", nullable=True),
    _tz("last_seen", nullable=True),
    Column("gpu_count", SmallInteger, nullable=True),
    #: The agent's node facts (GPU model, driver, PCIe maxima, governor, cpu quota).
    Column("facts", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _tz("facts_time", nullable=True),
    #: Samples refused for being outside the clock-skew grace window.
    Column("rejected_skew", BigInteger, nullable=False, server_default=text("0")),
)

#: The node facts that price or classify, one row per change, valid from when they were received
#: (gpufleet.store.fact_history; migration 0013).
node_facts_history = Table(
    "node_facts_history",
    metadata,
    Column("node", Text, ForeignKey("nodes.node", ondelete="CASCADE"), nullable=False),
    _tz("valid_from"),
    Column("facts", JSONB, nullable=False),
    PrimaryKeyConstraint("node", "valid_from"),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", Text, primary_key=True),
    Column("name", Text, nullable=True),
    Column("site", Text, ForeignKey("sites.site", ondelete="RESTRICT"), nullable=True),
    Column("team", Text, nullable=True),
    _tz("start"),
    _tz("end", nullable=True),
    #: Model parameters, for MFU.
    Column("params", BigInteger, nullable=True),
    Column("labels", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _tz("created_at", server_default=text("now()")),
    #: "registered" (API, CLI, scheduler hook, replay) or "inferred" (from the
    #: run_id agents attribute to GPU samples; gpufleet.store.inferred).
    Column("source", Text, nullable=False, server_default=text("'registered'")),
    CheckConstraint('"end" IS NULL OR "end" >= start', name="runs_end_after_start"),
    CheckConstraint("source IN ('registered', 'inferred')", name="runs_source"),
)
Index("runs_start_idx", runs.c.start)
# The leader's pricing pass selects the runs that ended since its last (migration 0025).
Index("runs_end_idx", runs.c.end)

run_allocations = Table(
    "run_allocations",
    metadata,
    Column("run_id", Text, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    #: Declared sharing (0004): exclusive, time_slice, mps or mig; ``share`` of the GPU's energy and hours.
    Column("sharing", Text, nullable=False, server_default=text("'exclusive'")),
    Column("share", Double, nullable=False, server_default=text("1")),
    Column("mig_profile", Text, nullable=True),
    Column("mig_instance", SmallInteger, nullable=True),
    PrimaryKeyConstraint("run_id", "node", "gpu"),
    CheckConstraint("sharing IN ('exclusive', 'time_slice', 'mps', 'mig')", name="run_allocations_sharing"),
)
Index("run_allocations_node_gpu_idx", run_allocations.c.node, run_allocations.c.gpu)

#: Progress a run reports (tokens or samples processed), cumulative.
run_progress = Table(
    "run_progress",
    metadata,
    Column("run_id", Text, ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    _tz("time"),
    Column("tokens", Double, nullable=True),
    Column("samples", Double, nullable=True),
    Column("steps", Double, nullable=True),
    PrimaryKeyConstraint("run_id", "time"),
)

#: Where samples showed a run on a GPU (``gpu_samples.run_id``): first and last
#: sample time per (run, node, GPU), kept by ingest; the leader registers
#: inferred runs from it (gpufleet.store.inferred), ``status`` says with what outcome.
run_sightings = Table(
    "run_sightings",
    metadata,
    Column("run_id", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    _tz("first_seen"),
    _tz("last_seen"),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    #: Why a sighting was not allocated (the conflicting run, the bad run id).
    Column("detail", Text, nullable=True),
    PrimaryKeyConstraint("run_id", "node", "gpu"),
    CheckConstraint(
        "status IN ('pending', 'allocated', 'moved', 'explicit', 'conflict', 'yielded', 'invalid', "
        "'refused')",
        name="run_sightings_status",
    ),
)
Index("run_sightings_status_idx", run_sightings.c.status)
#: The running inferred runs, which the leader checks every sweep interval.
Index(
    "runs_inferred_open_idx", runs.c.run_id, postgresql_where=text("source = 'inferred' AND \"end\" IS NULL")
)

incidents = Table(
    "incidents",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("kind", Text, nullable=False),
    #: Stable identity of what the incident is about: kind + run/node/gpu.
    Column("scope_key", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("node", Text, nullable=True),
    Column("gpu", SmallInteger, nullable=True),
    Column("cause", Text, nullable=True),
    Column("severity", Text, nullable=False, server_default=text("'warning'")),
    Column("state", Text, nullable=False, server_default=text("'open'")),
    _tz("start"),
    _tz("end", nullable=True),
    _tz("last_seen"),
    #: Last time the condition itself was active (may precede last_seen).
    _tz("last_active", nullable=True),
    #: Hold-off the detector asked for before resolving, seconds.
    Column("hold_s", Double, nullable=True),
    Column("evidence", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    #: What the quarantine hooks did about it: ``[{"action", "target", "time", "ok", "detail", ...}]``.
    Column("actions", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    CheckConstraint("state IN ('open', 'resolved')", name="incidents_state"),
)
# At most one open incident per (kind, scope): the lifecycle relies on it.
Index("incidents_open_scope_uq", incidents.c.scope_key, unique=True, postgresql_where=text("state = 'open'"))
Index("incidents_run_idx", incidents.c.run_id)
Index("incidents_state_kind_idx", incidents.c.state, incidents.c.kind)
# ... and the incidents that closed since its last (migration 0025).
Index("incidents_end_idx", incidents.c.end)

#: A power cap for every GPU of a run (migration 0016): the agents on the run's nodes apply it through
#: NVML while the run holds the GPUs and the plan is active, and restore each GPU's limit after
#: (gpufleet.advisor.plans, gpufleet.agent.sources.nvml_power_cap).  ``revision`` grows at each change.
power_cap_plans = Table(
    "power_cap_plans",
    metadata,
    Column("run_id", Text, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("limit_w", REAL, nullable=False),
    Column("revision", BigInteger, nullable=False, server_default=text("1")),
    Column("state", Text, nullable=False, server_default=text("'active'")),
    Column("reason", Text, nullable=True),
    Column("created_by", Text, nullable=True),
    _tz("created_at", server_default=text("now()")),
    _tz("updated_at", server_default=text("now()")),
    CheckConstraint("limit_w > 0", name="power_cap_plans_limit"),
    CheckConstraint("state IN ('active', 'withdrawn')", name="power_cap_plans_state"),
)

#: Nodes the quarantine hooks hold out of scheduling (migration 0017), and why
#: (gpufleet.collector.quarantine): released after they pass again for the hold-down.
node_quarantine = Table(
    "node_quarantine",
    metadata,
    Column("node", Text, primary_key=True),
    Column("state", Text, nullable=False),
    Column("backend", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("reason", Text, nullable=True),
    #: What holds it: ``[{"source": "incident"|"check", "kind", "id"|"subject", ...}]``.
    Column("triggers", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    _tz("since"),
    #: Since when no trigger holds (the hold-down runs from here); NULL while one does.
    _tz("passing_since", nullable=True),
    _tz("updated_at", server_default=text("now()")),
    CheckConstraint("state IN ('quarantined', 'released')", name="node_quarantine_state"),
)

#: Every quarantine action taken, would have been taken (dry run) or failed (migration 0017).
quarantine_log = Table(
    "quarantine_log",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("node", Text, nullable=False),
    _tz("time"),
    Column("action", Text, nullable=False),
    Column("result", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("reason", Text, nullable=True),
    Column("triggers", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("detail", Text, nullable=True),
    Column("call", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
)
Index("quarantine_log_node_time_idx", quarantine_log.c.node, quarantine_log.c.time)

agent_tokens = Table(
    "agent_tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    #: SHA-256 of the secret; the secret itself is never stored.
    Column("token_hash", LargeBinary, nullable=False, unique=True),
    Column("role", Text, nullable=False),
    #: For role "node": the only node name this token may write; for "progress": the only node whose
    #: runs it may report progress of (none: any run).
    Column("node", Text, nullable=True),
    _tz("created_at", server_default=text("now()")),
    _tz("revoked_at", nullable=True),
    CheckConstraint(
        "role IN ('node', 'finance', 'sre', 'admin', 'progress', 'remote_write')", name="agent_tokens_role"
    ),
    CheckConstraint(
        "(role <> 'node' OR node IS NOT NULL) AND (node IS NULL OR role IN ('node', 'progress'))",
        name="agent_tokens_node_role",
    ),
)

#: What one remote-write request said of one node at one time, until the (node, time) is assembled
#: into rows (gpufleet.collector.remote_write_store): only what is waiting, so a plain table.
remote_write_parts = Table(
    "remote_write_parts",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("node", Text, nullable=False),
    #: The samples' time, milliseconds since the epoch (remote write's own unit).
    Column("t_ms", BigInteger, nullable=False),
    _tz("received_at", server_default=text("clock_timestamp()")),
    Column("gpu_samples", Integer, nullable=False),
    Column("host_samples", Integer, nullable=False),
    #: msgpack (gpufleet.collector.remote_write_pieces)
    Column("body", LargeBinary, nullable=False),
    Index("remote_write_parts_group_idx", "node", "t_ms"),
)

#: The per-run figures the collectors' /metrics serve, as the leader last computed them
#: (gpufleet.collector.run_metrics): one row.
run_metrics_snapshot = Table(
    "run_metrics_snapshot",
    metadata,
    Column("id", SmallInteger, primary_key=True, server_default=text("1")),
    _tz("computed_at"),
    Column("body", JSONB, nullable=False),
    CheckConstraint("id = 1", name="run_metrics_snapshot_one_row"),
)

#: Where each input of a priced piece of GPU-time stands (gpufleet.db.priced_store_sql, migration 0023):
#: a scope (``r:<run>``, ``e:<node>:<day>``, ...) and the id of the transaction that last changed it.
pricing_marks = Table(
    "pricing_marks",
    metadata,
    Column("scope", Text, primary_key=True),
    Column("version", BigInteger, nullable=False),
)

#: Lines of ``gpufleet_incident_accounting`` kept per digest of the pieces priced, with the marks of the
#: inputs they read (gpufleet.accounting.priced_store); valid while every mark is still current.
priced_pieces = Table(
    "priced_pieces",
    metadata,
    Column("digest", LargeBinary, nullable=False),
    Column("line_no", SmallInteger, nullable=False),
    Column("scopes", ARRAY(Text), nullable=False),
    Column("versions", ARRAY(BigInteger), nullable=False),
    Column("nodes", ARRAY(Text), nullable=False),
    Column("gpus", ARRAY(Integer), nullable=False),
    _tz("lo"),
    _tz("hi"),
    _tz("stored_at", server_default=text("now()")),
    Column("line", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("site", Text, nullable=True),
    _tz("part_start", nullable=True),
    _tz("part_end", nullable=True),
    Column("gpu_count", Integer, nullable=True),
    Column("gpu_equivalents", Double, nullable=True),
    Column("gpu_s", Double, nullable=True),
    Column("covered_s", Double, nullable=True),
    Column("gpu_hours", Numeric, nullable=True),
    Column("covered_hours", Numeric, nullable=True),
    Column("coverage", Double, nullable=True),
    Column("gpu_kwh", Numeric, nullable=True),
    Column("host_kwh", Numeric, nullable=True),
    Column("it_kwh", Numeric, nullable=True),
    Column("facility_kwh", Numeric, nullable=True),
    Column("pue", Numeric, nullable=True),
    Column("co2e_kg", Numeric, nullable=True),
    Column("co2e_unknown_kwh", Numeric, nullable=True),
    Column("carbon_source", Text, nullable=True),
    Column("g_co2e_per_kwh", Double, nullable=True),
    Column("price_source", Text, nullable=True),
    Column("price_per_kwh", Double, nullable=True),
    Column("currency", Text, nullable=True),
    Column("minor_units", Integer, nullable=True),
    Column("energy_cost", Numeric, nullable=True),
    Column("compute_cost", Numeric, nullable=True),
    Column("total_cost", Numeric, nullable=True),
    Column("stale", Boolean, nullable=True),
    PrimaryKeyConstraint("digest", "line_no", name="priced_pieces_pkey"),
)

#: What an ended run's incidents claim over its window, kept (gpufleet.accounting.kept_claims, migration
#: 0026): the incident count and each priced key's digest of pieces, valid while its marks are current.
kept_claims = Table(
    "kept_claims",
    metadata,
    Column("digest", LargeBinary, nullable=False),
    Column("run_id", Text, nullable=False),
    _tz("lo"),
    _tz("hi"),
    Column("scopes", ARRAY(Text), nullable=False),
    Column("versions", ARRAY(BigInteger), nullable=False),
    Column("incidents", Integer, nullable=False),
    Column("keys", ARRAY(Text), nullable=False),
    Column("pieces", LargeBinary, nullable=False),
    _tz("stored_at", server_default=text("now()")),
    PrimaryKeyConstraint("digest", name="kept_claims_pkey"),
)

#: An ended run's power-cap points (gpufleet.advisor.kept_points, migration 0028): its stretches at one
#: power limit and the minutes left out, valid while its marks (run, progress, samples' days) are current.
kept_power_points = Table(
    "kept_power_points",
    metadata,
    Column("digest", LargeBinary, nullable=False),
    Column("run_id", Text, nullable=False),
    _tz("lo"),
    _tz("hi"),
    Column("scopes", ARRAY(Text), nullable=False),
    Column("versions", ARRAY(BigInteger), nullable=False),
    Column("points", JSONB, nullable=False),
    Column("excluded", JSONB, nullable=False),
    _tz("stored_at", server_default=text("now()")),
    PrimaryKeyConstraint("digest", name="kept_power_points_pkey"),
)

#: A running run's power-cap minutes of one closed hour (gpufleet.advisor.kept_minutes, migration 0032):
#: valid while the run's mark, the fleet's whole mark and that hour's mark are the ones recorded.
kept_power_minutes = Table(
    "kept_power_minutes",
    metadata,
    Column("digest", LargeBinary, nullable=False),
    _tz("hour"),
    Column("run_id", Text, nullable=False),
    _tz("lo"),
    Column("run_mark", BigInteger, nullable=False),
    Column("whole_mark", BigInteger, nullable=False),
    Column("hour_mark", BigInteger, nullable=False),
    Column("minutes", LargeBinary, nullable=False),
    _tz("stored_at", server_default=text("now()")),
    PrimaryKeyConstraint("digest", "hour", name="kept_power_minutes_pkey"),
)

_FLEET_HOUR_KEY = ("max_gap_s", "source", "gone_after_s", "hour")


def _fleet_hour_key() -> list[Column]:
    return [
        Column("max_gap_s", Double, nullable=False),
        Column("source", Text, nullable=False),
        Column("gone_after_s", Double, nullable=False),
        _tz("hour"),
    ]


#: The fleet's closed hours kept (gpufleet.accounting.fleet_hours, migration 0030): one row an hour and
#: accounting settings, with the marks (``h``, ``h:<hour>``) its lines rest on.
fleet_hours_kept = Table(
    "fleet_hours_kept",
    metadata,
    *_fleet_hour_key(),
    Column("whole_mark", BigInteger, nullable=False),
    Column("hour_mark", BigInteger, nullable=False),
    _tz("stored_at", server_default=text("now()")),
    PrimaryKeyConstraint(*_FLEET_HOUR_KEY, name="fleet_hours_kept_pkey"),
)

#: A kept hour's lines, unrounded (``gpufleet_fleet_parts``'s rows).
fleet_hour_lines = Table(
    "fleet_hour_lines",
    metadata,
    *_fleet_hour_key(),
    Column("line_no", Integer, nullable=False),
    Column("line", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("sk", Text, nullable=False),
    Column("cur", Text, nullable=True),
    Column("gpu_s", Double, nullable=True),
    Column("covered_s", Double, nullable=True),
    Column("gpu_kwh", Double, nullable=True),
    Column("host_kwh", Double, nullable=True),
    Column("facility_kwh", Double, nullable=True),
    Column("co2e_kg", Numeric, nullable=True),
    Column("co2e_unknown_kwh", Double, nullable=True),
    Column("energy_cost", Numeric, nullable=True),
    Column("compute_cost", Numeric, nullable=True),
    Column("stale", Boolean, nullable=False),
    Column("has_energy", Boolean, nullable=False),
    Column("price_lo", Double, nullable=True),
    Column("price_hi", Double, nullable=True),
    Column("g_lo", Double, nullable=True),
    Column("g_hi", Double, nullable=True),
    Column("csrc_lo", Text, nullable=True),
    Column("csrc_hi", Text, nullable=True),
    PrimaryKeyConstraint(*_FLEET_HOUR_KEY, "line_no", name="fleet_hour_lines_pkey"),
    ForeignKeyConstraint(
        list(_FLEET_HOUR_KEY),
        [f"fleet_hours_kept.{c}" for c in _FLEET_HOUR_KEY],
        ondelete="CASCADE",
        name="fleet_hour_lines_hour_fkey",
    ),
)

#: Every acknowledged (node, batch id), for idempotent retries.  Keyed per
#: node: another node's batch with the same id is not a duplicate of this one's.
ingest_batches = Table(
    "ingest_batches",
    metadata,
    Column("batch_id", Text, nullable=False),
    Column("node", Text, nullable=False),
    _tz("received_at", server_default=text("now()")),
    Column("gpu_rows", Integer, nullable=False),
    Column("host_rows", Integer, nullable=False),
    _tz("t_min", nullable=True),
    _tz("t_max", nullable=True),
    PrimaryKeyConstraint("node", "batch_id", name="ingest_batches_pkey"),
)
Index("ingest_batches_received_idx", ingest_batches.c.received_at)

#: Time ranges whose rollups must be recomputed; written in the ingest
#: transaction, consumed by the rollup worker in its own.
rollup_queue = Table(
    "rollup_queue",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("node", Text, nullable=False),
    _tz("t_min"),
    _tz("t_max"),
)

gpu_samples = Table(
    "gpu_samples",
    metadata,
    _tz("time"),
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    *_catalog_columns(GPU_FIELDS),
)
Index("gpu_samples_node_gpu_time_idx", gpu_samples.c.node, gpu_samples.c.gpu, gpu_samples.c.time)

host_samples = Table(
    "host_samples",
    metadata,
    _tz("time"),
    Column("node", Text, nullable=False),
    *_catalog_columns(HOST_FIELDS),
)
Index("host_samples_node_time_idx", host_samples.c.node, host_samples.c.time)

#: Exact per-minute energy per GPU, by the accounting definition (intervals
#: spread evenly over the minutes they span).  Needs the previous sample of
#: each GPU (a window function), which continuous aggregates cannot express,
#: so the collector maintains it on both backends.
gpu_energy_1m = Table(
    "gpu_energy_1m",
    metadata,
    _tz("bucket"),
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("covered_s", Double, nullable=False),
    PrimaryKeyConstraint("node", "gpu", "bucket"),
)
Index("gpu_energy_1m_bucket_idx", gpu_energy_1m.c.bucket)

gpu_energy_1h = Table(
    "gpu_energy_1h",
    metadata,
    _tz("bucket"),
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("covered_s", Double, nullable=False),
    PrimaryKeyConstraint("node", "gpu", "bucket"),
)
Index("gpu_energy_1h_bucket_idx", gpu_energy_1h.c.bucket)


def _node_activity(name: str) -> Table:
    """Per node and minute (or hour): GPU-minutes, busy GPU-minutes, summed samples and power
    (gpufleet.db.activity_sql, migration 0029); the fleet board's series read these, not one row per GPU."""
    cols = [Column(c, Integer if t == "integer" else Double, nullable=False) for c, t in activity_sql.COLUMNS]
    table = Table(
        name,
        metadata,
        _tz("bucket"),
        Column("node", Text, nullable=False),
        *cols,
        PrimaryKeyConstraint("node", "bucket"),
    )
    Index(f"{name}_bucket_idx", table.c.bucket)
    return table


node_activity_1m = _node_activity("node_activity_1m")
node_activity_1h = _node_activity("node_activity_1h")

#: Counter intervals longer than the gap rule (accounting.max_gap_s), one row each instead of one
#: per minute they cover (collector.rollup); rollup-based accounting adds their share (migration 0009).
gpu_energy_spans = Table(
    "gpu_energy_spans",
    metadata,
    Column("node", Text, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    _tz("t0"),
    _tz("t1"),
    Column("energy_j", Double, nullable=False),
    CheckConstraint("t1 > t0", name="gpu_energy_spans_order"),
    PrimaryKeyConstraint("node", "gpu", "t0"),
)
Index("gpu_energy_spans_t1_idx", gpu_energy_spans.c.node, gpu_energy_spans.c.gpu, gpu_energy_spans.c.t1)

#: The detector window of each sweep shard, written by its owner in time segments so a new owner
#: does not re-read the window's raw samples (collector.window_snapshot, migration 0010).
sweep_snapshots = Table(
    "sweep_snapshots",
    metadata,
    Column("shards", Integer, nullable=False),
    Column("shard", Integer, nullable=False),
    Column("seg", BigInteger, nullable=False),
    Column("blob", LargeBinary, nullable=False),
    PrimaryKeyConstraint("shards", "shard", "seg"),
)
sweep_snapshot_state = Table(
    "sweep_snapshot_state",
    metadata,
    Column("shards", Integer, nullable=False),
    Column("shard", Integer, nullable=False),
    _tz("watermark"),
    Column("upto", Double, nullable=False),
    Column("since", Double, nullable=False),
    Column("seen", LargeBinary, nullable=False),
    _tz("written_at", server_default=text("now()")),
    PrimaryKeyConstraint("shards", "shard"),
)

host_energy_1m = Table(
    "host_energy_1m",
    metadata,
    _tz("bucket"),
    Column("node", Text, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("covered_s", Double, nullable=False),
    PrimaryKeyConstraint("node", "bucket"),
)

host_energy_1h = Table(
    "host_energy_1h",
    metadata,
    _tz("bucket"),
    Column("node", Text, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("covered_s", Double, nullable=False),
    PrimaryKeyConstraint("node", "bucket"),
)

#: Schema facts the code reads at start-up (backend, policies applied).
gpufleet_meta = Table(
    "gpufleet_meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", JSONB, nullable=False),
)

# gpu_stats_1m / host_stats_1m are continuous aggregates on TimescaleDB and
# collector-maintained tables on plain PostgreSQL; both have the columns in
# ``gpufleet.db.rollups.GPU_STATS_COLUMNS``.  They are created in the
# migration per backend and are deliberately not in this metadata.
STATS_RELATIONS = ("gpu_stats_1m", "host_stats_1m")

#: Indexes the migration creates per backend, outside this metadata.
BACKEND_INDEXES = frozenset(
    {
        "gpu_samples_time_brin",
        "host_samples_time_brin",
        "gpu_samples_time_idx",
        "host_samples_time_idx",
    }
)
