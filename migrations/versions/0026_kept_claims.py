"""kept_claims and the incidents' pricing mark: what a closed run's incidents claim, kept between readers

A warm accounting of many runs with their ledgers spent most of its time deciding again, for every
reader, which GPU-time each incident claims (reading every incident of every run, checking its evidence,
the union and the ledger's arbitration), though the lines of those claims were already kept.
``kept_claims`` keeps, per ended run and window, the incident count and each priced key's digest of
pieces (``gpufleet.accounting.kept_claims``), with the marks of the run and of its incidents:
``i:<run>``, moved by triggers on ``incidents`` for any change a claim reads.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = postgresql.TIMESTAMP(timezone=True)

#: The functions of the incidents' mark triggers, in the order of their triggers in
#: ``0026_kept_claims.upgrade.sql`` (rendered from ``gpufleet.db.priced_store_sql``).
_MARK_FUNCTIONS = ("gpufleet_pricing_mark_incidents_8.v1", "gpufleet_pricing_mark_incidents_9.v1")


def upgrade() -> None:
    op.create_table(
        "kept_claims",
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("lo", _TZ, nullable=False),
        sa.Column("hi", _TZ, nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("versions", postgresql.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("incidents", sa.Integer(), nullable=False),
        sa.Column("keys", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("pieces", sa.LargeBinary(), nullable=False),
        sa.Column("stored_at", _TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="kept_claims_pkey"),
    )
    for function, trigger in zip(
        _MARK_FUNCTIONS, sql_files.statements("0026_kept_claims.upgrade"), strict=True
    ):
        op.execute(sql_files.text(function))
        op.execute(trigger)


def downgrade() -> None:
    for stmt in sql_files.statements("0026_kept_claims.downgrade"):
        op.execute(stmt)
    op.drop_table("kept_claims")
