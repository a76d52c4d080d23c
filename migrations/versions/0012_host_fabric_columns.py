"""host_samples carries the fabric: NIC errors, drops and saturation, InfiniBand/RoCE port counters

A straggler or a slow all-reduce caused by the network needs the network's own
figures beside the GPUs': errors and drops on the node's physical interfaces
and how close the busiest one runs to its link speed, and the InfiniBand/RoCE
ports' traffic, link rate, state and error counters
(``gpufleet.agent.sources.fabric``).  Sixteen nullable columns of the metric
catalog (``gpufleet.catalog``), outside trace bundles.

Adding a nullable column without a default only touches the catalog, on a
plain table and on a TimescaleDB 2.x hypertable alike (compressed chunks
included); no continuous aggregate reads these columns.  The downgrade drops
them again (TimescaleDB 2.10 or later with compressed chunks).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TYPES = {"real": sa.REAL, "integer": sa.Integer, "smallint": sa.SmallInteger}

#: (column, type, comment): the catalog's fabric fields in catalog order, as the model
#: (``gpufleet.db.schema``) comments them at this revision.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("net_errors", "integer", "receive and transmit errors on physical interfaces in the interval [count]"),
    ("net_drops", "integer", "packets dropped by physical interfaces in the interval [count]"),
    ("net_link_bytes_s", "real", "link speed summed over physical interfaces that are up [B/s]"),
    ("net_util_pct", "real", "busiest physical interface: larger direction against its link speed [%]"),
    ("ib_rx_bytes_s", "real", "InfiniBand/RoCE data received over active ports [B/s]"),
    ("ib_tx_bytes_s", "real", "InfiniBand/RoCE data transmitted over active ports [B/s]"),
    ("ib_rx_packets_s", "real", "InfiniBand/RoCE packets received over active ports [packets/s]"),
    ("ib_tx_packets_s", "real", "InfiniBand/RoCE packets transmitted over active ports [packets/s]"),
    ("ib_link_bytes_s", "real", "link rate summed over active InfiniBand/RoCE ports [B/s]"),
    ("ib_util_pct", "real", "busiest InfiniBand/RoCE port: larger direction against its link rate [%]"),
    ("ib_ports_down", "smallint", "InfiniBand/RoCE ports present but not ACTIVE [ports]"),
    (
        "ib_symbol_errors",
        "integer",
        "physical-layer symbol errors on InfiniBand/RoCE ports in the interval [count]",
    ),
    ("ib_link_downed", "integer", "InfiniBand/RoCE link-down events in the interval [count]"),
    ("ib_link_error_recovery", "integer", "InfiniBand/RoCE link error recoveries in the interval [count]"),
    ("ib_rx_errors", "integer", "InfiniBand/RoCE packets received with errors in the interval [count]"),
    ("ib_tx_discards", "integer", "InfiniBand/RoCE packets discarded on transmit in the interval [count]"),
)


def upgrade() -> None:
    for name, kind, comment in COLUMNS:
        op.add_column("host_samples", sa.Column(name, _TYPES[kind](), nullable=True, comment=comment))


def downgrade() -> None:
    for name, _, _ in reversed(COLUMNS):
        op.drop_column("host_samples", name)
