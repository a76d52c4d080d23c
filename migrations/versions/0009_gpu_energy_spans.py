"""gpu_energy_spans: counter intervals longer than the gap rule, one row each

The energy counter bridges gaps of any length (contracts.md section 3), and
the minute rollups used to spread such an interval over every minute it
covers: two samples 13.9 days apart on 10 GPUs wrote 200,174 rows.  An
interval longer than ``max_gap_s`` (only a counter interval can be counted
then) is now one row here instead, and rollup-based accounting adds the share
of each span that falls inside the minutes and hours it reads, split at the
same tariff edges, so it still equals raw accounting.

An ordinary table on both layouts (plain PostgreSQL and TimescaleDB): it
holds one row per long gap, not per sample or minute, so it needs no chunks;
old spans are deleted by the leader with the rollups' retention.

Revision ID: 0009
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_energy_spans",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("t0", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("t1", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("energy_j", sa.Double(), nullable=False),
        sa.CheckConstraint("t1 > t0", name="gpu_energy_spans_order"),
        sa.PrimaryKeyConstraint("node", "gpu", "t0"),
    )
    op.create_index("gpu_energy_spans_t1_idx", "gpu_energy_spans", ["node", "gpu", "t1"], unique=False)
    # Spans written before this revision do not exist: long counter intervals already
    # rolled up stay as minute rows, which the accounting still reads (the sum is the same).


def downgrade() -> None:
    op.drop_index("gpu_energy_spans_t1_idx", table_name="gpu_energy_spans")
    op.drop_table("gpu_energy_spans")
