"""kept_power_minutes: a running run's minutes of each closed hour, kept for the power-cap advisor

An ended run's points are kept (0028), but a running run's window grows, so the advisor read all of a
running run's minutes again on every request: on 10,000 GPUs with 412 runs running, about 220 ms a
run, a fleet-wide advice answering 503 at its budget and one run's proposal past 28 s
(``bench/read_side.py``).  The minutes of an hour that has closed do not change while the run's
window and allocations (``r:<run>``), that hour's samples and rollups (``h:<hour>``, which the rollup
worker moves) and what every hour reads (``h``) are unchanged, so the first request keeps them
(``gpufleet.advisor.kept_minutes``) and the next reads only the minutes since the last closed hour.

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = sa.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "kept_power_minutes",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("hour", _TZ, nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("lo", _TZ, nullable=False),
        sa.Column("run_mark", sa.BigInteger(), nullable=False),
        sa.Column("whole_mark", sa.BigInteger(), nullable=False),
        sa.Column("hour_mark", sa.BigInteger(), nullable=False),
        sa.Column("minutes", sa.LargeBinary(), nullable=False),
        sa.Column("stored_at", _TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("digest", "hour", name="kept_power_minutes_pkey"),
    )


def downgrade() -> None:
    op.drop_table("kept_power_minutes")
