"""A partial `site set` / PATCH changes only the fields given; PUT replaces the site and says so (issue 15 item 2)."""

from __future__ import annotations

import json

import psycopg
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.accounting.builders import constant_power, gpu_samples, run
from tests.api.conftest import Api

FULL = {"pue": 1.3, "price_per_kwh": 0.25, "gpu_hour_price": 2.0, "currency": "USD", "carbon_region": "DE",
        "carbon_g_per_kwh": 400.0}


def _cost(api: Api) -> dict:
    with api.client("finance") as c:
        r = c.get("/v1/runs/demo-pretrain/accounting")
        assert r.status_code == 200, r.text
        return r.json()


def _fill(api: Api) -> None:
    with api.client("admin") as c:
        assert c.put("/v1/sites/lab-a", json=FULL).status_code == 200
    with psycopg.connect(api.db, autocommit=True) as conn:
        run(conn, "demo-pretrain", 0, 3600, {"h100-01": [0]}, site_name="lab-a")
        gpu_samples(conn, constant_power("h100-01", [0], 500.0, 0, 3600))


def test_cli_site_set_currency_keeps_everything_else(api: Api) -> None:
    _fill(api)
    before = _cost(api)
    assert before["total_cost"] > 0 and before["co2e_kg"] is not None and before["pue"] == 1.3
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--currency", "EUR", "--db", api.db])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"site": "lab-a", **FULL, "currency": "EUR"}
    after = _cost(api)
    for k in ("pue", "facility_kwh", "co2e_kg", "energy_cost", "compute_cost", "total_cost"):
        assert after[k] == before[k], k
    assert after["currency"] == "EUR"
    # a new site from the CLI takes the defaults for what is not given
    r = CliRunner().invoke(app, ["site", "set", "lab-b", "--pue", "1.1", "--db", api.db])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"site": "lab-b", "pue": 1.1, "price_per_kwh": 0.0, "gpu_hour_price": 0.0,
                                    "currency": "USD", "carbon_region": None, "carbon_g_per_kwh": None}
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--carbon-region", "", "--clear-carbon-g-per-kwh",
                                 "--db", api.db])
    assert r.exit_code == 0 and json.loads(r.stdout)["carbon_region"] is None, r.output
    assert json.loads(r.stdout)["carbon_g_per_kwh"] is None and json.loads(r.stdout)["pue"] == 1.3
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--pue", "0.5", "--db", api.db])
    assert r.exit_code == 2 and "--pue" in r.output


def test_patch_changes_only_the_fields_given(api: Api) -> None:
    _fill(api)
    before = _cost(api)
    with api.client("admin") as c:
        r = c.patch("/v1/sites/lab-a", json={"currency": "EUR"})
        assert r.status_code == 200 and r.json() == {"site": "lab-a", **FULL, "currency": "EUR"}, r.text
        r = c.patch("/v1/sites/lab-a", json={"carbon_g_per_kwh": None, "gpu_hour_price": 3.0})
        assert r.status_code == 200 and r.json()["carbon_g_per_kwh"] is None and r.json()["pue"] == 1.3
        r = c.patch("/v1/sites/lab-a", json={"pue": None})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pue"]
        r = c.patch("/v1/sites/lab-a", json={"pue": 0.9})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pue"]
        assert c.patch("/v1/sites/nowhere", json={"pue": 1.2}).status_code == 404
        assert c.patch("/v1/sites/lab-a", json={"colour": "red"}).status_code == 422
    with api.client("sre") as c:
        assert c.patch("/v1/sites/lab-a", json={"pue": 2.0}).status_code == 403
    after = _cost(api)
    assert after["energy_cost"] == before["energy_cost"] and after["gpu_hour_price"] == 3.0
    assert after["pue"] == 1.3


def test_put_replaces_the_site_and_names_the_defaulted_fields(api: Api) -> None:
    _fill(api)
    with api.client("admin") as c:
        r = c.put("/v1/sites/lab-a", json={"currency": "EUR"})
        assert r.status_code == 200
        assert r.headers["Gpufleet-Defaulted-Fields"].split(",") == [
            "pue", "price_per_kwh", "gpu_hour_price", "carbon_region", "carbon_g_per_kwh"]
        assert r.json() == {"site": "lab-a", "pue": 1.0, "price_per_kwh": 0.0, "gpu_hour_price": 0.0,
                            "currency": "EUR", "carbon_region": None, "carbon_g_per_kwh": None}
        r = c.put("/v1/sites/lab-a", json=FULL)
        assert "Gpufleet-Defaulted-Fields" not in r.headers
        spec = c.get("/openapi.json").json()["paths"]["/v1/sites/{site}"]
        assert "whole" in spec["put"]["description"] and "only" in spec["patch"]["description"]
