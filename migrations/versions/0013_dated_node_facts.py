"""dated node facts, counter glitches, progress tokens, refused sightings

* ``node_facts_history``: the node facts that price or classify (GPU model,
  per-GPU names and MIG layout, GPU count, site), one row per change, valid
  from when the collector received it (``gpufleet.store.fact_history``).
  Seeded with each node's current facts, valid since always, so nothing
  read today changes; from now on a batch naming another GPU model prices
  only what comes after it.
* ``gpufleet_priced_facts(jsonb)`` and ``gpufleet_node_facts_at(node, at)``.
* ``gpufleet_claim_energy`` is installed again from ``gpufleet.db.accounting_sql``:
  an energy counter difference above what a GPU can draw over the interval
  is a glitch, not energy (``gpufleet.db.energy_sql``, which the rollups read
  too), so raw accounting and the rollups keep agreeing.
* ``agent_tokens.role`` gains ``progress``: training code's token, which
  reports progress of runs and nothing else (``node`` optional: only runs on
  that node).
* ``run_sightings.status`` gains ``refused``: a sighting a node's samples may
  not turn into an allocation (a GPU shown on an existing run from before it
  began, or long after), kept with the reason.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROLES = "'node', 'finance', 'sre', 'admin'"
#: A node token names its node; a progress token may; no other role does.
_NODE_ROLE = "(role <> 'node' OR node IS NOT NULL) AND (node IS NULL OR role IN ('node', 'progress'))"
_STATUSES = "'pending', 'allocated', 'moved', 'explicit', 'conflict', 'yielded', 'invalid'"


def _install_claim_energy() -> None:
    op.execute(sql_files.replacing("gpufleet_claim_energy.v1"))


def upgrade() -> None:
    op.create_table(
        "node_facts_history",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("valid_from", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("facts", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(["node"], ["nodes.node"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("node", "valid_from"),
    )
    op.execute(sql_files.text("gpufleet_priced_facts.v1"))
    op.execute(sql_files.text("gpufleet_node_facts_at.v1"))
    op.execute(sql_files.text("node_facts_history.seed.v1"))
    _install_claim_energy()
    op.drop_constraint("run_sightings_status", "run_sightings", type_="check")
    op.create_check_constraint("run_sightings_status", "run_sightings", f"status IN ({_STATUSES}, 'refused')")
    op.drop_constraint("agent_tokens_role", "agent_tokens", type_="check")
    op.drop_constraint("agent_tokens_node_role", "agent_tokens", type_="check")
    op.create_check_constraint("agent_tokens_role", "agent_tokens", f"role IN ({_ROLES}, 'progress')")
    op.create_check_constraint("agent_tokens_node_role", "agent_tokens", _NODE_ROLE)


def downgrade() -> None:
    op.execute("DELETE FROM agent_tokens WHERE role = 'progress'")
    op.drop_constraint("agent_tokens_role", "agent_tokens", type_="check")
    op.drop_constraint("agent_tokens_node_role", "agent_tokens", type_="check")
    op.create_check_constraint("agent_tokens_role", "agent_tokens", f"role IN ({_ROLES})")
    op.create_check_constraint(
        "agent_tokens_node_role", "agent_tokens", "(role = 'node') = (node IS NOT NULL)"
    )
    op.execute("UPDATE run_sightings SET status = 'conflict' WHERE status = 'refused'")
    op.drop_constraint("run_sightings_status", "run_sightings", type_="check")
    op.create_check_constraint("run_sightings_status", "run_sightings", f"status IN ({_STATUSES})")
    op.execute("DROP FUNCTION IF EXISTS gpufleet_node_facts_at(text, timestamptz)")
    op.execute("DROP FUNCTION IF EXISTS gpufleet_priced_facts(jsonb)")
    op.drop_table("node_facts_history")
