"""accounting V6: the fleet path joins each GPU and node to the allocations that hold it

Replaces ``gpufleet_accounting`` with the text of ``gpufleet.db.accounting_sets_sql``: the same lines,
with the fleet path's cuts and held shares written as joins instead of a scan of the period's
allocations per GPU, host piece and GPU piece.  Signature and result table are unchanged.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v6"))


def downgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v5"))
