"""runs found from attribution, and the dcgm-exporter counters

* ``runs.source``: ``registered`` (API, CLI, Slurm hook, replay bundle) or
  ``inferred`` (registered by the collector from the ``run_id`` agents put on
  GPU samples: Kubernetes pods, a job's environment, a job file).  Existing
  runs were all registered.
* ``run_sightings``: per (run, node, GPU), when samples first and last showed
  that run on that GPU, written in the ingest transaction; the collector's
  leader registers inferred runs and their allocations from it and ends them
  after a grace period without a sighting.  ``status`` records what became of
  each sighting (``pending`` until the leader has looked at it, ``moved`` when
  an allocated one saw newer samples); a partial index finds the running
  inferred runs.
* ``run_progress.steps``: optimizer steps, cumulative, beside tokens and samples.
* new ``gpu_samples`` columns from the catalog (graphics-engine activity,
  memory-copy utilisation, NVLink throughput, ECC, row-remap and PCIe replay
  counters), appended after ``run_id``: nullable and without a default, which
  TimescaleDB 2.x adds to a compressed hypertable as it does to a plain table,
  so both layouts take the same statements.

Revision ID: 0005
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (column, type, comment) as gpufleet.catalog declares them at this revision.
NEW_GPU_COLUMNS: tuple[tuple[str, sa.types.TypeEngine, str], ...] = (
    ("gr_engine_active", sa.REAL(), "graphics/compute engine activity 0-1 [ratio]"),
    ("mem_copy_util_pct", sa.REAL(), "memory copy utilisation (framebuffer interface busy) [%]"),
    ("nvlink_bandwidth_mb_s", sa.REAL(), "NVLink throughput over all links, as DCGM reports it [MB/s]"),
    ("ecc_sbe_vol", sa.BigInteger(), "volatile single-bit ECC errors, cumulative [count]"),
    ("ecc_sbe_agg", sa.BigInteger(), "aggregate (persistent) single-bit ECC errors, cumulative [count]"),
    ("ecc_dbe_agg", sa.BigInteger(), "aggregate (persistent) double-bit ECC errors, cumulative [count]"),
    ("remapped_rows_correctable", sa.BigInteger(), "memory rows remapped for correctable errors [count]"),
    ("remapped_rows_uncorrectable", sa.BigInteger(), "memory rows remapped for uncorrectable errors [count]"),
    ("remapped_rows_pending", sa.SmallInteger(), "1 while a row remap waits for a GPU reset [flag]"),
    ("remapped_rows_failed", sa.SmallInteger(), "1 when a row remap has failed [flag]"),
    ("pcie_replay_count", sa.BigInteger(), "PCIe replays (link-level retries), cumulative [count]"),
)


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("source", sa.Text(), server_default=sa.text("'registered'"), nullable=False)
    )
    op.create_check_constraint("runs_source", "runs", "source IN ('registered', 'inferred')")
    op.add_column("run_progress", sa.Column("steps", sa.Double(), nullable=True))
    op.create_table(
        "run_sightings",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'allocated', 'moved', 'explicit', 'conflict', 'yielded', 'invalid')",
            name="run_sightings_status",
        ),
        sa.PrimaryKeyConstraint("run_id", "node", "gpu"),
    )
    op.create_index("run_sightings_status_idx", "run_sightings", ["status"], unique=False)
    op.create_index(
        "runs_inferred_open_idx",
        "runs",
        ["run_id"],
        unique=False,
        postgresql_where=sa.text("source = 'inferred' AND \"end\" IS NULL"),
    )
    for name, type_, comment in NEW_GPU_COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, type_, nullable=True, comment=comment))


def downgrade() -> None:
    for name, _, _ in reversed(NEW_GPU_COLUMNS):
        op.drop_column("gpu_samples", name)
    op.drop_index("runs_inferred_open_idx", table_name="runs")
    op.drop_index("run_sightings_status_idx", table_name="run_sightings")
    op.drop_table("run_sightings")
    op.drop_column("run_progress", "steps")
    op.drop_constraint("runs_source", "runs", type_="check")
    op.drop_column("runs", "source")
