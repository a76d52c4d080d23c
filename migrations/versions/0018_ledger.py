"""ledger: where every GPU-hour of a run went, as SQL for the Grafana energy board

Installs ``gpufleet_ledger_pieces`` and ``gpufleet_ledger`` (``gpufleet.db.ledger_sql``): the runs'
ledgers (productive, idle, hung, starved, checkpoint, straggler_wait, throttled) from their
incidents, priced by ``gpufleet_incident_accounting``, the SQL twin of
``gpufleet.accounting.ledger``.  No table changes.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_ledger_pieces.v1"))
    op.execute(sql_files.text("gpufleet_ledger.v1"))


def downgrade() -> None:
    for stmt in sql_files.statements("0018_ledger.downgrade"):
        op.execute(stmt)
