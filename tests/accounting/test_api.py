"""Accounting, fleet and report endpoints through the real API and database; roles; OpenAPI."""

from __future__ import annotations

import csv
import io
import json

import psycopg
import pytest

from gpufleet.accounting import CONTRACT_FIELDS, CSV_COLUMNS, run_accounting
from gpufleet.progress import ProgressError, report_progress
from tests.accounting.builders import KWH, approx, at, constant_power, drain, gpu_samples, node, run, site
from tests.api.conftest import Api


def fill(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "eu1", pue=1.25, price=0.2, gpu_hour=2.0, currency="EUR", carbon=300.0)
        node(conn, "n1", 8, "eu1")
        run(conn, "r1", 0, 3600, {"n1": [0, 1]}, site_name="eu1", team="lm")
        run(conn, "r2", 1800, 5400, {"n1": [2]}, site_name="eu1", team="cv")
        gpu_samples(conn, constant_power("n1", range(8), 400.0, 0, 7200, step_s=20))
        drain(conn)


def test_run_accounting_endpoint(api: Api) -> None:
    fill(api.db)
    with api.client("finance") as c:
        r = c.get("/v1/runs/r1/accounting")
        assert r.status_code == 200, r.text
        body = r.json()
        assert list(body)[: len(CONTRACT_FIELDS)] == list(CONTRACT_FIELDS)
        assert approx(body["gpu_kwh"], 2 * 400 * 3600 / KWH) and approx(body["facility_kwh"], 0.8 * 1.25)
        assert body["start"] == "2026-12-01T10:00:00Z" and body["end"] == "2026-12-01T11:00:00Z"
        assert body["currency"] == "EUR" and body["source"] == "rollup" and body.get("segments") is None
        with psycopg.connect(api.db, autocommit=True) as conn:
            direct = run_accounting(conn, "r1")
        assert body == json.loads(json.dumps(direct))  # exactly the function's body (replay writes it)
        seg = c.get("/v1/runs/r1/accounting", params={"segments": "true", "source": "raw"}).json()
        assert seg["source"] == "raw" and len(seg["segments"]) == 1
        clipped = c.get("/v1/runs/r1/accounting", params={"from": "2026-12-01T10:30:00Z"}).json()
        assert approx(clipped["gpu_hours"], 1.0)
        r = c.get("/v1/runs/nope/accounting")
        assert r.status_code == 404 and "nope" in r.text


@pytest.mark.parametrize(
    "path,params,bad",
    [
        ("/v1/runs/r1/accounting", {"from": "2026-12-01T10:00:00"}, "from"),
        ("/v1/runs/r1/accounting", {"source": "cache"}, "source"),
        ("/v1/accounting", {"from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00"}, "to"),
        ("/v1/accounting", {"to": "2026-12-01T11:00:00Z"}, "from"),
        ("/v1/accounting", {"from": "2026-12-01T12:00:00Z", "to": "2026-12-01T11:00:00Z"}, "to"),
        (
            "/v1/accounting",
            {"from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "group_by": "x"},
            "group_by",
        ),
        ("/v1/reports/runs.csv", {"from": "yesterday", "to": "2026-12-01T11:00:00Z"}, "from"),
    ],
)
def test_bad_parameters_are_named(api: Api, path: str, params: dict[str, str], bad: str) -> None:
    with api.client("finance") as c:
        r = c.get(path, params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", bad]


@pytest.mark.parametrize(
    "role,method,path,expected",
    [
        ("finance", "get", "/v1/runs/r1/accounting", 200),
        ("finance", "get", "/v1/accounting?from=2026-12-01T10:00:00Z&to=2026-12-01T12:00:00Z", 200),
        ("finance", "get", "/v1/reports/runs.csv?from=2026-12-01T10:00:00Z&to=2026-12-01T12:00:00Z", 200),
        ("sre", "get", "/v1/runs/r1/accounting", 200),
        ("finance", "post", "/v1/runs/r1/progress", 403),
        ("finance", "patch", "/v1/runs/r1", 403),
        ("finance", "post", "/v1/runs/r1/accounting", 405),
        ("node", "get", "/v1/runs/r1/accounting", 403),
        ("node", "get", "/v1/reports/runs.csv?from=2026-12-01T10:00:00Z&to=2026-12-01T12:00:00Z", 403),
        ("nobody", "get", "/v1/runs/r1/accounting", 401),
    ],
)
def test_roles(api: Api, role: str, method: str, path: str, expected: int) -> None:
    fill(api.db)
    with api.client(role) as c:
        r = c.request(method, path, json={"tokens": 1.0} if method != "get" else None)
        assert r.status_code == expected, r.text


def test_fleet_endpoint(api: Api) -> None:
    fill(api.db)
    with api.client("finance") as c:
        r = c.get(
            "/v1/accounting",
            params={"from": "2026-12-01T10:00:00Z", "to": "2026-12-01T12:00:00Z", "group_by": "team"},
        )
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["from"] == "2026-12-01T10:00:00Z" and [g["key"] for g in f["groups"]] == ["cv", "lm"]
    assert approx(f["total"]["gpu_kwh"], 8 * 400 * 7200 / KWH)
    assert approx(f["runs"]["gpu_kwh"] + f["unallocated"]["gpu_kwh"], f["total"]["gpu_kwh"], rel=1e-3)
    assert f["total"]["currency"] == "EUR" and f["total"]["costs_by_currency"]["EUR"]["compute_cost"] == 6.0


def test_runs_csv(api: Api) -> None:
    fill(api.db)
    with api.client("finance") as c:
        r = c.get(
            "/v1/reports/runs.csv", params={"from": "2026-12-01T10:30:00+00:00", "to": "2026-12-01T12:00:00Z"}
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.text)))
    assert tuple(rows[0]) == CSV_COLUMNS and rows[0][: len(CONTRACT_FIELDS)] == list(CONTRACT_FIELDS)
    by_id = {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert list(by_id) == ["r1", "r2"]  # by start; both overlap the period
    r1 = by_id["r1"]
    assert r1["start"] == "2026-12-01T10:00:00Z" and r1["window_start"] == "2026-12-01T10:30:00Z"
    assert float(r1["gpu_hours"]) == 1.0 and r1["gpu_count"] == "2" and r1["currency"] == "EUR"
    assert approx(float(r1["gpu_kwh"]), 2 * 400 * 1800 / KWH)
    assert all("e" not in v.lower() or not v[0].isdigit() for row in rows[1:] for v in row)  # no exponents
    assert r1["mfu"] == "" and r1["goodput"] == "1"


def test_openapi_documents_the_endpoints(api: Api) -> None:
    with api.client("nobody") as c:
        spec = c.get("/openapi.json").json()
    run_ok = spec["paths"]["/v1/runs/{run_id}/accounting"]["get"]["responses"]
    assert run_ok["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/RunAccounting")
    assert "404" in run_ok
    fleet = spec["paths"]["/v1/accounting"]["get"]
    assert fleet["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/FleetAccounting"
    )
    assert {p["name"] for p in fleet["parameters"]} == {"from", "to", "group_by", "source"}
    assert "text/csv" in spec["paths"]["/v1/reports/runs.csv"]["get"]["responses"]["200"]["content"]
    props = spec["components"]["schemas"]["RunAccounting"]["properties"]
    assert set(CONTRACT_FIELDS) <= set(props) and props["start"]["format"] == "date-time"


def test_progress_client_feeds_efficiency(api: Api) -> None:
    fill(api.db)
    with psycopg.connect(api.db, autocommit=True) as conn:
        conn.execute("UPDATE runs SET params = 1000000 WHERE run_id = 'r1'")
    report_progress(api.url, api.tokens["admin"], "r1", tokens=1e6, samples=10, time=at(1800))
    report_progress(api.url, api.tokens["admin"], "r1", tokens=3.6e6, time=at(3600))
    with pytest.raises(ProgressError, match="404"):
        report_progress(api.url, api.tokens["admin"], "nope", tokens=1.0)
    with pytest.raises(ProgressError, match="403"):
        report_progress(api.url, api.tokens["finance"], "r1", tokens=1.0)
    with pytest.raises(ProgressError, match="not sent"):
        report_progress("http://127.0.0.1:9", "x", "r1", tokens=1.0, timeout_s=1)
    with pytest.raises(ValueError):
        report_progress(api.url, "x", "r1")
    with api.client("finance") as c:
        e = c.get("/v1/runs/r1/accounting").json()["efficiency"]
    assert e["tokens"] == 3.6e6 and e["samples"] == 10 and approx(e["tokens_per_s"], 1000.0)
    assert approx(e["tokens_per_kwh"], 3.6e6 / (2 * 400 * 3600 / KWH))
