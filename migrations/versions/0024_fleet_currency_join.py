"""accounting V5: the fleet lines' GPU-seconds find their currency by the rate index

Replaces ``gpufleet_accounting`` with the text of ``gpufleet.db.accounting_fleet_sql``: the same
lines, with each fleet piece's currency joined on its rate's index instead of looked up by a
subquery per piece.  Signature and result table are unchanged.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v5"))


def downgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v4"))
