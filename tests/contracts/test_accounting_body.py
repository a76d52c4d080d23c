"""docs/contracts.md section 3: the per-run accounting body and its extensions, field by field (type, unit, rule),
through the real API; ACCOUNTING.json is the same body (tests/contracts/test_replay_findings.py)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from gpufleet.accounting import CONTRACT_FIELDS
from gpufleet.waste import STATES
from tests.accounting.builders import KWH, constant_power, drain, gpu_samples, host_samples, node, run, site
from tests.api.conftest import Api
from tests.contracts import docs

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
PUE, PRICE, GPU_HOUR, CARBON = 1.25, 0.2741, 2.07, 350.0

#: (field, JSON type, unit or rule) of the contract's fields, in its order.
FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("run_id", (str,), "id"),
    ("start", (str,), "RFC 3339 UTC"),
    ("end", (str, type(None)), "RFC 3339 UTC"),
    ("gpu_count", (int,), "GPUs"),
    ("gpu_hours", (float, int), "h"),
    ("gpu_kwh", (float, int), "kWh"),
    ("host_kwh", (float, int), "kWh"),
    ("it_kwh", (float, int), "kWh"),
    ("pue", (float, int), "ratio"),
    ("facility_kwh", (float, int), "kWh"),
    ("co2e_kg", (float, int, type(None)), "kg"),
    ("energy_cost", (float, int, type(None)), "currency"),
    ("compute_cost", (float, int, type(None)), "currency"),
    ("total_cost", (float, int, type(None)), "currency"),
    ("currency", (str, type(None)), "ISO 4217"),
    ("coverage", (float, int), "0-1"),
)


def fill(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "eu", pue=PUE, price=PRICE, gpu_hour=GPU_HOUR, currency="EUR", carbon=CARBON)
        node(conn, "n1", 8, "eu")
        run(conn, "big", 0, 3600, {"n1": [0, 1]}, site_name="eu", team="lm")
        run(conn, "small", 0, 300, {"n1": [2]}, site_name="eu", team="cv")
        gpu_samples(
            conn,
            constant_power("n1", [0, 1], 400.0, 0, 3600, counter=True)
            + constant_power("n1", [2], 329.0, 0, 300),
        )
        host_samples(conn, [(float(t), "n1", 800.0) for t in range(0, 3601, 10)])
        drain(conn)


@pytest.fixture
def bodies(api: Api) -> dict[str, dict[str, Any]]:
    fill(api.db)
    with api.client("finance") as c:
        return {r: c.get(f"/v1/runs/{r}/accounting").json() for r in ("big", "small")}


def test_the_documented_fields_are_the_codes_and_come_first_in_order(
    bodies: dict[str, dict[str, Any]],
) -> None:
    published = [
        n.strip('"')
        for n in re.findall(r'"(\w+)"', docs.section("3. Per-run accounting").split("Definitions")[0])
    ]
    assert published == list(CONTRACT_FIELDS) == [f for f, _, _ in FIELDS]
    for body in bodies.values():
        assert list(body)[: len(CONTRACT_FIELDS)] == list(CONTRACT_FIELDS)
        for field, types, _ in FIELDS:
            assert isinstance(body[field], types) and not isinstance(body[field], bool), (field, body[field])


def test_each_field_follows_its_definition(bodies: dict[str, dict[str, Any]]) -> None:
    b = bodies["big"]
    assert b["run_id"] == "big" and RFC3339_UTC.fullmatch(b["start"]) and RFC3339_UTC.fullmatch(b["end"])
    assert b["gpu_count"] == 2 and b["gpu_hours"] == pytest.approx(2.0)  # duration × GPUs, h
    assert b["gpu_kwh"] == pytest.approx(2 * 400 * 3600 / KWH, rel=1e-9)  # counters, mJ -> kWh
    assert b["host_kwh"] == pytest.approx(800 * 3600 / KWH * 2 / 8, rel=1e-9)  # host × GPUs held / reported
    assert b["it_kwh"] == pytest.approx(b["gpu_kwh"] + b["host_kwh"], rel=1e-9)
    assert b["pue"] == PUE and b["facility_kwh"] == pytest.approx(b["it_kwh"] * PUE, rel=1e-9)
    assert b["co2e_kg"] == pytest.approx(b["facility_kwh"] * CARBON / 1000, rel=1e-9)
    assert b["energy_cost"] == pytest.approx(b["facility_kwh"] * PRICE, rel=1e-9, abs=1e-9)
    assert b["compute_cost"] == pytest.approx(b["gpu_hours"] * GPU_HOUR, rel=1e-9)
    assert b["total_cost"] == pytest.approx(b["energy_cost"] + b["compute_cost"], rel=1e-12)
    assert b["currency"] == "EUR" and 0.0 <= b["coverage"] <= 1.0 and b["coverage"] > 0.999


def test_money_carries_the_accountings_precision_not_minor_units(bodies: dict[str, dict[str, Any]]) -> None:
    """The issue's target: API money within 1e-4 of facility kWh × a flat price on a small run (0.0094 EUR
    here, which minor units would make 0.01: +6 %)."""
    s = bodies["small"]
    expected = (329 + 800 / 8) * 300 / KWH * PUE * PRICE  # its GPU and its share of the host
    assert abs(s["energy_cost"] - s["facility_kwh"] * PRICE) <= 1e-4
    assert abs(s["energy_cost"] - expected) <= 1e-9 and s["energy_cost"] != round(s["energy_cost"], 2)
    assert s["minor_units"] == 2  # for presentation only


def test_the_extensions_of_section_3_1(bodies: dict[str, dict[str, Any]]) -> None:
    b = bodies["big"]
    assert b["state"] in ("pending", "running", "ended") and b["planned_end"] is None
    assert RFC3339_UTC.fullmatch(b["window_start"]) and RFC3339_UTC.fullmatch(b["window_end"])
    assert b["duration_s"] == 3600.0 and b["gpu_equivalents"] == 2.0
    assert b["costs_by_currency"] == {
        "EUR": {
            "energy_cost": b["energy_cost"],
            "compute_cost": b["compute_cost"],
            "total_cost": b["total_cost"],
        }
    }
    assert b["errors"] == [] and isinstance(b["errors"], list)
    assert b["gpu_power_w"] == pytest.approx(800.0) and b["it_power_w"] == pytest.approx(1000.0)
    assert b["emissions_rate_kg_s"] == pytest.approx(b["co2e_kg"] / 3600, abs=1e-9)
    assert b["carbon_source"] == "site_constant" and b["carbon_method"] == "average"
    assert b["g_co2e_per_kwh"] == CARBON and b["co2e_unknown_kwh"] == 0.0
    assert b["price_source"] == "flat" and b["gpu_hour_price"] == GPU_HOUR
    for p in b["rates"]:
        assert {
            "from",
            "to",
            "pue",
            "price_per_kwh",
            "gpu_hour_price",
            "carbon_region",
            "carbon_g_per_kwh",
            "currency",
        } <= set(p)
    eff = b["efficiency"]
    for k in (
        "tokens",
        "samples",
        "tokens_per_s",
        "tokens_per_joule",
        "tokens_per_kwh",
        "params",
        "gpu_model",
        "peak_flops",
        "peak_dtype",
        "peak_sources",
        "mfu",
        "mfu_unchecked",
        "mfu_problem",
        "lost_gpu_hours",
        "goodput",
    ):
        assert k in eff, k


def test_incident_cost_and_ledger_extensions(bodies: dict[str, dict[str, Any]]) -> None:
    b = bodies["big"]
    lost = b["lost_to_incidents"]
    for k in (
        "gpu_hours",
        "gpu_kwh",
        "host_kwh",
        "it_kwh",
        "facility_kwh",
        "co2e_kg",
        "energy_cost",
        "compute_cost",
        "total_cost",
        "currency",
        "minor_units",
        "incidents",
    ):
        assert k in lost, k
    assert lost["currency"] == "EUR" and lost["gpu_hours"] <= b["gpu_hours"]
    ledger = b["ledger"]
    assert list(ledger) == list(STATES)
    assert set(STATES) == {
        "productive",
        "idle",
        "hung",
        "starved",
        "checkpoint",
        "straggler_wait",
        "throttled",
    }
    for key in ("gpu_hours", "gpu_kwh", "facility_kwh", "co2e_kg", "total_cost"):
        assert sum(ledger[s][key] for s in STATES) == pytest.approx(b[key], rel=1e-9, abs=1e-9), key


def test_the_fleet_view_adds_up(api: Api) -> None:
    fill(api.db)
    with api.client("finance") as c:
        f = c.get(
            "/v1/accounting", params={"from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z"}
        ).json()
    for block in ("runs", "unallocated", "no_telemetry", "total"):
        for k in (
            "runs",
            "gpu_hours",
            "gpu_kwh",
            "host_kwh",
            "it_kwh",
            "facility_kwh",
            "co2e_kg",
            "co2e_unknown_kwh",
            "energy_cost",
            "compute_cost",
            "total_cost",
            "currency",
            "costs_by_currency",
            "coverage",
        ):
            assert k in f[block], (block, k)
    assert f["errors"] == []
    hours = f["runs"]["gpu_hours"] + f["unallocated"]["gpu_hours"] + f["no_telemetry"]["gpu_hours"]
    assert hours == pytest.approx(f["total"]["gpu_hours"], rel=1e-9)
    for k in ("gpu_kwh", "facility_kwh", "co2e_kg"):
        assert f["runs"][k] + f["unallocated"][k] == pytest.approx(f["total"][k], rel=1e-6), k
    assert f["total"]["total_cost"] == pytest.approx(
        f["runs"]["total_cost"] + f["unallocated"]["total_cost"], rel=1e-12
    )
