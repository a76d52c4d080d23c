"""accounting V3: the GPU model a GPU-hour is priced at is the one the node's facts said then

Replaces ``gpufleet_accounting`` and ``gpufleet_incident_accounting`` with their V3 texts
(``gpufleet.db.accounting_sql``): each allocation's GPU model is read with
``gpufleet_node_facts_at(node, start of the priced piece)`` (migration 0013's dated facts) instead of
the node's current facts.  A batch naming an H100 a Tesla T4 prices what comes after it as a T4, and
every closed period as it was.  Signatures and result tables are V2's.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v3"))
    op.execute(sql_files.text("gpufleet_incident_accounting.v3"))


def downgrade() -> None:
    op.execute(sql_files.replacing("gpufleet_accounting.v2"))
    op.execute(sql_files.replacing("gpufleet_incident_accounting.v2"))
