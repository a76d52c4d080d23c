"""initial schema: samples, rollups, runs, sites, incidents, tokens

The TimescaleDB layout (hypertables, compression, continuous aggregates) is
built when the server can load the extension; otherwise the plain-PostgreSQL
layout (BRIN time indexes, collector-maintained stats tables).  Both expose
the same relation names and columns, so every query runs on either.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 12:42:32.865330
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.LargeBinary(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("(role = 'node') = (node IS NOT NULL)", name="agent_tokens_node_role"),
        sa.CheckConstraint("role IN ('node', 'finance', 'sre', 'admin')", name="agent_tokens_role"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "carbon_intensity",
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("g_co2e_per_kwh", sa.Double(), nullable=False),
        sa.CheckConstraint("g_co2e_per_kwh >= 0", name="carbon_nonneg"),
        sa.PrimaryKeyConstraint("region", "time"),
    )
    op.create_table(
        "gpu_energy_1h",
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("energy_j", sa.Double(), nullable=False),
        sa.Column("covered_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu", "bucket"),
    )
    op.create_index("gpu_energy_1h_bucket_idx", "gpu_energy_1h", ["bucket"], unique=False)
    op.create_table(
        "gpu_energy_1m",
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("energy_j", sa.Double(), nullable=False),
        sa.Column("covered_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu", "bucket"),
    )
    op.create_index("gpu_energy_1m_bucket_idx", "gpu_energy_1m", ["bucket"], unique=False)
    op.create_table(
        "gpu_samples",
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=True, comment="GPU UUID"),
        sa.Column("util_pct", sa.REAL(), nullable=True, comment="GPU-Util: share of time a kernel ran [%]"),
        sa.Column("sm_active", sa.REAL(), nullable=True, comment="SM activity 0-1 [ratio]"),
        sa.Column("tensor_active", sa.REAL(), nullable=True, comment="tensor pipe activity 0-1 [ratio]"),
        sa.Column("dram_active", sa.REAL(), nullable=True, comment="DRAM activity 0-1 [ratio]"),
        sa.Column("mem_used_mib", sa.REAL(), nullable=True, comment="framebuffer used [MiB]"),
        sa.Column("mem_total_mib", sa.REAL(), nullable=True, comment="framebuffer total [MiB]"),
        sa.Column("power_w", sa.REAL(), nullable=True, comment="board power draw [W]"),
        sa.Column(
            "energy_mj", sa.BigInteger(), nullable=True, comment="cumulative energy counter; may reset [mJ]"
        ),
        sa.Column("power_limit_w", sa.REAL(), nullable=True, comment="enforced power limit [W]"),
        sa.Column("sm_clock_mhz", sa.Integer(), nullable=True, comment="SM clock [MHz]"),
        sa.Column("sm_clock_max_mhz", sa.Integer(), nullable=True, comment="maximum SM clock [MHz]"),
        sa.Column("mem_clock_mhz", sa.Integer(), nullable=True, comment="memory clock [MHz]"),
        sa.Column("temp_c", sa.SmallInteger(), nullable=True, comment="GPU temperature [degC]"),
        sa.Column("mem_temp_c", sa.SmallInteger(), nullable=True, comment="memory temperature [degC]"),
        sa.Column(
            "throttle_reasons", sa.BigInteger(), nullable=True, comment="NVML clocks-event reasons [bitmask]"
        ),
        sa.Column("pcie_tx_bytes_s", sa.REAL(), nullable=True, comment="PCIe transmit rate [B/s]"),
        sa.Column("pcie_rx_bytes_s", sa.REAL(), nullable=True, comment="PCIe receive rate [B/s]"),
        sa.Column("pcie_gen", sa.SmallInteger(), nullable=True, comment="current PCIe link generation"),
        sa.Column("pcie_gen_max", sa.SmallInteger(), nullable=True, comment="maximum PCIe link generation"),
        sa.Column("pcie_width", sa.SmallInteger(), nullable=True, comment="current PCIe link width [lanes]"),
        sa.Column(
            "pcie_width_max", sa.SmallInteger(), nullable=True, comment="maximum PCIe link width [lanes]"
        ),
        sa.Column("nvlink_tx_bytes_s", sa.REAL(), nullable=True, comment="NVLink transmit rate [B/s]"),
        sa.Column("nvlink_rx_bytes_s", sa.REAL(), nullable=True, comment="NVLink receive rate [B/s]"),
        sa.Column(
            "ecc_dbe",
            sa.BigInteger(),
            nullable=True,
            comment="volatile double-bit ECC errors, cumulative [count]",
        ),
        sa.Column(
            "xid", sa.Integer(), nullable=True, comment="last XID error in the interval, 0 if none [code]"
        ),
        sa.Column(
            "mig_instance",
            sa.SmallInteger(),
            nullable=True,
            comment="MIG GPU-instance id; NULL for a whole physical GPU",
        ),
        sa.Column("run_id", sa.Text(), nullable=True, comment="run the GPU worked for, from attribution"),
    )
    op.create_index("gpu_samples_node_gpu_time_idx", "gpu_samples", ["node", "gpu", "time"], unique=False)
    op.create_table(
        "gpufleet_meta",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "host_energy_1h",
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("energy_j", sa.Double(), nullable=False),
        sa.Column("covered_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "bucket"),
    )
    op.create_table(
        "host_energy_1m",
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("energy_j", sa.Double(), nullable=False),
        sa.Column("covered_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("node", "bucket"),
    )
    op.create_table(
        "host_samples",
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("cpu_user_pct", sa.REAL(), nullable=True, comment="all-CPU user time, as mpstat %usr [%]"),
        sa.Column(
            "cpu_system_pct", sa.REAL(), nullable=True, comment="all-CPU system time, as mpstat %sys [%]"
        ),
        sa.Column(
            "cpu_iowait_pct", sa.REAL(), nullable=True, comment="all-CPU iowait, as mpstat %iowait [%]"
        ),
        sa.Column("cpu_idle_pct", sa.REAL(), nullable=True, comment="all-CPU idle, as mpstat %idle [%]"),
        sa.Column("cpu_count", sa.SmallInteger(), nullable=True, comment="logical CPUs"),
        sa.Column(
            "disk_read_bytes_s", sa.REAL(), nullable=True, comment="read rate summed over block devices [B/s]"
        ),
        sa.Column(
            "disk_write_bytes_s",
            sa.REAL(),
            nullable=True,
            comment="write rate summed over block devices [B/s]",
        ),
        sa.Column(
            "disk_util_pct", sa.REAL(), nullable=True, comment="busiest device, as iostat -x %util [%]"
        ),
        sa.Column(
            "disk_await_ms", sa.REAL(), nullable=True, comment="busiest device, as iostat -x await [ms]"
        ),
        sa.Column(
            "net_rx_bytes_s", sa.REAL(), nullable=True, comment="receive rate over physical interfaces [B/s]"
        ),
        sa.Column(
            "net_tx_bytes_s", sa.REAL(), nullable=True, comment="transmit rate over physical interfaces [B/s]"
        ),
        sa.Column(
            "host_power_w",
            sa.REAL(),
            nullable=True,
            comment="whole-host power excluding GPUs (BMC/IPMI/RAPL) [W]",
        ),
    )
    op.create_index("host_samples_node_time_idx", "host_samples", ["node", "time"], unique=False)
    op.create_table(
        "incidents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("scope_key", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("gpu", sa.SmallInteger(), nullable=True),
        sa.Column("cause", sa.Text(), nullable=True),
        sa.Column("severity", sa.Text(), server_default=sa.text("'warning'"), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'open'"), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_active", sa.DateTime(timezone=True), nullable=True),
        sa.Column("hold_s", sa.Double(), nullable=True),
        sa.Column(
            "evidence",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint("state IN ('open', 'resolved')", name="incidents_state"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "incidents_open_scope_uq",
        "incidents",
        ["scope_key"],
        unique=True,
        postgresql_where=sa.text("state = 'open'"),
    )
    op.create_index("incidents_run_idx", "incidents", ["run_id"], unique=False)
    op.create_index("incidents_state_kind_idx", "incidents", ["state", "kind"], unique=False)
    op.create_table(
        "ingest_batches",
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("gpu_rows", sa.Integer(), nullable=False),
        sa.Column("host_rows", sa.Integer(), nullable=False),
        sa.Column("t_min", sa.DateTime(timezone=True), nullable=True),
        sa.Column("t_max", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    op.create_index("ingest_batches_received_idx", "ingest_batches", ["received_at"], unique=False)
    op.create_table(
        "rollup_queue",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("t_min", sa.DateTime(timezone=True), nullable=False),
        sa.Column("t_max", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "sites",
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("pue", sa.Double(), server_default=sa.text("1.0"), nullable=False),
        sa.Column("price_per_kwh", sa.Double(), server_default=sa.text("0"), nullable=False),
        sa.Column("gpu_hour_price", sa.Double(), server_default=sa.text("0"), nullable=False),
        sa.Column("currency", sa.Text(), server_default=sa.text("'USD'"), nullable=False),
        sa.Column("carbon_region", sa.Text(), nullable=True),
        sa.Column("carbon_g_per_kwh", sa.Double(), nullable=True),
        sa.CheckConstraint("price_per_kwh >= 0 AND gpu_hour_price >= 0", name="sites_prices_nonneg"),
        sa.CheckConstraint("pue >= 1.0", name="sites_pue_ge_1"),
        sa.PrimaryKeyConstraint("site"),
    )
    op.create_table(
        "nodes",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("site", sa.Text(), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gpu_count", sa.SmallInteger(), nullable=True),
        sa.Column(
            "facts",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("facts_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rejected_skew", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(["site"], ["sites.site"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("node"),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("site", sa.Text(), nullable=True),
        sa.Column("team", sa.Text(), nullable=True),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=True),
        sa.Column("params", sa.BigInteger(), nullable=True),
        sa.Column(
            "labels",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint('"end" IS NULL OR "end" >= start', name="runs_end_after_start"),
        sa.ForeignKeyConstraint(["site"], ["sites.site"], ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_index("runs_start_idx", "runs", ["start"], unique=False)
    op.create_table(
        "site_prices",
        sa.Column("site", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("price_per_kwh", sa.Double(), nullable=False),
        sa.CheckConstraint("price_per_kwh >= 0", name="site_prices_nonneg"),
        sa.ForeignKeyConstraint(["site"], ["sites.site"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("site", "time"),
    )
    op.create_table(
        "run_allocations",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "node", "gpu"),
    )
    op.create_index("run_allocations_node_gpu_idx", "run_allocations", ["node", "gpu"], unique=False)
    op.create_table(
        "run_progress",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.Double(), nullable=True),
        sa.Column("samples", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "time"),
    )

    _backend_layout()


def downgrade() -> None:
    _drop_backend_layout()
    op.drop_table("run_progress")
    op.drop_index("run_allocations_node_gpu_idx", table_name="run_allocations")
    op.drop_table("run_allocations")
    op.drop_table("site_prices")
    op.drop_index("runs_start_idx", table_name="runs")
    op.drop_table("runs")
    op.drop_table("nodes")
    op.drop_table("sites")
    op.drop_table("rollup_queue")
    op.drop_index("ingest_batches_received_idx", table_name="ingest_batches")
    op.drop_table("ingest_batches")
    op.drop_index("incidents_state_kind_idx", table_name="incidents")
    op.drop_index("incidents_run_idx", table_name="incidents")
    op.drop_index(
        "incidents_open_scope_uq", table_name="incidents", postgresql_where=sa.text("state = 'open'")
    )
    op.drop_table("incidents")
    op.drop_index("host_samples_node_time_idx", table_name="host_samples")
    op.drop_table("host_samples")
    op.drop_table("host_energy_1m")
    op.drop_table("host_energy_1h")
    op.drop_table("gpufleet_meta")
    op.drop_index("gpu_samples_node_gpu_time_idx", table_name="gpu_samples")
    op.drop_table("gpu_samples")
    op.drop_index("gpu_energy_1m_bucket_idx", table_name="gpu_energy_1m")
    op.drop_table("gpu_energy_1m")
    op.drop_index("gpu_energy_1h_bucket_idx", table_name="gpu_energy_1h")
    op.drop_table("gpu_energy_1h")
    op.drop_table("carbon_intensity")
    op.drop_table("agent_tokens")


HYPERTABLES = {
    # table: (time column, chunk interval)
    "gpu_samples": ("time", "1 day"),
    "host_samples": ("time", "1 day"),
    "gpu_energy_1m": ("bucket", "7 days"),
    "host_energy_1m": ("bucket", "7 days"),
    "gpu_energy_1h": ("bucket", "30 days"),
    "host_energy_1h": ("bucket", "30 days"),
}


def _backend_layout() -> None:
    timescale = bool(op.get_context().config.attributes.get("timescale", False))
    if timescale:
        _timescale_layout()
    else:
        _plain_layout()
    backend = "timescaledb" if timescale else "postgresql"
    op.execute(
        sa.text(
            "INSERT INTO gpufleet_meta (key, value) VALUES ('backend', to_jsonb(CAST(:b AS text)))"
        ).bindparams(b=backend)
    )


def _timescale_layout() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS timescaledb")
    for table, (col, chunk) in HYPERTABLES.items():
        op.execute(
            f"SELECT create_hypertable('{table}', '{col}', chunk_time_interval => INTERVAL '{chunk}', "
            "create_default_indexes => false)"
        )
    op.execute("CREATE INDEX gpu_samples_time_idx ON gpu_samples (time DESC)")
    op.execute("CREATE INDEX host_samples_time_idx ON host_samples (time DESC)")
    op.execute(
        "ALTER TABLE gpu_samples SET (timescaledb.compress, "
        "timescaledb.compress_segmentby = 'node, gpu', timescaledb.compress_orderby = 'time DESC')"
    )
    op.execute(
        "ALTER TABLE host_samples SET (timescaledb.compress, "
        "timescaledb.compress_segmentby = 'node', timescaledb.compress_orderby = 'time DESC')"
    )
    # Continuous aggregates cannot be created inside a transaction block.
    with op.get_context().autocommit_block():
        op.execute(sql_files.text("gpu_stats_1m.timescale.v1"))
        op.execute(sql_files.text("host_stats_1m.timescale.v1"))
    for view in ("gpu_stats_1m", "host_stats_1m"):
        op.execute(
            f"SELECT add_continuous_aggregate_policy('{view}', start_offset => INTERVAL '3 hours', "
            "end_offset => INTERVAL '1 minute', schedule_interval => INTERVAL '1 minute')"
        )


def _plain_layout() -> None:
    # Samples arrive roughly in time order, so BRIN indexes stay tiny and
    # serve time-range scans; (node, gpu, time) btrees serve per-GPU reads.
    op.execute(
        "CREATE INDEX gpu_samples_time_brin ON gpu_samples USING brin (time) WITH (pages_per_range = 32)"
    )
    op.execute(
        "CREATE INDEX host_samples_time_brin ON host_samples USING brin (time) WITH (pages_per_range = 32)"
    )
    op.execute(sql_files.text("gpu_stats_1m.v1"))
    op.execute("CREATE INDEX gpu_stats_1m_bucket_idx ON gpu_stats_1m (bucket)")
    op.execute(sql_files.text("host_stats_1m.v1"))
    op.execute("CREATE INDEX host_stats_1m_bucket_idx ON host_stats_1m (bucket)")


def _drop_backend_layout() -> None:
    bind = op.get_bind()
    kinds = dict(
        bind.execute(
            sa.text(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relname IN ('gpu_stats_1m', 'host_stats_1m')"
            )
        ).all()
    )
    for name, kind in kinds.items():
        if kind == "v":  # a continuous aggregate is a view over its materialization
            with op.get_context().autocommit_block():
                op.execute(f"DROP MATERIALIZED VIEW IF EXISTS {name} CASCADE")
        else:
            op.execute(f"DROP TABLE IF EXISTS {name}")
