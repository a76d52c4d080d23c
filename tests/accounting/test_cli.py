"""``gpufleet report``: the finance export from the command line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import psycopg
from typer.testing import CliRunner

from gpufleet.accounting import CSV_COLUMNS
from gpufleet.cli import app
from tests.accounting.builders import KWH, approx, constant_power, gpu_samples, run, site

PERIOD = ["--from", "2026-12-01T10:00:00Z", "--to", "2026-12-01T12:00:00Z"]


def fill(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "s", price=0.5, currency="EUR")
        run(conn, "r1", 0, 3600, {"n1": [0]}, site_name="s")
        gpu_samples(conn, constant_power("n1", [0], 1000.0, 0, 3600))


def test_report_csv_and_json(db: str, tmp_path: Path) -> None:
    fill(db)
    runner = CliRunner()
    r = runner.invoke(app, ["report", *PERIOD, "--runs", "--db", db])
    assert r.exit_code == 0, r.output
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert tuple(rows[0]) == CSV_COLUMNS and rows[1][0] == "r1"
    assert rows[1][CSV_COLUMNS.index("energy_cost")] == "0.50"  # money with its minor digits
    out = tmp_path / "report.json"
    r = runner.invoke(
        app, ["report", *PERIOD, "--runs", "--format", "json", "--source", "raw", "--db", db, "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    body = json.loads(out.read_text())
    assert [b["run_id"] for b in body] == ["r1"] and approx(body[0]["gpu_kwh"], 3.6e6 / KWH)
    assert body[0]["source"] == "raw"
    # the finance report: the run, the GPU time no run held, the total; bare dates as UTC midnight
    r = runner.invoke(app, ["report", "--from", "2026-12-01", "--to", "2026-12-02", "--db", db])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    # n1 has no site: its idle hours are priced nowhere, so the whole fleet gets a row of its own
    assert [(x["row_type"], x["key"], x["currency"]) for x in rows] == [
        ("run", "r1", "EUR"),
        ("unallocated", "unallocated", ""),
        ("no_telemetry", "no_telemetry", ""),
        ("total", "total", "EUR"),
        ("total", "all", ""),
    ]
    assert rows[0]["total_cost"] == "0.50" and rows[3]["total_cost"] == "0.50" and rows[4]["total_cost"] == ""
    # the GPU joined at its first sample (10:00) and left a day after its last (11:00): 14 h of the day, not 24
    assert rows[2]["gpu_hours"] == "13" and rows[4]["gpu_hours"] == "14" and rows[0]["state"] == "ended"
    r = runner.invoke(
        app,
        [
            "report",
            "--from",
            "2026-12-01",
            "--to",
            "2026-12-02",
            "--group-by",
            "site",
            "--format",
            "json",
            "--db",
            db,
        ],
    )
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert (
        body["rows"][0]["row_type"] == "site"
        and body["rows"][0]["key"] == "s"
        and "coverage" in body["columns"]
    )


def test_report_refuses_bad_options(db: str) -> None:
    runner = CliRunner()
    for args, msg in (
        (["--from", "2026-12-01T10:00:00", "--to", "2026-12-01T12:00:00Z"], "--from"),
        (["--from", "2026-12-01T12:00:00Z", "--to", "2026-12-01T10:00:00Z"], "--to"),
        ([*PERIOD, "--format", "xml"], "--format"),
        ([*PERIOD, "--source", "cache"], "--source"),
        ([*PERIOD, "--group-by", "colour"], "--group-by"),
        (["--from", "1 Dec", "--to", "2026-12-02"], "--from"),
        (["--from", "2000-01-01", "--to", "2026-12-02", "--format", "focus"], "at most 3660 days"),
    ):
        r = runner.invoke(app, ["report", *args, "--db", db])
        assert r.exit_code == 2 and msg in r.output, r.output
