"""accounting V4: the same figures, with the joins the planner had made loops written as sets

Replaces ``gpufleet_claim_energy``, ``gpufleet_accounting`` and ``gpufleet_incident_accounting`` with
the texts of ``gpufleet.db.accounting_joins_sql`` (planned without nested loops where claim energy has
a choice; rates joined on their index; allocations counted once per run).  Signatures and result
tables are unchanged.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import accounting_joins_sql

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for stmt in accounting_joins_sql.INSTALL:
        op.execute(stmt)


def downgrade() -> None:
    for stmt in accounting_joins_sql.UNDO:
        op.execute(stmt)
