"""A partial `site set` / PATCH changes only the fields given; PUT replaces the site and says so (issue 15 item 2)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.accounting.builders import constant_power, gpu_samples, run
from tests.api.conftest import Api

FULL = {
    "pue": 1.3,
    "price_per_kwh": 0.25,
    "gpu_hour_price": 2.0,
    "currency": "USD",
    "carbon_region": "DE",
    "carbon_g_per_kwh": 400.0,
}
MONEY = ("pue", "facility_kwh", "co2e_kg", "energy_cost", "compute_cost", "total_cost")


def _settings(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("as_of", "gpu_hour_prices")}


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


def test_cli_site_set_changes_one_setting_from_now(api: Api) -> None:
    _fill(api)
    before = _cost(api)
    assert before["total_cost"] > 0 and before["co2e_kg"] is not None and before["pue"] == 1.3
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--pue", "1.5", "--db", api.db])
    assert r.exit_code == 0, r.output
    assert _settings(json.loads(r.stdout)) == {"site": "lab-a", **FULL, "pue": 1.5}
    assert "from now" in r.stderr and "keeps the values in force" in r.stderr
    after = _cost(api)
    for k in MONEY:  # the run is in the past: nothing of it changes
        assert after[k] == before[k], k
    # a currency alone would relabel the prices in force: refused in one line naming them, nothing changed
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--currency", "EUR", "--db", api.db])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--currency" in r.output and "never converted" in r.output
    assert "--price-per-kwh" in r.output and "--gpu-hour-price" in r.output
    assert _cost(api)["currency"] == "USD"
    # a new site from the CLI takes the defaults for what is not given, from the beginning
    r = CliRunner().invoke(app, ["site", "set", "lab-b", "--pue", "1.1", "--currency", "EUR", "--db", api.db])
    assert r.exit_code == 0, r.output
    assert _settings(json.loads(r.stdout)) == {
        "site": "lab-b",
        "pue": 1.1,
        "price_per_kwh": 0.0,
        "gpu_hour_price": 0.0,
        "currency": "EUR",
        "carbon_region": None,
        "carbon_g_per_kwh": None,
    }
    r = CliRunner().invoke(
        app, ["site", "set", "lab-a", "--carbon-region", "", "--clear-carbon-g-per-kwh", "--db", api.db]
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["carbon_region"] is None, r.output
    assert json.loads(r.stdout)["carbon_g_per_kwh"] is None and json.loads(r.stdout)["pue"] == 1.5
    assert _cost(api)["co2e_kg"] == before["co2e_kg"]  # still the past's intensity
    r = CliRunner().invoke(app, ["site", "set", "lab-a", "--pue", "0.5", "--db", api.db])
    assert r.exit_code == 2 and "--pue" in r.output
    r = CliRunner().invoke(
        app, ["site", "set", "lab-a", "--pue", "1.2", "--from", "yesterday", "--db", api.db]
    )
    assert r.exit_code == 2 and "--from" in r.output and "2026-12-01" in r.output


def test_patch_changes_only_the_fields_given(api: Api) -> None:
    _fill(api)
    before = _cost(api)
    with api.client("admin") as c:
        r = c.patch("/v1/sites/lab-a", json={"carbon_g_per_kwh": None, "gpu_hour_price": 3.0})
        assert r.status_code == 200 and r.json()["carbon_g_per_kwh"] is None and r.json()["pue"] == 1.3, (
            r.text
        )
        assert _settings(r.json()) == {
            "site": "lab-a",
            **FULL,
            "carbon_g_per_kwh": None,
            "gpu_hour_price": 3.0,
        }
        r = c.patch("/v1/sites/lab-a", json={"pue": None})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pue"]
        r = c.patch("/v1/sites/lab-a", json={"pue": 0.9})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pue"]
        assert c.patch("/v1/sites/nowhere", json={"pue": 1.2}).status_code == 404
        assert c.patch("/v1/sites/lab-a", json={"colour": "red"}).status_code == 422
        r = c.patch("/v1/sites/lab-a", json={"currency": "EUR"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "currency"], r.text
        assert "price_per_kwh" in r.json()["detail"][0]["msg"]
    with api.client("sre") as c:
        assert c.patch("/v1/sites/lab-a", json={"pue": 2.0}).status_code == 403
    after = _cost(api)
    for k in MONEY:  # changes from now leave the past alone
        assert after[k] == before[k], k
    # dated back on purpose: the run's compute is repriced, its energy is not
    with api.client("admin") as c:
        r = c.patch("/v1/sites/lab-a", params={"from": "2026-12-01"}, json={"gpu_hour_price": 3.0})
        assert r.status_code == 200, r.text
    back = _cost(api)
    assert (
        back["gpu_hour_price"] == 3.0
        and back["compute_cost"] == 3.0
        and back["energy_cost"] == after["energy_cost"]
    )


def test_put_replaces_the_site_from_now_and_says_so(api: Api) -> None:
    _fill(api)
    before = _cost(api)
    with api.client("admin") as c:
        assert (
            c.patch("/v1/sites/lab-a", params={"from": "2027-01-01T00:00:00Z"}, json={"pue": 1.9}).status_code
            == 200
        )
        r = c.put("/v1/sites/lab-a", json={"currency": "USD"})
        assert r.status_code == 200
        assert r.headers["Gpufleet-Defaulted-Fields"].split(",") == [
            "pue",
            "price_per_kwh",
            "gpu_hour_price",
            "carbon_region",
            "carbon_g_per_kwh",
        ]
        assert r.headers["Gpufleet-Replaced-From"].startswith("2026-")
        assert _settings(r.json()) == {
            "site": "lab-a",
            "pue": 1.0,
            "price_per_kwh": 0.0,
            "gpu_hour_price": 0.0,
            "currency": "USD",
            "carbon_region": None,
            "carbon_g_per_kwh": None,
        }
        # the change scheduled for 2027 went with the replacement
        assert c.get("/v1/sites/lab-a", params={"at": "2027-02-01"}).json()["pue"] == 1.0
        # and what was in force before stays readable
        assert _settings(c.get("/v1/sites/lab-a", params={"at": "2026-12-01T10:30:00Z"}).json()) == {
            "site": "lab-a",
            **FULL,
        }
        r = c.put("/v1/sites/lab-a", json=FULL)
        assert "Gpufleet-Defaulted-Fields" not in r.headers
        r = c.put("/v1/sites/lab-new", json={"pue": 1.2})
        assert r.headers["Gpufleet-Replaced-From"] == "beginning"
        spec = c.get("/openapi.json").json()["paths"]["/v1/sites/{site}"]
        assert "whole" in spec["put"]["description"] and "only" in spec["patch"]["description"]
    after = _cost(api)
    for k in MONEY:  # replaced from now: the past run is priced as before
        assert after[k] == before[k], k
