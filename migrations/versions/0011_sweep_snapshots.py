"""sweep_snapshots: the detector window of each sweep shard, persisted by its owner

A replica that takes over a sweep shard (a new leader, or a shard moving when
its owner dies) used to re-read the whole detector window of raw samples
before its first sweep: 14 s for 10,000 GPUs, during which nothing was
detected.  The owner now writes its in-memory window as it ages, in
fixed-length time segments (zstd-compressed column blocks, the cache's own
float32 values, so detection on a restored window equals detection on the
live one), plus the watermark and the batch ids it had merged; a new owner
reads the segments and only the raw tail since the last one.

``shards`` is part of both keys: segments written under another shard count
describe other node sets and are never read.  Blobs are already compressed:
stored EXTERNAL (out of line, without pglz).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweep_snapshots",
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("seg", sa.BigInteger(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("shards", "shard", "seg"),
    )
    op.create_table(
        "sweep_snapshot_state",
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("watermark", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("upto", sa.Double(), nullable=False),
        sa.Column("since", sa.Double(), nullable=False),
        sa.Column("seen", sa.LargeBinary(), nullable=False),
        sa.Column(
            "written_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("shards", "shard"),
    )
    op.execute("ALTER TABLE sweep_snapshots ALTER COLUMN blob SET STORAGE EXTERNAL")
    op.execute("ALTER TABLE sweep_snapshot_state ALTER COLUMN seen SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("sweep_snapshot_state")
    op.drop_table("sweep_snapshots")
