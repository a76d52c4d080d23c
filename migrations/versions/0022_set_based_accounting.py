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

from gpufleet.db import sql_files

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_claim_energy.v3"))
    op.execute(sql_files.text("gpufleet_accounting.v4"))
    op.execute(sql_files.text("gpufleet_incident_accounting.v4"))


def downgrade() -> None:
    op.execute(sql_files.text("gpufleet_claim_energy.v2"))
    op.execute(sql_files.text("gpufleet_accounting.v3"))
    op.execute(sql_files.text("gpufleet_incident_accounting.v3"))
