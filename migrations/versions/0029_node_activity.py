"""node_activity_1m / node_activity_1h: the fleet board's series per node, not per GPU

The fleet board's time series summed one row per GPU per sample or minute: on 10,000 GPUs, 30 to 60 s a
panel (``bench/read_side.py``).  These tables hold a node's GPUs folded into one row a minute and one an
hour (``gpufleet.db.activity_sql``), kept by the rollup worker from raw samples on both backends.

The history already rolled up is filled from ``gpu_stats_1m``, which has each GPU-minute's averages and
sample count: the sample-weighted sums use the minute's sample count for every column, the one count it
kept (the worker counts each column's non-NULL samples).

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TZ = postgresql.TIMESTAMP(timezone=True)

#: table: chunk interval on TimescaleDB
_TABLES = {"node_activity_1m": "7 days", "node_activity_1h": "30 days"}

_INTEGER = ("minutes", "gpu_minutes", "busy_minutes", "util_samples", "sm_samples", "tensor_samples")
_COLUMNS = (
    "minutes, gpu_minutes, busy_minutes, util_samples, util_sum, sm_samples, sm_sum, tensor_samples, "
    "tensor_sum, power_w"
)

_FILL_MINUTES = f"""
INSERT INTO node_activity_1m (bucket, node, {_COLUMNS})
SELECT bucket, node, 1, count(*), count(*) FILTER (WHERE coalesce(util_pct, 0) >= 10.0),
  coalesce(sum(samples) FILTER (WHERE util_pct IS NOT NULL), 0), coalesce(sum(util_pct * samples), 0),
  coalesce(sum(samples) FILTER (WHERE sm_active IS NOT NULL), 0), coalesce(sum(sm_active * samples), 0),
  coalesce(sum(samples) FILTER (WHERE tensor_active IS NOT NULL), 0), coalesce(sum(tensor_active * samples), 0),
  coalesce(sum(power_w), 0)
FROM gpu_stats_1m GROUP BY bucket, node"""

_FILL_HOURS = f"""
INSERT INTO node_activity_1h (bucket, node, {_COLUMNS})
SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), node,
  {", ".join(f"sum({c})" for c in _COLUMNS.split(", "))}
FROM node_activity_1m GROUP BY 1, node"""


def _timescale() -> bool:
    row = (
        op.get_bind()
        .execute(sa.text("SELECT value #>> '{}' FROM gpufleet_meta WHERE key = 'backend'"))
        .first()
    )
    return bool(row and row[0] == "timescaledb")


def upgrade() -> None:
    timescale = _timescale()
    for name, chunk in _TABLES.items():
        op.create_table(
            name,
            sa.Column("bucket", _TZ, nullable=False),
            sa.Column("node", sa.Text(), nullable=False),
            *(
                sa.Column(c, sa.Integer() if c in _INTEGER else sa.Double(), nullable=False)
                for c in _COLUMNS.split(", ")
            ),
            sa.PrimaryKeyConstraint("node", "bucket", name=f"{name}_pkey"),
        )
        op.create_index(f"{name}_bucket_idx", name, ["bucket"], unique=False)
        if timescale:
            op.execute(
                f"SELECT create_hypertable('{name}', 'bucket', chunk_time_interval => INTERVAL '{chunk}', "
                "create_default_indexes => false)"
            )
    op.execute(_FILL_MINUTES)
    op.execute(_FILL_HOURS)


def downgrade() -> None:
    for name in _TABLES:
        op.drop_index(f"{name}_bucket_idx", table_name=name)
        op.drop_table(name)
