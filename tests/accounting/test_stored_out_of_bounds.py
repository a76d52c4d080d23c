"""A price no tariff has: refused on the way in, and, stored before the bounds existed, reported on the lines it
makes wrong instead of failing every report (issue 36 item 4, probe 5).

The probe: ``gpu_hour_price=1e300`` on an unused site was accepted; with one 10-minute run there,
``/v1/accounting``, both report CSVs, ``/finance`` and ``/runs`` answered 500 for everyone.
"""

from __future__ import annotations

import csv
import io
import json

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.accounting.builders import approx, constant_power, drain, gpu_samples, node, run, site
from tests.api.conftest import Api

PERIOD = {"from": "2026-12-01T09:00:00Z", "to": "2026-12-01T12:00:00Z"}
BOUNDS_SQL = (
    "num IS NULL OR CASE setting WHEN 'price_per_kwh' THEN num <= 1e6 WHEN 'gpu_hour_price' THEN num <= 1e8 "
    "ELSE true END"
)


def stored_before_the_bounds(conn: psycopg.Connection) -> None:
    """A database that took 1e300 before migration 0014: the value was stored, then the bound came NOT VALID."""
    conn.execute("ALTER TABLE site_settings DROP CONSTRAINT site_settings_bounds")
    site(conn, "typo", pue=1.1, price=0.25, gpu_hour=1e300, currency="EUR")
    conn.execute(
        f"ALTER TABLE site_settings ADD CONSTRAINT site_settings_bounds CHECK ({BOUNDS_SQL}) NOT VALID"
    )
    site(conn, "fine", pue=1.2, price=0.3, gpu_hour=2.0, currency="EUR")
    node(conn, "n1", 2, "typo")
    node(conn, "n2", 1, "fine")
    run(conn, "r-typo", 0, 600, {"n1": [0]}, site_name="typo", team="lm")  # the probe's 10-minute run
    run(conn, "r-fine", 0, 3600, {"n2": [0]}, site_name="fine", team="lm")
    gpu_samples(
        conn, constant_power("n1", [0, 1], 300.0, 0, 3600) + constant_power("n2", [0], 400.0, 0, 3600)
    )
    drain(conn)


def test_the_database_refuses_a_new_price_outside_its_bound(conn: psycopg.Connection) -> None:
    site(conn, "s", price=0.1, currency="EUR")
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO site_settings (site, setting, valid_from, num) VALUES "
            "('s', 'gpu_hour_price', now(), 1e300)"
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) VALUES ('X', now(), 1e9)")


def test_reports_stay_up_and_name_the_line_a_stored_price_makes_wrong(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        stored_before_the_bounds(conn)
    with api.client("finance") as c:
        r = c.get("/v1/accounting", params={**PERIOD, "group_by": "run"})
        assert r.status_code == 200, r.text
        fleet = r.json()
        typo = c.get("/v1/runs/r-typo/accounting")
        fine = c.get("/v1/runs/r-fine/accounting")
        runs_csv = c.get("/v1/reports/runs.csv", params=PERIOD)
        finance_csv = c.get("/v1/reports/finance.csv", params=PERIOD)
        finance_json = c.get("/v1/reports/finance.json", params=PERIOD)
    for resp in (typo, fine, runs_csv, finance_csv, finance_json):
        assert resp.status_code == 200, resp.text
    # the run at the site with the typo: energy priced as ever, compute not computed, and why
    t = typo.json()
    assert t["compute_cost"] is None and t["total_cost"] is None and t["gpu_hour_price"] is None
    assert approx(t["energy_cost"], 300 * 600 / 3.6e6 * 1.1 * 0.25)
    assert len(t["errors"]) == 1 and "gpu_hour_price" in t["errors"][0] and "1e+300" in t["errors"][0]
    assert "typo" in t["errors"][0] and "100,000,000" in t["errors"][0]
    assert t["costs_by_currency"]["EUR"]["compute_cost"] is None
    # the other run is untouched
    f = fine.json()
    assert f["errors"] == [] and approx(f["total_cost"], 400 * 3600 / 3.6e6 * 1.2 * 0.3 + 2.0)
    # the fleet: the group of the healthy run keeps its money, the total of the currency has none, and says why
    groups = {g["key"]: g for g in fleet["groups"]}
    assert approx(groups["r-fine"]["total_cost"], f["total_cost"]) and groups["r-typo"]["total_cost"] is None
    assert (
        fleet["total"]["total_cost"] is None
        and fleet["total"]["costs_by_currency"]["EUR"]["total_cost"] is None
    )
    assert any("r-typo" in e and "gpu_hour_price" in e for e in fleet["errors"])
    # the CSVs: empty money cells on the line concerned, the reason beside them, the rest as always
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(runs_csv.text))}
    assert rows["r-typo"]["compute_cost"] == "" and "gpu_hour_price" in rows["r-typo"]["errors"]
    assert rows["r-fine"]["total_cost"] == f"{f['total_cost']:.2f}" and rows["r-fine"]["errors"] == ""
    fin = {(r["row_type"], r["key"], r["currency"]): r for r in csv.DictReader(io.StringIO(finance_csv.text))}
    assert (
        fin[("run", "r-typo", "EUR")]["total_cost"] == ""
        and "1e+300" in fin[("run", "r-typo", "EUR")]["errors"]
    )
    assert fin[("run", "r-fine", "EUR")]["total_cost"] != ""
    assert (
        fin[("total", "total", "EUR")]["total_cost"] == ""
        and "r-typo" in fin[("total", "total", "EUR")]["errors"]
    )
    assert json.dumps(finance_json.json())  # a JSON body, not an error page
    # the pages finance and SREs read
    for role, path in (
        ("finance", "/finance?from=2026-12-01&to=2026-12-02"),
        ("sre", "/runs"),
        ("sre", "/runs/r-typo"),
    ):
        with httpx.Client(base_url=api.url, cookies={"gpufleet_token": api.tokens[role]}, timeout=30) as w:
            page = w.get(path)
        assert page.status_code == 200, (path, page.text[:500])


@pytest.mark.parametrize(
    "body,field",
    [
        ({"gpu_hour_price": 1e300}, "gpu_hour_price"),
        ({"price_per_kwh": 5e6}, "price_per_kwh"),
        ({"pue": 7.0}, "pue"),
        ({"carbon_g_per_kwh": 50_000.0}, "carbon_g_per_kwh"),
        ({"gpu_hour_prices": {"H100": 2e9}}, "gpu_hour_prices"),
    ],
)
def test_the_api_refuses_a_setting_outside_its_bound_and_names_the_bound(
    api: Api, body: dict, field: str
) -> None:
    with api.client("admin") as c:
        assert c.put("/v1/sites/s1", json={"price_per_kwh": 0.2, "currency": "EUR"}).status_code == 200
        for method in ("put", "patch"):
            r = c.request(method.upper(), "/v1/sites/s1", json={**body, "currency": "EUR"})
            assert r.status_code == 422, r.text
            detail = r.json()["detail"][0]
            assert detail["loc"][-1] == field and " is outside " in detail["msg"], detail
        assert c.get("/v1/sites/s1").json()["price_per_kwh"] == 0.2  # nothing was written
        r = c.put(
            "/v1/sites/s1/prices", json={"points": [{"time": "2026-12-01T00:00:00Z", "price_per_kwh": 1e300}]}
        )
        assert r.status_code == 422 and "1,000,000" in r.text
        r = c.put("/v1/carbon/DE", json={"points": [{"time": "2026-12-01T00:00:00Z", "g_co2e_per_kwh": 9e9}]})
        assert r.status_code == 422 and "5,000" in r.text


def test_the_cli_refuses_a_setting_outside_its_bound_and_names_the_bound(db: str) -> None:
    r = CliRunner().invoke(
        app, ["site", "set", "eu1", "--gpu-hour-price", "1e300", "--currency", "EUR", "--db", db]
    )
    assert r.exit_code == 2 and "--gpu-hour-price" in r.output and "100,000,000" in r.output, r.output
    r = CliRunner().invoke(
        app, ["site", "set", "eu1", "--gpu-model-price", "H100=1e12", "--currency", "EUR", "--db", db]
    )
    assert r.exit_code == 2 and "--gpu-model-price" in r.output and "H100" in r.output, r.output
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sites").fetchone() == (0,)
