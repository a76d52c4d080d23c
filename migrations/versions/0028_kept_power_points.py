"""kept_power_points and the progress reports' pricing mark: the power-cap advisor's points kept

The power-cap advisor read every run's minutes of a month again on each request, one run at a time:
past 300 s on 10,000 GPUs (``bench/read_side.py``).  An ended run's stretches at one power limit depend
only on its window and allocations (``r:<run>``), its progress reports (``p:<run>``, moved by the
trigger this migration adds on ``run_progress``) and its nodes' samples by day (``e:<node>:<day>``), so
the first request keeps them (``gpufleet.advisor.kept_points``) and the next reads them back.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = postgresql.TIMESTAMP(timezone=True)

#: The function of the progress reports' mark trigger (``0028_kept_power_points.upgrade.sql``, rendered
#: from ``gpufleet.db.priced_store_sql``).
_MARK_FUNCTIONS = ("gpufleet_pricing_mark_run_progress_10.v1",)


def upgrade() -> None:
    op.create_table(
        "kept_power_points",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("lo", _TZ, nullable=False),
        sa.Column("hi", _TZ, nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("versions", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("points", postgresql.JSONB(), nullable=False),
        sa.Column("excluded", postgresql.JSONB(), nullable=False),
        sa.Column("stored_at", _TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="kept_power_points_pkey"),
    )
    for function, trigger in zip(
        _MARK_FUNCTIONS, sql_files.statements("0028_kept_power_points.upgrade"), strict=True
    ):
        op.execute(sql_files.text(function))
        op.execute(trigger)


def downgrade() -> None:
    for stmt in sql_files.statements("0028_kept_power_points.downgrade"):
        op.execute(stmt)
    op.drop_table("kept_power_points")
