"""A mark moved once per transaction, and allocations marked once per statement

Registering a run after it started marks the fleet's hours from its start to now once per GPU: a
backfilled 64-GPU run started a month ago marked 720 hours 64 times, each time writing a new version
of the same ``pricing_marks`` rows, and each write walked the versions the transaction had already
left.  A COPY of 512 such allocations took 56.5 s (``bench/register_runs.py``), and synthesising a
month of 10,000 GPUs did not finish.  ``gpufleet_pricing_bump`` (V2) now leaves a mark this transaction already moved, and the
allocations' hours are marked by statement triggers (``gpufleet.db.fleet_hours_sql.ALLOCATIONS_V2``):
the same hours, from the statement's earliest row's first hour to now, marked once.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from gpufleet.db import sql_files

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROW_FUNCTION = "gpufleet_fleet_hours_mark_run_allocations"


def upgrade() -> None:
    op.execute(sql_files.text("gpufleet_pricing_bump.v2"))
    steps = sql_files.statements("0031_statement_marks.upgrade")
    drops = [s for s in steps if s.startswith("DROP ")]
    for stmt in drops:
        op.execute(stmt)
    op.execute(sql_files.text("gpufleet_fleet_hours_mark_allocations.v1"))
    for stmt in steps[len(drops) :]:
        op.execute(stmt)


def downgrade() -> None:
    for stmt in sql_files.statements("0031_statement_marks.downgrade"):
        op.execute(stmt)
    op.execute(sql_files.text(f"{_ROW_FUNCTION}.v1"))
    op.execute(
        next(s for s in sql_files.statements("0030_fleet_hours.upgrade") if f"TRIGGER {_ROW_FUNCTION} " in s)
    )
    op.execute(sql_files.replacing("gpufleet_pricing_bump.v1"))
