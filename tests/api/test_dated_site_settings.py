"""Dated site settings: PUE and prices as series with a start time, per-model GPU-hour prices, the values in
force shown with the accounting, and period bounds as bare dates (issue 15 items 2, 5 and 10)."""

from __future__ import annotations

from pathlib import Path

import psycopg
from typer.testing import CliRunner

from gpufleet.accounting import run_accounting
from gpufleet.cli import app
from tests.accounting.builders import KWH, approx, at, constant_power, gpu_samples, node, run, site
from tests.api.conftest import Api


def test_a_pue_series_prices_each_part_of_a_run_with_the_value_in_force(api: Api, tmp_path: Path) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        site(conn, "dc", pue=1.2, price=0.10, currency="EUR", carbon=100.0)
        node(conn, "n1", 1, "dc")
        run(conn, "r", 0, 7200, {"n1": [0]}, site_name="dc")
        gpu_samples(conn, constant_power("n1", [0], 1000.0, 0, 7200))
    csv = tmp_path / "pue.csv"
    csv.write_text("time,pue\n2026-12-01T11:00:00Z,1.5\n2026-12-02T00:00:00Z,1.3\n")
    r = CliRunner().invoke(app, ["site", "pue-load", "dc", str(csv), "--db", api.db])
    assert r.exit_code == 0 and "loaded 2 PUE points for dc" in r.output, r.output
    with api.client("finance") as c:
        a = c.get("/v1/runs/r/accounting").json()
    # 1 kWh per hour: the first hour at PUE 1.2, the second at 1.5
    assert approx(a["it_kwh"], 2.0) and approx(a["facility_kwh"], 1.2 + 1.5) and approx(a["pue"], 1.35)
    assert a["energy_cost"] == 0.27 and a["currency"] == "EUR"
    assert [(p["from"], p["pue"]) for p in a["rates"]] == [
        ("2026-12-01T10:00:00Z", 1.2),
        ("2026-12-01T11:00:00Z", 1.5),
    ]
    with api.client("admin") as c:
        r2 = c.put("/v1/sites/dc/pue", json={"points": [{"time": "2026-12-01T10:30:00Z", "pue": 1.4}]})
        assert r2.status_code == 200 and r2.json() == {"site": "dc", "points": 1}
        assert (
            c.put(
                "/v1/sites/dc/pue", json={"points": [{"time": "2026-12-01T10:30:00Z", "pue": 0.9}]}
            ).status_code
            == 422
        )
        history = c.get("/v1/sites/dc/history").json()
    assert [(h["valid_from"], h["value"]) for h in history if h["setting"] == "pue"] == [
        (None, 1.2),
        ("2026-12-01T10:30:00Z", 1.4),
        ("2026-12-01T11:00:00Z", 1.5),
        ("2026-12-02T00:00:00Z", 1.3),
    ]
    with api.client("finance") as c:
        assert approx(c.get("/v1/runs/r/accounting").json()["facility_kwh"], 0.5 * 1.2 + 0.5 * 1.4 + 1.5)
        assert c.get("/v1/sites/dc", params={"at": "2026-12-01T10:45:00Z"}).json()["pue"] == 1.4


def test_a_bad_series_file_names_every_bad_row_at_once(api: Api, tmp_path: Path) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        site(conn, "dc")
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "time,pue\n2026-12-01T00:00:00Z,1.2\n2026-12-01,x\n2026-13-01T00:00:00Z,1.1\n"
        "2026-12-01T00:00:00Z,1.3\n2026-12-02T00:00:00Z,0.7\n"
    )
    r = CliRunner().invoke(app, ["site", "pue-load", "dc", str(bad), "--db", api.db])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    for piece in (
        "4 bad rows",
        "line 3, column 'pue': not a number",
        "line 4, column 'time'",
        "line 5, column 'time': 2026-12-01T00:00:00Z is also on line 2",
        "line 6, column 'pue': 0.7",
        "nothing loaded",
    ):
        assert piece in r.output, (piece, r.output)
    carbon = tmp_path / "carbon.csv"
    carbon.write_text(
        "time,g_co2e_per_kwh\n2026-12-01T00:00:00Z,100\n2026-12-01T00:00:00+00:00,120\n"
        "2026-12-01T01:00:00Z,-5\nnot-a-time,100\n"
    )
    r = CliRunner().invoke(app, ["carbon", "load", "DE", str(carbon), "--db", api.db])
    assert r.exit_code == 2 and "3 bad rows" in r.output and "also on line 2" in r.output, r.output
    assert "-5.0 is outside" in r.output and "line 5, column 'time'" in r.output
    with psycopg.connect(api.db) as conn:
        assert conn.execute("SELECT count(*) FROM carbon_intensity").fetchone() == (0,)


def test_an_h100_hour_does_not_cost_what_an_a100_hour_costs(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        node(conn, "h", 8, None, facts={"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]})
        node(conn, "a", 8, None, facts={"gpu_model": "NVIDIA A100-SXM4-80GB"})
    with api.client("admin") as c:
        r = c.put(
            "/v1/sites/lab",
            json={"gpu_hour_price": 1.0, "gpu_hour_prices": {"H100": 3.0, "A100": 2.0}, "currency": "USD"},
        )
        assert r.status_code == 200 and r.json()["gpu_hour_prices"] == {"A100": 2.0, "H100": 3.0}, r.text
        for rid, n in (("on-h100", "h"), ("on-a100", "a")):
            assert (
                c.post(
                    "/v1/runs",
                    json={
                        "run_id": rid,
                        "site": "lab",
                        "start": "2026-12-01T10:00:00Z",
                        "end": "2026-12-01T12:00:00Z",
                        "allocations": [{"node": n, "gpus": [0]}],
                    },
                ).status_code
                == 201
            )
        # the H100 price rises from 11:00 (dated back on purpose)
        assert (
            c.patch(
                "/v1/sites/lab",
                params={"from": "2026-12-01T11:00:00Z"},
                json={"gpu_hour_prices": {"H100": 5.0}},
            ).status_code
            == 200
        )
        assert c.patch("/v1/sites/lab", json={"gpu_hour_prices": {"H100": -1}}).status_code == 422
    with api.client("finance") as c:
        h = c.get("/v1/runs/on-h100/accounting").json()
        a = c.get("/v1/runs/on-a100/accounting").json()
    assert h["compute_cost"] == 3.0 + 5.0 and a["compute_cost"] == 4.0
    assert h["gpu_models"][0]["model"] == "NVIDIA H100 80GB HBM3" and h["gpu_hour_price"] == 4.0
    assert {(p["gpu_model"], p["from"], p["gpu_hour_price"]) for p in h["gpu_model_prices"]} == {
        ("H100", "2026-12-01T10:00:00Z", 3.0),
        ("H100", "2026-12-01T11:00:00Z", 5.0),
    }


def test_period_bounds_take_bare_dates_or_say_the_format(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        site(conn, "dc", gpu_hour=1.0)
        run(conn, "r", 0, 3600, {"n1": [0]}, site_name="dc")
    with api.client("finance") as c:
        r = c.get("/v1/accounting", params={"from": "2026-12-01", "to": "2026-12-02"})
        assert r.status_code == 200, r.text
        assert r.json()["from"] == "2026-12-01T00:00:00Z" and r.json()["runs"]["runs"] == 1
        r = c.get("/v1/reports/runs.csv", params={"from": "2026-12-01", "to": "2026-12-02"})
        assert r.status_code == 200 and "\nr," in r.text
        for bad in ("2026-12-01T10:00:00", "yesterday", "12/01/2026"):
            r = c.get("/v1/accounting", params={"from": bad, "to": "2026-12-02"})
            assert r.status_code == 422, bad
            msg = r.json()["detail"][0]["msg"]
            assert (
                "RFC 3339" in msg
                and "2026-12-01" in msg
                and r.json()["detail"][0]["loc"] == ["query", "from"]
            )
    with psycopg.connect(api.db, autocommit=True) as conn:
        a = run_accounting(conn, "r", now=at(9999))
    assert approx(a["gpu_kwh"], 0.0) and approx(a["gpu_hours"], 1.0) and KWH > 0
