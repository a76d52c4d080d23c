"""The finance report: documented columns, a row per run (or site or team) and currency, the GPU time no run
held, a total that adds up to the cent, states as the API says them (issue 15 items 3, 4 and 5)."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

import psycopg

from gpufleet.accounting.report import FINANCE_COLUMN_NAMES, FINANCE_COLUMNS, finance_csv, finance_report
from gpufleet.store.runs import list_runs
from tests.accounting.builders import at, constant_power, gpu_samples, host_samples, node, run, site
from tests.api.conftest import Api


def fill(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.3, price=0.257, gpu_hour=2.13, currency="EUR", region="DE", carbon=380.0)
    site(conn, "us", pue=1.1, price=0.113, gpu_hour=1.97, currency="USD", carbon=410.0)
    node(conn, "e1", 4, "eu", facts={"gpu_model": "NVIDIA H100 80GB HBM3"})
    node(conn, "u1", 2, "us", facts={"gpu_model": "NVIDIA A100-SXM4-80GB"})
    for n, count in (("e1", 4), ("u1", 2)):
        gpu_samples(conn, constant_power(n, range(count), 433.3, 0, 5400, step_s=10.0, counter=True))
        host_samples(conn, [(float(t), n, 777.7) for t in range(0, 5401, 10)])
    run(conn, "pretrain", 0, 3600, {"e1": [0, 1, 2]}, site_name="eu", team="lm")
    run(conn, "eval", 1800, None, {"e1": [3]}, site_name="eu", team="lm")
    run(conn, "vision", 600, 4000, {"u1": [0]}, site_name="us", team="cv")
    run(conn, "next-week", 86400 * 9, None, {"u1": [1]}, site_name="us", team="cv")  # after now: pending


def test_rows_columns_and_totals(conn: psycopg.Connection) -> None:
    fill(conn)
    period = (at(0), at(86400 * 10))
    rep = finance_report(conn, *period, now=at(5400))
    text = finance_csv(rep)
    rows = list(csv.DictReader(io.StringIO(text)))
    for r in rows:  # plain decimals, no exponent, no float noise (324.79999999999995)
        for col, cell in r.items():
            if re.fullmatch(r"-?[\d.eE+-]+", cell) and col not in ("key", "start", "end"):
                assert re.fullmatch(r"-?\d+(\.\d{1,9})?", cell), (col, cell)
    assert list(rows[0]) == list(FINANCE_COLUMN_NAMES) == list(FINANCE_COLUMNS)
    kinds = [(r["row_type"], r["key"], r["currency"]) for r in rows]
    assert kinds == [
        ("run", "eval", "EUR"),
        ("run", "next-week", "USD"),
        ("run", "pretrain", "EUR"),
        ("run", "vision", "USD"),
        ("unallocated", "unallocated", "EUR"),
        ("unallocated", "unallocated", "USD"),
        ("no_telemetry", "no_telemetry", ""),
        ("total", "total", "EUR"),
        ("total", "total", "USD"),
        ("total", "all", ""),
    ]
    by_key = {(r["row_type"], r["key"], r["currency"]): r for r in rows}
    # states as GET /v1/runs says them at the same instant
    api_states = {r["run_id"]: r["state"] for r in list_runs(conn)}
    for r in rows[:4]:
        assert r["state"] == api_states[r["key"]] or (r["key"] == "eval" and r["state"] == "running")
    assert by_key[("run", "next-week", "USD")]["state"] == "pending"
    assert by_key[("run", "next-week", "USD")]["gpu_hours"] == "0"
    # money: minor digits only, and each total is the sum of the rows above it to the cent
    for r in rows:
        for col in ("energy_cost", "compute_cost", "total_cost"):
            assert r[col] == "" or re.fullmatch(r"-?\d+\.\d\d", r[col]), (col, r[col])
    for cur in ("EUR", "USD"):
        parts = [r for r in rows if r["currency"] == cur and r["row_type"] in ("run", "unallocated")]
        total = by_key[("total", "total", cur)]
        for col in ("energy_cost", "compute_cost", "total_cost"):
            assert sum(Decimal(p[col]) for p in parts) == Decimal(total[col]), (cur, col)
        assert Decimal(total["total_cost"]) == Decimal(total["energy_cost"]) + Decimal(total["compute_cost"])
    # hours: runs + unallocated + no telemetry = the fleet (6 GPUs over the report's window, up to now)
    hours = sum(
        Decimal(r["gpu_hours"]) for r in rows if r["row_type"] in ("run", "unallocated", "no_telemetry")
    )
    assert abs(hours - Decimal(by_key[("total", "all", "")]["gpu_hours"])) < Decimal("1e-7")
    assert abs(Decimal(by_key[("total", "all", "")]["gpu_hours"]) - Decimal(6 * 1.5)) < Decimal("1e-7")
    pretrain = by_key[("run", "pretrain", "EUR")]
    assert pretrain["gpu_models"] == "NVIDIA H100 80GB HBM3" and pretrain["gpu_count"] == "3"
    assert pretrain["carbon_regions"] == "DE" and pretrain["g_co2e_per_kwh"] == "380"
    assert pretrain["duration_s"] == "3600" and pretrain["pue"] == "1.3" and pretrain["coverage"] == "1"


def test_group_by_team_keeps_currencies_apart(conn: psycopg.Connection) -> None:
    fill(conn)
    rep = finance_report(conn, at(0), at(86400 * 10), group_by="team", now=at(5400))
    teams = [(r["row_type"], r["key"], r["currency"], r["runs"]) for r in rep.rows if r["row_type"] == "team"]
    assert teams == [("team", "cv", "USD", 2), ("team", "lm", "EUR", 2)]
    lm = next(r for r in rep.rows if r["key"] == "lm")
    runs = finance_report(conn, at(0), at(86400 * 10), now=at(5400)).rows
    assert Decimal(str(lm["total_cost"])) == sum(
        Decimal(str(r["total_cost"])) for r in runs if r["key"] in ("pretrain", "eval")
    )


def test_finance_report_over_http(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        fill(conn)
    with api.client("finance") as c:
        r = c.get(
            "/v1/reports/finance.csv", params={"from": "2026-12-01", "to": "2026-12-02", "group_by": "site"}
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
        assert "finance_site_20261201T000000_20261202T000000.csv" in r.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert [x["key"] for x in rows if x["row_type"] == "site"] == ["eu", "us"]
        j = c.get("/v1/reports/finance.json", params={"from": "2026-12-01", "to": "2026-12-02"}).json()
        assert j["from"] == "2026-12-01T00:00:00Z" and j["columns"] == FINANCE_COLUMNS
        assert {x["row_type"] for x in j["rows"]} == {"run", "unallocated", "no_telemetry", "total"}
        spec = c.get("/openapi.json").json()["paths"]["/v1/reports/finance.csv"]["get"]
        assert "lost_gpu_hours" in spec["responses"]["200"]["description"]
        assert c.get("/v1/reports/finance.csv", params={"from": "2026-12-01"}).status_code == 422
    with api.client("node") as c:
        assert (
            c.get("/v1/reports/finance.csv", params={"from": "2026-12-01", "to": "2026-12-02"}).status_code
            == 403
        )
