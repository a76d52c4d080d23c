"""No silent currency: a site with a price needs one, and a currency change is dated like every other setting
(issue 35 item 7)."""

from __future__ import annotations

import json

import psycopg
from typer.testing import CliRunner

from gpufleet.accounting import fleet_accounting, run_accounting
from gpufleet.accounting.report import finance_report
from gpufleet.cli import app
from tests.accounting.builders import KWH, approx, at, constant_power, gpu_samples, node, run
from tests.api.conftest import Api


def test_the_readme_command_without_a_currency_is_refused_naming_it(db: str) -> None:
    r = CliRunner().invoke(
        app,
        [
            "site",
            "set",
            "eu1",
            "--pue",
            "1.2",
            "--price-per-kwh",
            "0.25",
            "--gpu-hour-price",
            "2",
            "--carbon-region",
            "DE",
            "--db",
            db,
        ],
    )
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--currency" in r.output and "never assumed" in r.output
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sites").fetchone() == (0,)  # nothing half-written
    r = CliRunner().invoke(
        app,
        [
            "site",
            "set",
            "eu1",
            "--pue",
            "1.2",
            "--price-per-kwh",
            "0.25",
            "--gpu-hour-price",
            "2",
            "--carbon-region",
            "DE",
            "--currency",
            "EUR",
            "--db",
            db,
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["currency"] == "EUR"


def test_a_site_without_prices_has_no_currency_until_given_one(api: Api) -> None:
    with api.client("admin") as c:
        r = c.put("/v1/sites/lab", json={"pue": 1.3})
        assert r.status_code == 200 and r.json()["currency"] is None, r.text
        r = c.patch("/v1/sites/lab", json={"price_per_kwh": 0.3})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "currency"], r.text
        assert "--currency" in r.json()["detail"][0]["msg"]
        r = c.put(
            "/v1/sites/lab/prices", json={"points": [{"time": "2026-12-01T00:00:00Z", "price_per_kwh": 0.3}]}
        )
        assert r.status_code == 422 and "currency" in r.text
        r = c.put("/v1/sites/lab2", json={"gpu_hour_prices": {"H100": 3.0}})
        assert r.status_code == 422 and "currency" in r.text
        # given with the first price, the currency is the site's from the beginning: nothing was priced before
        r = c.patch("/v1/sites/lab", json={"price_per_kwh": 0.3, "currency": "EUR"})
        assert r.status_code == 200 and r.json()["currency"] == "EUR", r.text
        assert c.get("/v1/sites/lab", params={"at": "2020-01-01"}).json()["currency"] == "EUR"


def test_a_currency_change_holds_from_its_time_and_splits_a_run_across_it(api: Api) -> None:
    with api.client("admin") as c:
        assert (
            c.put(
                "/v1/sites/eu",
                json={"pue": 1.0, "price_per_kwh": 0.2, "gpu_hour_price": 2.0, "currency": "EUR"},
            ).status_code
            == 200
        )
    with psycopg.connect(api.db, autocommit=True) as conn:
        node(conn, "n1", 1, "eu")
        run(conn, "before", 0, 3600, {"n1": [0]}, site_name="eu")
        run(conn, "across", 3600, 3 * 3600, {"n1": [0]}, site_name="eu")
        gpu_samples(conn, constant_power("n1", [0], 1000.0, 0, 4 * 3600))
    with api.client("admin") as c:
        # from 2 h on, the site prices in USD: its prices must be given in USD too
        r = c.patch("/v1/sites/eu", params={"from": at(7200).isoformat()}, json={"currency": "USD"})
        assert r.status_code == 422 and "price_per_kwh" in r.text and "gpu_hour_price" in r.text
        r = c.patch(
            "/v1/sites/eu",
            params={"from": at(7200).isoformat()},
            json={"currency": "USD", "price_per_kwh": 0.25, "gpu_hour_price": 2.5},
        )
        assert r.status_code == 200, r.text
        history = c.get("/v1/sites/eu/history").json()
    assert [(h["valid_from"], h["value"]) for h in history if h["setting"] == "currency"] == [
        ("2026-12-01T12:00:00Z", "USD")
    ]
    with psycopg.connect(api.db, autocommit=True) as conn:
        before = run_accounting(conn, "before", now=at(5 * 3600), source="raw")
        across = run_accounting(conn, "across", now=at(5 * 3600), source="raw")
        report = finance_report(conn, at(0), at(5 * 3600), now=at(5 * 3600), source="raw")
        fleet = fleet_accounting(conn, at(0), at(5 * 3600), now=at(5 * 3600), source="raw")
    # the run before the change keeps its currency and its amounts
    assert (
        before["currency"] == "EUR"
        and approx(before["total_cost"], 1.0 * 0.2 + 2.0)
        and before["errors"] == []
    )
    # the run across it: one hour in EUR, one in USD, never added together
    assert across["currency"] is None and across["total_cost"] is None
    assert set(across["costs_by_currency"]) == {"EUR", "USD"}
    assert approx(across["costs_by_currency"]["EUR"]["total_cost"], 1000 * 3600 / KWH * 0.2 + 2.0)
    assert approx(across["costs_by_currency"]["USD"]["total_cost"], 1000 * 3600 / KWH * 0.25 + 2.5)
    assert approx(across["gpu_kwh"], 2.0) and approx(across["gpu_hours"], 2.0)  # energy and time are whole
    assert "currency" in across["errors"][0]
    rows = [(r["row_type"], r["key"], r["currency"]) for r in report.rows if r["row_type"] == "run"]
    assert rows == [("run", "across", "EUR"), ("run", "across", "USD"), ("run", "before", "EUR")]
    by = {(r["key"], r["currency"]): r for r in report.rows if r["row_type"] == "run"}
    assert by[("across", "EUR")]["total_cost"] == 2.2 and by[("across", "USD")]["total_cost"] == 2.75
    assert approx(fleet["runs"]["costs_by_currency"]["USD"]["total_cost"], 2.75)
    assert approx(fleet["runs"]["costs_by_currency"]["EUR"]["total_cost"], 2.2 + 2.2)


def test_a_carbon_series_says_whether_it_is_average_or_marginal(api: Api) -> None:
    """Which carbon method a series uses is recorded with it and reported (issue 35 item 4)."""
    with api.client("admin") as c:
        r = c.put(
            "/v1/carbon/CAISO",
            json={
                "method": "marginal",
                "name": "California (CAISO)",
                "points": [{"time": "2026-12-01T00:00:00Z", "g_co2e_per_kwh": 420.0}],
            },
        )
        assert r.status_code == 200, r.text
        assert (
            c.put(
                "/v1/carbon/DE", json={"points": [{"time": "2026-12-01T00:00:00Z", "g_co2e_per_kwh": 380.0}]}
            ).status_code
            == 200
        )
        assert (
            c.put(
                "/v1/carbon/DE",
                json={
                    "method": "hourly",
                    "points": [{"time": "2026-12-01T00:00:00Z", "g_co2e_per_kwh": 380.0}],
                },
            ).status_code
            == 422
        )
        assert (
            c.put(
                "/v1/sites/ca", json={"price_per_kwh": 0.2, "currency": "USD", "carbon_region": "CAISO"}
            ).status_code
            == 200
        )
    with api.client("finance") as c:
        got = c.get("/v1/carbon/CAISO").json()
        assert (got["method"], got["name"], got["provider"]) == ("marginal", "California (CAISO)", "api")
        assert c.get("/v1/carbon/DE").json()["method"] == "average"  # a first series without one: average
    with psycopg.connect(api.db, autocommit=True) as conn:
        node(conn, "n1", 1, "ca")
        run(conn, "r", 0, 3600, {"n1": [0]}, site_name="ca")
        gpu_samples(conn, constant_power("n1", [0], 500.0, 0, 3600))
    with api.client("finance") as c:
        body = c.get("/v1/runs/r/accounting").json()
    assert body["carbon_method"] == "marginal"
    assert body["carbon_series"] == [{"region": "CAISO", "method": "marginal", "name": "California (CAISO)"}]
