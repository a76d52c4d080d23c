"""fleet_hours_kept / fleet_hour_lines, the hours' marks, and accounting V7 that reads them

A fleet-wide accounting priced every GPU's time of its period again for every reader: 4 to 6 s for a
day of 10,000 GPUs, past any statement limit for a month.  The collector's leader now keeps each
closed hour's lines (``gpufleet.accounting.fleet_hours``); ``gpufleet_accounting`` (V7) answers a
fleet-wide call from the hours that still hold and prices the rest live
(``gpufleet.db.fleet_hours_sql``).  An hour holds while its marks in ``pricing_marks`` are unchanged:
``h:<hour>``, moved by the triggers installed here and by the rollup worker for the hours a change
reaches, and ``h``, moved by a change every hour reads.  V7 also probes each GPU's membership once.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = postgresql.TIMESTAMP(timezone=True)
_KEY = ("max_gap_s", "source", "gone_after_s", "hour")

#: The functions of the hours' mark triggers, in the order of their triggers in
#: ``0030_fleet_hours.upgrade.sql`` (rendered from ``gpufleet.db.fleet_hours_sql``).
_MARK_FUNCTIONS = (
    "gpufleet_fleet_hours_mark_runs_new.v1",
    "gpufleet_fleet_hours_mark_runs_moved.v1",
    "gpufleet_fleet_hours_mark_run_allocations.v1",
    "gpufleet_fleet_hours_mark_nodes_new.v1",
    "gpufleet_fleet_hours_mark_nodes_changed.v1",
    "gpufleet_fleet_hours_mark_nodes_facts.v1",
    "gpufleet_fleet_hours_mark_nodes_gone.v1",
    "gpufleet_fleet_hours_mark_node_facts_history.v1",
    "gpufleet_fleet_hours_mark_site_settings.v1",
    "gpufleet_fleet_hours_mark_sites.v1",
    "gpufleet_fleet_hours_mark_carbon.v1",
)


def _key() -> list[sa.Column]:
    return [
        sa.Column("max_gap_s", sa.Double(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("gone_after_s", sa.Double(), nullable=False),
        sa.Column("hour", _TZ, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "fleet_hours_kept",
        *_key(),
        sa.Column("whole_mark", sa.BigInteger(), nullable=False),
        sa.Column("hour_mark", sa.BigInteger(), nullable=False),
        sa.Column("stored_at", _TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint(*_KEY, name="fleet_hours_kept_pkey"),
    )
    op.create_table(
        "fleet_hour_lines",
        *_key(),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("sk", sa.Text(), nullable=False),
        sa.Column("cur", sa.Text(), nullable=True),
        sa.Column("gpu_s", sa.Double(), nullable=True),
        sa.Column("covered_s", sa.Double(), nullable=True),
        sa.Column("gpu_kwh", sa.Double(), nullable=True),
        sa.Column("host_kwh", sa.Double(), nullable=True),
        sa.Column("facility_kwh", sa.Double(), nullable=True),
        sa.Column("co2e_kg", sa.Numeric(), nullable=True),
        sa.Column("co2e_unknown_kwh", sa.Double(), nullable=True),
        sa.Column("energy_cost", sa.Numeric(), nullable=True),
        sa.Column("compute_cost", sa.Numeric(), nullable=True),
        sa.Column("stale", sa.Boolean(), nullable=False),
        sa.Column("has_energy", sa.Boolean(), nullable=False),
        sa.Column("price_lo", sa.Double(), nullable=True),
        sa.Column("price_hi", sa.Double(), nullable=True),
        sa.Column("g_lo", sa.Double(), nullable=True),
        sa.Column("g_hi", sa.Double(), nullable=True),
        sa.Column("csrc_lo", sa.Text(), nullable=True),
        sa.Column("csrc_hi", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint(*_KEY, "line_no", name="fleet_hour_lines_pkey"),
        sa.ForeignKeyConstraint(
            list(_KEY),
            [f"fleet_hours_kept.{c}" for c in _KEY],
            ondelete="CASCADE",
            name="fleet_hour_lines_hour_fkey",
        ),
    )
    op.execute(sql_files.text("gpufleet_fleet_hour_scopes.v1"))
    for function, trigger in zip(
        _MARK_FUNCTIONS, sql_files.statements("0030_fleet_hours.upgrade"), strict=True
    ):
        op.execute(sql_files.text(function))
        op.execute(trigger)
    op.execute(sql_files.text("gpufleet_fleet_parts.v1"))
    op.execute(sql_files.text("gpufleet_accounting_kept.v1"))
    op.execute(sql_files.text("gpufleet_accounting.v7"))


def downgrade() -> None:
    op.execute(sql_files.text("gpufleet_accounting.v6"))
    op.execute(
        "DROP FUNCTION IF EXISTS gpufleet_accounting_kept(timestamptz, timestamptz, timestamptz, "
        "double precision, text, double precision)"
    )
    op.execute(
        "DROP FUNCTION IF EXISTS gpufleet_fleet_parts(timestamptz, timestamptz, timestamptz, "
        "double precision, text, double precision, text)"
    )
    for stmt in sql_files.statements("0030_fleet_hours.downgrade"):
        op.execute(stmt)
    op.execute("DROP FUNCTION IF EXISTS gpufleet_fleet_hour_scopes(timestamptz, timestamptz)")
    op.drop_table("fleet_hour_lines")
    op.drop_table("fleet_hours_kept")
