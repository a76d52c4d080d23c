"""priced_pieces and pricing_marks: incident and ledger pricing kept until an input it read changes

``priced_pieces`` keeps the lines of ``gpufleet_incident_accounting`` per digest of the pieces priced
(``gpufleet.accounting.priced_store``); ``pricing_marks`` holds, per input scope, the transaction that
last changed it, moved by triggers on runs, allocations, nodes, dated facts, sites, site settings and
carbon intensity, and by the rollup worker for the days of samples it rebuilds
(``gpufleet.db.priced_store_sql``).  A kept line is read only while the marks it recorded are current.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import priced_store_sql, sql_files

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = postgresql.TIMESTAMP(timezone=True)

#: The functions of the pricing marks' triggers (gpufleet/db/sql, rendered from
#: ``gpufleet.db.priced_store_sql``), in the order of their triggers in ``0023_priced_pieces.upgrade.sql``.
_MARK_FUNCTIONS = (
    "gpufleet_pricing_mark_runs_0.v1",
    "gpufleet_pricing_mark_runs_1.v1",
    "gpufleet_pricing_mark_run_allocations_2.v1",
    "gpufleet_pricing_mark_nodes_3.v1",
    "gpufleet_pricing_mark_nodes_4.v1",
    "gpufleet_pricing_mark_node_facts_history_5.v1",
    "gpufleet_pricing_mark_site_settings_6.v1",
    "gpufleet_pricing_mark_sites_7.v1",
    "gpufleet_pricing_mark_carbon.v1",
)


def upgrade() -> None:
    op.create_table(
        "pricing_marks",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("scope"),
    )
    num, dbl, txt = sa.Numeric(), sa.Double(), sa.Text()
    typed = {
        "line": txt,
        "run_id": txt,
        "site": txt,
        "part_start": _TZ,
        "part_end": _TZ,
        "gpu_count": sa.Integer(),
        "carbon_source": txt,
        "price_source": txt,
        "currency": txt,
        "minor_units": sa.Integer(),
        "stale": sa.Boolean(),
        "gpu_equivalents": dbl,
        "gpu_s": dbl,
        "covered_s": dbl,
        "coverage": dbl,
        "g_co2e_per_kwh": dbl,
        "price_per_kwh": dbl,
    }
    op.create_table(
        "priced_pieces",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("line_no", sa.SmallInteger(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("versions", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("nodes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("gpus", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("lo", _TZ, nullable=False),
        sa.Column("hi", _TZ, nullable=False),
        sa.Column("stored_at", _TZ, server_default=sa.text("now()"), nullable=False),
        *(
            sa.Column(col, typed.get(col, num), nullable=(col != "line"))
            for col in priced_store_sql.LINE_COLUMNS
        ),
        sa.PrimaryKeyConstraint("digest", "line_no", name="priced_pieces_pkey"),
    )
    op.execute(sql_files.text("gpufleet_pricing_bump.v1"))
    # each trigger after its function, in the order of the step's file
    for function, trigger in zip(
        _MARK_FUNCTIONS, sql_files.statements("0023_priced_pieces.upgrade"), strict=True
    ):
        op.execute(sql_files.text(function))
        op.execute(trigger)


def downgrade() -> None:
    for stmt in sql_files.statements("0023_priced_pieces.downgrade"):
        op.execute(stmt)
    op.drop_table("priced_pieces")
    op.drop_table("pricing_marks")
