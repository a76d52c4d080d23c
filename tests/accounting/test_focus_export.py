"""A FOCUS export of GPU run costs (issue 35 item 5): FinOps tools ingest it beside cloud bills, and it adds up
to the finance report."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import psycopg

from gpufleet.accounting import run_accounting
from gpufleet.accounting.focus import COLUMNS, FOCUS_COLUMNS, MAX_DAYS, focus_csv, focus_export
from gpufleet.accounting.report import finance_report
from tests.accounting.builders import approx, at, constant_power, gpu_samples, host_samples, node, run, site
from tests.api.conftest import Api

#: Columns FOCUS 1.x requires a provider to fill (not null).
REQUIRED = (
    "BilledCost",
    "BillingAccountId",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
)


def fill(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.257, gpu_hour=2.13, currency="EUR", carbon=380.0)
    node(conn, "e1", 4, "eu", facts={"gpu_model": "NVIDIA H100 80GB HBM3"})
    gpu_samples(conn, constant_power("e1", range(4), 433.3, 0, 2 * 86400, step_s=60.0, counter=True))
    host_samples(conn, [(float(t), "e1", 777.7) for t in range(0, 2 * 86400 + 1, 60)])
    run(conn, "pretrain", 0, 86400 + 7200, {"e1": [0, 1]}, site_name="eu", team="lm")  # across midnight UTC
    conn.execute(
        'UPDATE runs SET labels = \'{"slurm.account": "proj-7", "slurm.partition": "gpu"}\' '
        "WHERE run_id = 'pretrain'"
    )
    run(conn, "eval", 3600, 7200, {"e1": [2]}, site_name="eu", team="cv")


def test_rows_columns_and_what_they_add_up_to(conn: psycopg.Connection) -> None:
    fill(conn)
    period = (at(-36000), at(2 * 86400))
    now = at(2 * 86400)
    export = focus_export(conn, *period, now=now, source="raw")
    rows = list(csv.DictReader(io.StringIO(focus_csv(export))))
    assert tuple(rows[0]) == COLUMNS and COLUMNS[: len(FOCUS_COLUMNS)] == FOCUS_COLUMNS
    assert list(FOCUS_COLUMNS) == sorted(FOCUS_COLUMNS)  # the specification's order
    for r in rows:
        for col in REQUIRED:
            assert r[col] != "", (col, r)
        assert r["ChargeCategory"] == "Usage" and r["BillingCurrency"] == "EUR"
        assert r["BilledCost"] == r["EffectiveCost"] == r["ListCost"] == r["ContractedCost"]
        assert r["ChargePeriodStart"] < r["ChargePeriodEnd"] and r["ChargePeriodStart"].endswith("Z")
        assert json.loads(r["Tags"])["gpufleet/site"] == "eu"
    pre = [r for r in rows if r["ResourceId"] == "pretrain"]
    # a day per row: the run crosses midnight, so two charge periods for each of its two charges
    assert sorted({(r["ChargePeriodStart"], r["ChargePeriodEnd"]) for r in pre}) == [
        ("2026-12-01T10:00:00Z", "2026-12-02T00:00:00Z"),
        ("2026-12-02T00:00:00Z", "2026-12-02T12:00:00Z"),
    ]
    assert {r["ServiceName"] for r in pre} == {"GPU compute", "GPU energy"}
    tags = json.loads(pre[0]["Tags"])
    assert tags == {
        "gpufleet/run": "pretrain",
        "gpufleet/team": "lm",
        "gpufleet/site": "eu",
        "slurm.account": "proj-7",
        "slurm.partition": "gpu",
    }
    assert pre[0]["SubAccountId"] == "lm" and pre[0]["x_GpuModels"] == "NVIDIA H100 80GB HBM3"
    compute = [r for r in pre if r["ServiceName"] == "GPU compute"]
    assert sum(Decimal(r["ConsumedQuantity"]) for r in compute) == Decimal(26 * 2)
    assert {r["ConsumedUnit"] for r in compute} == {"GPU-Hours"} and all(
        r["ListUnitPrice"] == "2.13" for r in compute
    )
    # money as computed, not rounded to cents, and each run's rows add up to its accounting
    body = run_accounting(conn, "pretrain", now=now, source="raw")
    assert approx(float(sum(Decimal(r["BilledCost"]) for r in pre)), body["total_cost"], rel=1e-9)
    assert any(len(r["BilledCost"].split(".")[-1]) > 2 for r in pre)
    # everything together is the finance report's total, unallocated energy included
    total = next(
        r
        for r in finance_report(conn, *period, now=now, source="raw").rows
        if r["row_type"] == "total" and r["currency"] == "EUR"
    )
    assert abs(float(sum(Decimal(r["BilledCost"]) for r in rows)) - total["total_cost"]) <= 0.005
    assert any(r["ResourceId"] == "unallocated" for r in rows)
    whole = focus_export(conn, *period, now=now, source="raw", granularity="run").rows
    assert len([r for r in whole if r["ResourceId"] == "pretrain"]) == 2


def test_focus_csv_over_http(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        fill(conn)
    with api.client("finance") as c:
        r = c.get("/v1/reports/focus.csv", params={"from": "2026-12-01", "to": "2026-12-03"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
        assert "focus_20261201T000000_20261203T000000.csv" in r.headers["content-disposition"]
        assert r.text.splitlines()[0].split(",") == list(COLUMNS)
        assert (
            c.get(
                "/v1/reports/focus.csv",
                params={"from": "2026-12-01", "to": "2026-12-03", "granularity": "hour"},
            ).status_code
            == 422
        )
        # a daily export of centuries is refused before any work, naming the limit; per run it is answered
        ages = {"from": "0398-11-19T04:17:48+08:19", "to": "8420-10-21T08:15:47Z"}
        r = c.get("/v1/reports/focus.csv", params=ages)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "to"], r.text
        assert f"at most {MAX_DAYS} days" in r.json()["detail"][0]["msg"]
        r = c.get("/v1/reports/focus.csv", params={**ages, "granularity": "run"})
        assert r.status_code == 200 and "pretrain" in r.text, r.text
    with api.client("node") as c:
        assert (
            c.get("/v1/reports/focus.csv", params={"from": "2026-12-01", "to": "2026-12-02"}).status_code
            == 403
        )
