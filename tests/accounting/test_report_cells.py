"""runs.csv and finance.csv read cleanly in a spreadsheet and by a person (issue 35 items 1 and 4): no Python
repr in any cell, the same readable cells in both, ``end`` empty while a run runs, CodeCarbon's columns, the
carbon method of each series, and money in minor units that adds up."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

import psycopg

from gpufleet.accounting import report_csv, runs_report
from gpufleet.accounting.money import allocate
from gpufleet.accounting.report import finance_csv, finance_report
from gpufleet.store.sites import set_carbon
from tests.accounting.builders import T0, at, constant_power, gpu_samples, host_samples, node, run, site

#: What a Python repr leaves in a cell: containers, quotes, None/True/False, constructor calls.
REPR = re.compile(r"[{}\[\]]|'[^']*'|\bNone\b|\bTrue\b|\bFalse\b|Decimal\(|datetime\(|\w+\(")


def fill(conn: psycopg.Connection) -> None:
    site(conn, "eu", pue=1.2, price=0.2741, gpu_hour=2.07, currency="EUR", region="DE")
    set_carbon(conn, "DE", [(T0, 380.0)], method="average", name="Germany")
    node(conn, "n1", 4, "eu", facts={"gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3"} for g in range(4)]})
    gpu_samples(conn, constant_power("n1", range(4), 411.1, 0, 7200, counter=True))
    host_samples(conn, [(float(t), "n1", 600.0) for t in range(0, 7201, 10)])
    run(conn, "done", 0, 3600, {"n1": [0, 1]}, site_name="eu", team="lm")
    run(
        conn, "going", 1800, 10 * 3600, {"n1": [2]}, site_name="eu", team="cv"
    )  # registered end in the future
    run(conn, "shared", 0, 7200, {"n1": [3]}, site_name="eu", team="cv")
    conn.execute("UPDATE run_allocations SET sharing = 'time_slice', share = 0.5 WHERE run_id = 'shared'")


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_no_cell_holds_a_python_repr_and_both_csvs_agree(conn: psycopg.Connection) -> None:
    fill(conn)
    now = at(7200)
    runs = _rows(report_csv(runs_report(conn, at(0), at(86400), now=now, source="raw")))
    fin = _rows(finance_csv(finance_report(conn, at(0), at(86400), now=now, source="raw")))
    for table in (runs, fin):
        for row in table:
            for col, cell in row.items():
                assert not REPR.search(cell), (col, cell)
    by_run = {r["run_id"]: r for r in runs}
    by_key = {r["key"]: r for r in fin if r["row_type"] == "run"}
    assert by_run["done"]["gpu_models"] == by_key["done"]["gpu_models"] == "NVIDIA H100 80GB HBM3"
    for col in (
        "carbon_regions",
        "carbon_region_names",
        "carbon_method",
        "gpu_power_w",
        "emissions_rate_kg_s",
    ):
        assert by_run["done"][col] == by_key["done"][col] != "", col
    assert by_run["done"]["carbon_method"] == "average" and by_run["done"]["carbon_region_names"] == "Germany"
    # CodeCarbon's columns: mean power of the run's GPUs, kg CO2e per second
    assert abs(float(by_run["done"]["gpu_power_w"]) - 2 * 411.1) < 1e-3
    co2e = float(by_run["done"]["co2e_kg"])
    assert abs(float(by_run["done"]["emissions_rate_kg_s"]) - co2e / 3600) < 1e-9
    # end is empty while running, as documented; the end it was registered with is planned_end
    for table, key in ((by_run, "going"), (by_key, "going")):
        assert table[key]["state"] == "running" and table[key]["end"] == ""
        assert table[key]["planned_end"] == "2026-12-01T20:00:00Z"
        assert table["done"]["end"] == "2026-12-01T11:00:00Z" and table["done"]["planned_end"] == ""


def test_money_is_rounded_for_people_and_adds_up(conn: psycopg.Connection) -> None:
    fill(conn)
    now = at(7200)
    bodies = runs_report(conn, at(0), at(86400), now=now, source="raw")
    runs = {r["run_id"]: r for r in _rows(report_csv(bodies))}
    for b in bodies:  # the bodies carry money as computed, the CSV in cents, energy + compute = total
        r = runs[b["run_id"]]
        assert Decimal(r["energy_cost"]) + Decimal(r["compute_cost"]) == Decimal(r["total_cost"])
        assert abs(Decimal(r["total_cost"]) - Decimal(repr(b["total_cost"]))) <= Decimal("0.005")
        assert re.fullmatch(r"\d+\.\d\d", r["total_cost"])
    assert any(b["energy_cost"] != round(b["energy_cost"], 2) for b in bodies)  # not rounded at the source
    fin = _rows(finance_csv(finance_report(conn, at(0), at(86400), now=now, source="raw")))
    parts = [r for r in fin if r["currency"] == "EUR" and r["row_type"] in ("run", "unallocated")]
    total = next(r for r in fin if r["row_type"] == "total" and r["currency"] == "EUR")
    for col in ("energy_cost", "compute_cost", "total_cost"):
        assert sum(Decimal(p[col]) for p in parts) == Decimal(total[col]), col


def test_largest_remainder_rounding() -> None:
    values = [Decimal("0.335"), Decimal("0.335"), Decimal("0.33")]
    got = allocate(values, 2)
    assert sum(got) == Decimal("1.00") and all(
        abs(g - v) < Decimal("0.01") for g, v in zip(got, values, strict=True)
    )
    assert allocate([Decimal("1e300"), Decimal("0.004")], 2) == [Decimal("1e300"), Decimal(0)]
    assert allocate([Decimal("0.0274")], 2) == [Decimal("0.03")] and allocate([], 2) == []
    assert allocate([Decimal("5.5"), Decimal("4.5")], 0) == [Decimal(6), Decimal(4)]
