"""node_quarantine and quarantine_log: quarantine that acts on checks as on incidents, and releases

The quarantine hooks take a node out of scheduling for a critical health
incident or a failed node check, hold it while a trigger holds, and put it
back once it has passed for the hold-down (``gpufleet.collector.quarantine``).
``node_quarantine`` is each node's state (what holds it, since when it passes);
``quarantine_log`` every action taken, dry-run or failed, for the node page,
the API and the audit.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_quarantine",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("backend", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "triggers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("since", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("passing_since", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column(
            "updated_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("state IN ('quarantined', 'released')", name="node_quarantine_state"),
        sa.PrimaryKeyConstraint("node"),
    )
    op.create_table(
        "quarantine_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("time", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "triggers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column(
            "call",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("quarantine_log_node_time_idx", "quarantine_log", ["node", "time"])


def downgrade() -> None:
    op.drop_index("quarantine_log_node_time_idx", table_name="quarantine_log")
    op.drop_table("quarantine_log")
    op.drop_table("node_quarantine")
