"""gpu_samples carries the job's own cgroup: CPU used, quota, throttling, CPU and I/O pressure

A data loader starving eight GPUs on a 192-core host saturates its own
cgroup's CPU quota, never 80 % of the host, so the starvation cause is judged
from the job's cgroup (the processes on each GPU).  The agent reads it per
GPU (``gpufleet.agent.sources.cgroup``) and ships five nullable columns of the
metric catalog (``gpufleet.catalog``): ``job_cpu_cores``,
``job_cpu_quota_cores``, ``job_cpu_throttled_share``, ``job_cpu_pressure_pct``
and ``job_io_pressure_pct``.

The change is the same on both layouts: ``ALTER TABLE ... ADD COLUMN`` of a
nullable column without a default only touches the catalog, on a plain table
and on a TimescaleDB 2.x hypertable alike (compressed chunks included); the
continuous aggregates do not read these columns.  The downgrade drops them
again (on TimescaleDB, dropping a column of a hypertable with compressed
chunks needs 2.10 or later).

Revision ID: 0008
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (column, comment): the catalog's job_* fields in catalog order, as the
#: model (``gpufleet.db.schema``) comments them at this revision.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("job_cpu_cores", "CPU the job's cgroup used (cpu.stat usage_usec per second) [cores]"),
    ("job_cpu_quota_cores", "CPU quota of the job's cgroup, tightest on its path; NULL unlimited [cores]"),
    ("job_cpu_throttled_share", "share of CFS periods the job's cgroup was throttled [ratio]"),
    ("job_cpu_pressure_pct", "share of time some task of the job waited for CPU [%]"),
    ("job_io_pressure_pct", "share of time some task of the job waited for I/O [%]"),
)


def upgrade() -> None:
    for name, comment in COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, sa.REAL(), nullable=True, comment=comment))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("gpu_samples", name)
