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
    r = runner.invoke(app, ["report", *PERIOD, "--db", db])
    assert r.exit_code == 0, r.output
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert tuple(rows[0]) == CSV_COLUMNS and rows[1][0] == "r1"
    assert approx(float(rows[1][CSV_COLUMNS.index("energy_cost")]), 0.5)
    out = tmp_path / "report.json"
    r = runner.invoke(app, ["report", *PERIOD, "--format", "json", "--source", "raw", "--db", db, "-o", str(out)])
    assert r.exit_code == 0, r.output
    body = json.loads(out.read_text())
    assert [b["run_id"] for b in body] == ["r1"] and approx(body[0]["gpu_kwh"], 3.6e6 / KWH)
    assert body[0]["source"] == "raw"


def test_report_refuses_bad_options(db: str) -> None:
    runner = CliRunner()
    for args, msg in (
        (["--from", "2026-12-01T10:00:00", "--to", "2026-12-01T12:00:00Z"], "--from"),
        (["--from", "2026-12-01T12:00:00Z", "--to", "2026-12-01T10:00:00Z"], "--to"),
        ([*PERIOD, "--format", "xml"], "--format"),
        ([*PERIOD, "--source", "cache"], "--source"),
    ):
        r = runner.invoke(app, ["report", *args, "--db", db])
        assert r.exit_code == 2 and msg in r.output, r.output
