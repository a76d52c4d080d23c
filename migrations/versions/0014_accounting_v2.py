"""accounting V2: money as computed, dated currencies, fleet GPUs from joining to leaving; setting bounds

* The accounting functions move to V2 (``gpufleet.db.accounting_sql``):
  money is computed in ``numeric`` and returned to 1e-9 of the currency
  (rounding to minor units is presentation), each line is priced in the
  currency in force, and the fleet counts a GPU from when it joined (first
  sample, first rollup, the first run that held it, its node's registration)
  to when it left (silent longer than ``p_gone_after_s``), so GPU time with
  no telemetry is not invented before a GPU existed.
* ``site_settings`` takes ``currency`` as a dated setting: a change holds
  from its time like a price change; ``sites.currency`` stays the currency
  the site started with.
* Bounds on what a price, a PUE or a carbon intensity may be
  (``gpufleet.accounting.bounds``) for new rows, ``NOT VALID``: rows stored
  before stay readable, and the accounting reports the lines they make wrong.
* ``carbon_regions``: per carbon series region, its method (``average`` or
  ``marginal`` intensity), a readable name and the provider it came from.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from gpufleet.db import sql_files

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SETTINGS_V1 = "'pue', 'price_per_kwh', 'gpu_hour_price', 'carbon_region', 'carbon_g_per_kwh'"

_VALUES_V1 = """CASE setting
      WHEN 'pue' THEN num IS NOT NULL AND num >= 1 AND num <= 5 AND txt IS NULL
      WHEN 'price_per_kwh' THEN num IS NOT NULL AND num >= 0 AND txt IS NULL
      WHEN 'gpu_hour_price' THEN (num IS NOT NULL OR gpu_model <> '') AND (num IS NULL OR num >= 0) AND txt IS NULL
      WHEN 'carbon_g_per_kwh' THEN (num IS NULL OR (num >= 0 AND num <= 5000)) AND txt IS NULL
      WHEN 'carbon_region' THEN num IS NULL
    END"""

_VALUES_V2 = _VALUES_V1.replace(
    "      WHEN 'carbon_region' THEN num IS NULL\n",
    "      WHEN 'carbon_region' THEN num IS NULL\n      WHEN 'currency' THEN num IS NULL AND txt ~ '^[A-Z]{3}$'\n",
)

#: gpufleet.accounting.bounds at this revision: price_per_kwh <= 1e6, gpu_hour_price <= 1e8 (site's currency).
_BOUNDS = (
    "num IS NULL OR CASE setting WHEN 'price_per_kwh' THEN num <= 1e6 WHEN 'gpu_hour_price' THEN num <= 1e8 "
    "ELSE true END"
)


def upgrade() -> None:
    op.drop_constraint("site_settings_setting", "site_settings", type_="check")
    op.create_check_constraint(
        "site_settings_setting", "site_settings", f"setting IN ({_SETTINGS_V1}, 'currency')"
    )
    op.drop_constraint("site_settings_values", "site_settings", type_="check")
    op.create_check_constraint("site_settings_values", "site_settings", _VALUES_V2)
    op.execute(f"ALTER TABLE site_settings ADD CONSTRAINT site_settings_bounds CHECK ({_BOUNDS}) NOT VALID")
    op.execute(
        "ALTER TABLE carbon_intensity ADD CONSTRAINT carbon_intensity_bound CHECK (g_co2e_per_kwh <= 5000) "
        "NOT VALID"
    )
    op.create_table(
        "carbon_regions",
        sa.Column("region", sa.Text(), nullable=False),
        sa.Column("method", sa.Text(), server_default=sa.text("'average'"), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("provider", sa.Text(), nullable=True),
        sa.Column(
            "updated_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint("method IN ('average', 'marginal')", name="carbon_regions_method"),
        sa.PrimaryKeyConstraint("region"),
    )
    for stmt in sql_files.statements("0014_accounting_v2.upgrade"):
        op.execute(stmt)
    for name in (
        "gpufleet_site_periods.v2",
        "gpufleet_energy_rates.v2",
        "gpufleet_gpu_hour_prices.v2",
        "gpufleet_accounting.v2",
        "gpufleet_incident_accounting.v2",
    ):
        op.execute(sql_files.text(name))


def downgrade() -> None:
    for stmt in sql_files.statements("0014_accounting_v2.downgrade"):
        op.execute(stmt)
    for name in (
        "gpufleet_site_periods.v1",
        "gpufleet_energy_rates.v1",
        "gpufleet_gpu_hour_prices.v1",
        "gpufleet_accounting.v1",
        "gpufleet_incident_accounting.v1",
    ):
        op.execute(sql_files.text(name))
    op.drop_table("carbon_regions")
    op.execute("ALTER TABLE carbon_intensity DROP CONSTRAINT carbon_intensity_bound")
    op.execute("ALTER TABLE site_settings DROP CONSTRAINT site_settings_bounds")
    # V1 has one currency per site: dated changes go (the site keeps the currency it started with)
    op.execute("DELETE FROM site_settings WHERE setting = 'currency'")
    op.drop_constraint("site_settings_values", "site_settings", type_="check")
    op.create_check_constraint("site_settings_values", "site_settings", _VALUES_V1)
    op.drop_constraint("site_settings_setting", "site_settings", type_="check")
    op.create_check_constraint("site_settings_setting", "site_settings", f"setting IN ({_SETTINGS_V1})")
