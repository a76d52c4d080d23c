"""ingest_batches keyed on (node, batch_id), not batch_id alone

A batch id is unique per node only (the agent derives it from its own
``agent_id`` and a sequence number): two machines cloned from one image, or
another node's token, sending the same id must not make this node's batch a
"duplicate" that is acknowledged and never stored.  ``ingest_batches`` is a
plain table in both the PostgreSQL and the TimescaleDB layout, so the change
is the same on both.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 22:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("ingest_batches_pkey", "ingest_batches", type_="primary")
    op.create_primary_key("ingest_batches_pkey", "ingest_batches", ["node", "batch_id"])


def downgrade() -> None:
    # batch_id alone becomes the key again: of ids that several nodes used,
    # the first received is kept (the others would be refused as duplicates).
    op.execute(
        "DELETE FROM ingest_batches b USING ingest_batches a "
        "WHERE a.batch_id = b.batch_id AND (a.received_at, a.node) < (b.received_at, b.node)"
    )
    op.drop_constraint("ingest_batches_pkey", "ingest_batches", type_="primary")
    op.create_primary_key("ingest_batches_pkey", "ingest_batches", ["batch_id"])
