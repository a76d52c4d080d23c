"""run_metrics_snapshot: the per-run figures /metrics exports, computed by the leader, read by every replica

The accounting behind ``gpufleet_run_*`` (energy, cost, CO2e, GPU-hours by
ledger state, goodput) is computed by the leader every
``run_metrics.refresh_s`` (``gpufleet.collector.run_metrics``), never per
scrape; every replica serves the last snapshot, so a scrape through the
replicas' balancer gets the same figures wherever it lands.  One row.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_metrics_snapshot",
        sa.Column("id", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("computed_at", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint("id = 1", name="run_metrics_snapshot_one_row"),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("run_metrics_snapshot")
