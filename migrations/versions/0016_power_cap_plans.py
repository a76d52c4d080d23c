"""power_cap_plans: one power cap for every GPU of a run, applied by the agents on its nodes

An operator (or an automation with the admin role) accepts the power-cap
advisor's proposal for a run, or sets a limit of their own; the agents on the
run's nodes read the active plans for their node from the API and set the
limit on every GPU the run holds there through NVML, or on none, and restore
each GPU's previous limit when the run ends or the plan is withdrawn
(``gpufleet.advisor.plans``).  ``revision`` grows at each change so an agent
and the API agree on which plan a report is about.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "power_cap_plans",
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("limit_w", sa.REAL(), nullable=False),
        sa.Column("revision", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'active'"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column(
            "created_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "updated_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("limit_w > 0", name="power_cap_plans_limit"),
        sa.CheckConstraint("state IN ('active', 'withdrawn')", name="power_cap_plans_state"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )


def downgrade() -> None:
    op.drop_table("power_cap_plans")
