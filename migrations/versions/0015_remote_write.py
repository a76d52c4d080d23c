"""Prometheus remote write: pieces waiting for their (node, time), and the remote_write token role

* ``remote_write_parts``: what one remote-write request said of one node at one
  time, committed before the request is answered and deleted in the
  transaction that stores the rows merged from all of that (node, time)'s
  pieces (``gpufleet.collector.remote_write_store``).  It holds only what is
  waiting (about ``remote_write.merge_delay_s`` worth), so it is a plain
  table, not a hypertable.
* ``agent_tokens.role`` gains ``remote_write``: a Prometheus that remote-writes
  the whole fleet, so its token names no node.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLES = "'node', 'finance', 'sre', 'admin', 'progress'"


def upgrade() -> None:
    op.create_table(
        "remote_write_parts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("t_ms", sa.BigInteger(), nullable=False),
        sa.Column(
            "received_at",
            postgresql.TIMESTAMP(timezone=True),
            server_default=sa.text("clock_timestamp()"),
            nullable=False,
        ),
        sa.Column("gpu_samples", sa.Integer(), nullable=False),
        sa.Column("host_samples", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("remote_write_parts_group_idx", "remote_write_parts", ["node", "t_ms"], unique=False)
    op.drop_constraint("agent_tokens_role", "agent_tokens", type_="check")
    op.create_check_constraint("agent_tokens_role", "agent_tokens", f"role IN ({_ROLES}, 'remote_write')")


def downgrade() -> None:
    op.execute("DELETE FROM agent_tokens WHERE role = 'remote_write'")
    op.drop_constraint("agent_tokens_role", "agent_tokens", type_="check")
    op.create_check_constraint("agent_tokens_role", "agent_tokens", f"role IN ({_ROLES})")
    op.drop_index("remote_write_parts_group_idx", table_name="remote_write_parts")
    op.drop_table("remote_write_parts")
