"""claim energy, second text: a group's staleness read once per group, not once per output row

Replaces ``gpufleet_claim_energy`` with ``gpufleet.db.claim_energy_sql.CLAIM_ENERGY_V2``: the same
figures, without the subquery per group and segment that scanned every claim (quadratic in the
claims of incident and ledger pricing).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_claim_energy.v2"))


def downgrade() -> None:
    op.execute(sql_files.replacing("gpufleet_claim_energy.v1"))
