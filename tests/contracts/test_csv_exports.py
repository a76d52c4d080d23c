"""docs/contracts.md section 5: the CSV exports' columns (added only at the end), their cells' formats and rules."""

from __future__ import annotations

import csv
import io
import re

import psycopg
import pytest

from gpufleet.accounting import CONTRACT_FIELDS, CSV_COLUMNS
from gpufleet.accounting.focus import COLUMNS as FOCUS_EXPORT_COLUMNS
from gpufleet.accounting.focus import FOCUS_COLUMNS, X_COLUMNS
from gpufleet.accounting.report import FINANCE_COLUMN_NAMES, LEDGER_COLUMNS
from tests.accounting.builders import constant_power, drain, gpu_samples, host_samples, node, run, site
from tests.api.conftest import Api
from tests.contracts import docs

#: runs.csv as published: the contract's fields, then the extras in this order (section 5.1).
RUNS_CSV = (
    *CONTRACT_FIELDS,
    "name",
    "site",
    "team",
    "state",
    "window_start",
    "window_end",
    "duration_s",
    "gpu_models",
    "gpu_equivalents",
    "carbon_regions",
    "g_co2e_per_kwh",
    "co2e_unknown_kwh",
    "lost_gpu_hours",
    "source",
    "carbon_source",
    "price_source",
    "tokens",
    "samples",
    "tokens_per_kwh",
    "mfu",
    "goodput",
    "planned_end",
    "gpu_power_w",
    "it_power_w",
    "emissions_rate_kg_s",
    "carbon_method",
    "carbon_region_names",
    "mfu_problem",
    "errors",
)
#: The finance report's first columns as published (section 5.2); the ledger's and the later ones follow.
FINANCE_CSV = (
    "row_type",
    "key",
    "name",
    "team",
    "site",
    "state",
    "start",
    "end",
    "window_start",
    "window_end",
    "duration_s",
    "runs",
    "gpu_models",
    "gpu_count",
    "gpu_equivalents",
    "gpu_hours",
    "gpu_kwh",
    "host_kwh",
    "it_kwh",
    "pue",
    "facility_kwh",
    "carbon_regions",
    "g_co2e_per_kwh",
    "co2e_kg",
    "co2e_unknown_kwh",
    "energy_cost",
    "compute_cost",
    "total_cost",
    "currency",
    "coverage",
    "lost_gpu_hours",
)
FINANCE_LATER = (
    "planned_end",
    "gpu_power_w",
    "it_power_w",
    "emissions_rate_kg_s",
    "carbon_method",
    "carbon_region_names",
    "errors",
)
#: FOCUS 1.1 (the FinOps Foundation's specification), in its order.
FOCUS_1_1 = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
NUMBER = re.compile(r"-?\d+(\.\d+)?")
MONEY = re.compile(r"\d+\.\d\d")
REPR = re.compile(r"[{}\[\]]|'[^']*'|\bNone\b|\bTrue\b|\bFalse\b")
TIMES = ("start", "end", "window_start", "window_end", "planned_end")


def test_the_published_lists_are_the_codes() -> None:
    assert docs.backquoted_list(
        docs.section("5.1 runs.csv"), "Columns: the contract's fields in section 3's order, then"
    ) == list(RUNS_CSV[len(CONTRACT_FIELDS) :])
    assert tuple(docs.backquoted_list(docs.section("5.2"), "Columns (")) == FINANCE_CSV
    x = docs.backquoted_list(docs.section("5.3 FOCUS export"), "`FOCUS_COLUMNS`), then")
    assert tuple(x) == X_COLUMNS


def test_columns_change_only_by_addition_at_the_end() -> None:
    assert CSV_COLUMNS[: len(RUNS_CSV)] == RUNS_CSV
    assert FINANCE_COLUMN_NAMES[: len(FINANCE_CSV)] == FINANCE_CSV
    ledger_end = len(FINANCE_CSV) + len(LEDGER_COLUMNS)
    assert FINANCE_COLUMN_NAMES[len(FINANCE_CSV) : ledger_end] == tuple(LEDGER_COLUMNS)
    assert FINANCE_COLUMN_NAMES[ledger_end : ledger_end + len(FINANCE_LATER)] == FINANCE_LATER
    assert FOCUS_COLUMNS == FOCUS_1_1 and FOCUS_EXPORT_COLUMNS[: len(FOCUS_1_1)] == FOCUS_1_1
    assert all(c.startswith("x_") for c in FOCUS_EXPORT_COLUMNS[len(FOCUS_1_1) :])


@pytest.fixture
def exports(api: Api) -> dict[str, list[dict[str, str]]]:
    with psycopg.connect(api.db, autocommit=True) as conn:
        site(conn, "eu", pue=1.3, price=0.257, gpu_hour=2.13, currency="EUR", carbon=380.0)
        node(conn, "n1", 4, "eu", facts={"gpu_model": "NVIDIA H100 80GB HBM3"})
        gpu_samples(conn, constant_power("n1", range(4), 433.3, 0, 7200, counter=True))
        host_samples(conn, [(float(t), "n1", 777.7) for t in range(0, 7201, 10)])
        run(conn, "done", 0, 3600, {"n1": [0, 1]}, site_name="eu", team="=cmd|calc")  # a formula-looking team
        run(
            conn, "going", 1800, 400 * 86400, {"n1": [2]}, site_name="eu", team="lm"
        )  # registered to end in 2028
        drain(conn)
    period = {"from": "2026-12-01T09:00:00Z", "to": "2026-12-01T12:00:00Z"}
    with api.client("finance") as c:
        got = {name: c.get(f"/v1/reports/{name}.csv", params=period) for name in ("runs", "finance", "focus")}
    for name, r in got.items():
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), (name, r.text)
    return {name: list(csv.DictReader(io.StringIO(r.text))) for name, r in got.items()}


def test_cells_are_plain_text_numbers_and_times(exports: dict[str, list[dict[str, str]]]) -> None:
    assert tuple(exports["runs"][0]) == CSV_COLUMNS and tuple(exports["finance"][0]) == FINANCE_COLUMN_NAMES
    assert tuple(exports["focus"][0]) == FOCUS_EXPORT_COLUMNS
    for name in ("runs", "finance"):
        for row in exports[name]:
            for col, cell in row.items():
                assert not REPR.search(cell), (name, col, cell)
                if col in TIMES and cell:
                    assert TIME.fullmatch(cell), (name, col, cell)
                if col in ("energy_cost", "compute_cost", "total_cost") and cell:
                    assert MONEY.fullmatch(cell), (name, col, cell)
                if re.fullmatch(r"[-+\d.eE]+", cell) and col not in TIMES:
                    assert NUMBER.fullmatch(cell), (name, col, cell)  # never exponent notation
    runs = {r["run_id"]: r for r in exports["runs"]}
    assert runs["done"]["team"] == "'=cmd|calc"  # never a formula
    assert runs["going"]["state"] == "running"
    assert runs["going"]["end"] == "" and runs["going"]["planned_end"] == "2028-01-05T10:00:00Z"
    for row in exports["focus"]:
        assert TIME.fullmatch(row["ChargePeriodStart"]) and TIME.fullmatch(row["BillingPeriodEnd"])
        assert NUMBER.fullmatch(row["BilledCost"]) and row["BillingCurrency"] == "EUR"
        assert row["Tags"].startswith("{") and row["ChargeCategory"] == "Usage"


def test_money_in_the_finance_report_adds_up_to_its_total(exports: dict[str, list[dict[str, str]]]) -> None:
    from decimal import Decimal

    fin = exports["finance"]
    parts = [r for r in fin if r["currency"] == "EUR" and r["row_type"] in ("run", "unallocated")]
    total = next(r for r in fin if r["row_type"] == "total" and r["currency"] == "EUR")
    for col in ("energy_cost", "compute_cost", "total_cost"):
        assert sum(Decimal(p[col]) for p in parts) == Decimal(total[col]), col
    for r in [*parts, total]:
        assert Decimal(r["energy_cost"]) + Decimal(r["compute_cost"]) == Decimal(r["total_cost"])
