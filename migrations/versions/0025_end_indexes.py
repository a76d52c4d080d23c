"""incidents and runs indexed by their end: the leader's pricing pass reads what closed since the last

After every sweep the collector's leader prices the incidents that closed and the runs that ended in
the last hour (``gpufleet.accounting.ahead``), selecting them by ``"end"``; without an index each pass
read every incident and run ever stored.  An incident's end is written once, when it resolves (the
sweep's updates of an open incident leave it alone), so the index costs its updates nothing else.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("incidents_end_idx", "incidents", ["end"], unique=False)
    op.create_index("runs_end_idx", "runs", ["end"], unique=False)


def downgrade() -> None:
    op.drop_index("runs_end_idx", table_name="runs")
    op.drop_index("incidents_end_idx", table_name="incidents")
