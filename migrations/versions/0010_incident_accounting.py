"""incident accounting: what run-scoped incidents cost, by the run accounting's own definition

Installs ``gpufleet_incident_accounting`` (``gpufleet.db.accounting_sql``):
the run query of ``gpufleet_accounting`` over weighted pieces of runs'
GPU-time (an incident's GPUs over its span, or the union of a run's
incidents) instead of whole runs, so an incident's kWh, CO2e and money come
from the same energy, PUE, carbon and price text as the run's accounting.
No table changes: costs are computed when read, at the prices in force.

Revision ID: 0010
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0010"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_incident_accounting.v1"))


def downgrade() -> None:
    for stmt in sql_files.statements("0010_incident_accounting.downgrade"):
        op.execute(stmt)
