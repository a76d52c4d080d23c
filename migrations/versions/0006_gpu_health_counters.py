"""GPU memory, bus and NVLink health counters; quarantine actions on incidents

``gpu_samples`` gains the counters that tell a failing board from a slow one:
single- and double-bit ECC errors (volatile and aggregate), remapped rows
(correctable, uncorrectable, pending, failed), PCIe replays, NVLink CRC,
replay and recovery errors, and NVLink links up / present.  The volatile
double-bit counter, ``ecc_dbe`` until now, becomes ``ecc_dbe_vol`` beside its
siblings; ingest and bundles still accept the old name (contracts.md
section 1 fixed it).

``incidents.actions`` records what a quarantine hook did about an incident
(drain in Slurm, cordon in Kubernetes, or only logged in dry-run), when, and
with what result.

Both layouts take the same statements: on TimescaleDB 2.x a compressed
hypertable accepts ADD COLUMN of a nullable column without a default and
RENAME COLUMN (no continuous aggregate reads ``ecc_dbe``); ``incidents`` is an
ordinary table on both.

The ECC, row-remap and PCIe-replay columns exist since 0005 (named for
dcgm-exporter's fields); here they take the catalog's descriptions, and the
NVLink error and link columns are new.

Revision ID: 0006
Revises: 0009
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (name, comment at 0005, comment now) of the gpu_samples columns 0005 added.
RECOMMENTED: tuple[tuple[str, str, str], ...] = (
    (
        "ecc_sbe_vol",
        "volatile single-bit ECC errors, cumulative [count]",
        "volatile single-bit (corrected) ECC errors since the driver loaded [count]",
    ),
    (
        "ecc_sbe_agg",
        "aggregate (persistent) single-bit ECC errors, cumulative [count]",
        "single-bit (corrected) ECC errors over the board's life [count]",
    ),
    (
        "ecc_dbe_agg",
        "aggregate (persistent) double-bit ECC errors, cumulative [count]",
        "double-bit (uncorrected) ECC errors over the board's life [count]",
    ),
    (
        "remapped_rows_correctable",
        "memory rows remapped for correctable errors [count]",
        "memory rows remapped after correctable errors [rows]",
    ),
    (
        "remapped_rows_uncorrectable",
        "memory rows remapped for uncorrectable errors [count]",
        "memory rows remapped after uncorrectable errors [rows]",
    ),
    (
        "remapped_rows_pending",
        "1 while a row remap waits for a GPU reset [flag]",
        "1 when a row remap waits for a GPU reset to take effect [flag]",
    ),
    (
        "remapped_rows_failed",
        "1 when a row remap has failed [flag]",
        "1 when a row remap failed (no spare row left) [flag]",
    ),
    (
        "pcie_replay_count",
        "PCIe replays (link-level retries), cumulative [count]",
        "PCIe link-level replays (retransmissions), cumulative [count]",
    ),
)

#: (name, type, comment) of the new gpu_samples columns, in catalog order.
NEW_GPU_COLUMNS: tuple[tuple[str, type[sa.types.TypeEngine], str], ...] = (
    (
        "nvlink_crc_errors",
        sa.BigInteger,
        "NVLink flow-control (FLIT) CRC errors over all links, cumulative [count]",
    ),
    ("nvlink_replay_errors", sa.BigInteger, "NVLink data-link replays over all links, cumulative [count]"),
    ("nvlink_recovery_errors", sa.BigInteger, "NVLink link recoveries over all links, cumulative [count]"),
    ("nvlink_links_up", sa.SmallInteger, "NVLink links active now [links]"),
    ("nvlink_links_max", sa.SmallInteger, "NVLink links the GPU has (active or not) [links]"),
)

#: Types of the re-commented columns (unchanged by this revision).
_RECOMMENTED_TYPES: dict[str, type[sa.types.TypeEngine]] = {
    "remapped_rows_pending": sa.SmallInteger,
    "remapped_rows_failed": sa.SmallInteger,
}

DBE_OLD_COMMENT = "volatile double-bit ECC errors, cumulative [count]"
DBE_NEW_COMMENT = "volatile double-bit (uncorrected) ECC errors since the driver loaded [count]"


def upgrade() -> None:
    op.alter_column(
        "gpu_samples",
        "ecc_dbe",
        new_column_name="ecc_dbe_vol",
        comment=DBE_NEW_COMMENT,
        existing_type=sa.BigInteger(),
        existing_nullable=True,
        existing_comment=DBE_OLD_COMMENT,
    )
    for name, old, new in RECOMMENTED:
        op.alter_column(
            "gpu_samples",
            name,
            comment=new,
            existing_comment=old,
            existing_nullable=True,
            existing_type=_RECOMMENTED_TYPES.get(name, sa.BigInteger)(),
        )
    for name, kind, comment in NEW_GPU_COLUMNS:
        op.add_column("gpu_samples", sa.Column(name, kind(), nullable=True, comment=comment))
    op.add_column(
        "incidents",
        sa.Column(
            "actions",
            sa.dialects.postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("incidents", "actions")
    for name, _kind, _comment in reversed(NEW_GPU_COLUMNS):
        op.drop_column("gpu_samples", name)
    for name, old, new in RECOMMENTED:
        op.alter_column(
            "gpu_samples",
            name,
            comment=old,
            existing_comment=new,
            existing_nullable=True,
            existing_type=_RECOMMENTED_TYPES.get(name, sa.BigInteger)(),
        )
    op.alter_column(
        "gpu_samples",
        "ecc_dbe_vol",
        new_column_name="ecc_dbe",
        comment=DBE_OLD_COMMENT,
        existing_type=sa.BigInteger(),
        existing_nullable=True,
        existing_comment=DBE_NEW_COMMENT,
    )
