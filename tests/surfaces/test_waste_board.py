"""The energy board's waste panels are the API's ledger (gpufleet_ledger, the SQL twin of the API's)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg

from gpufleet import accounting
from gpufleet.waste import PRECEDENCE, STATES
from tests.surfaces.fleetdb import FilledFleet
from tests.surfaces.test_dashboards import _one, _results, _rows

LABELS = {
    "productive": "Productive",
    "idle": "Idle",
    "hung": "Hung",
    "starved": "Starved",
    "checkpoint": "Checkpoint",
    "straggler_wait": "Straggler wait",
    "throttled": "Throttled",
}


def dec(v: Any) -> Decimal:
    return Decimal(0) if v is None else Decimal(repr(v)) if isinstance(v, float) else Decimal(v)


def test_the_waste_panels_show_the_apis_ledger(fleet: FilledFleet) -> None:
    results = _results(fleet, "gpufleet-energy", "raw")
    now = datetime.now(UTC)
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        exact = {
            a["run_id"]: a
            for a in accounting.account_runs(
                conn,
                accounting.load_runs(conn, list(fleet.runs)),
                now=now,
                since=fleet.start,
                until=fleet.end,
            )
        }
    per_run = {r["Run"]: r for r in _rows(_one(results, "Runs that wasted most"))}
    assert set(per_run) == set(fleet.runs)
    wasted_any = False
    for run_id, row in per_run.items():
        led = exact[run_id]["ledger"]
        waste = sum((dec(led[s]["gpu_hours"]) for s in PRECEDENCE), Decimal(0))
        assert dec(row["GPU-hours"]) == dec(exact[run_id]["gpu_hours"]), run_id
        assert dec(row["Wasted GPU-hours"]) == waste, (run_id, row["Wasted GPU-hours"], waste)
        for s in PRECEDENCE:
            assert dec(row[f"{LABELS[s]} GPU-hours"]) == dec(led[s]["gpu_hours"]), (run_id, s)
        assert dec(row["Waste cost"]) == sum((dec(led[s]["total_cost"]) for s in PRECEDENCE), Decimal(0)), (
            run_id
        )
        wasted_any |= waste > 0
    assert wasted_any, "the simulated fleet's incidents should waste some GPU time"
    # the panels' order: most wasteful first
    wasted = [dec(r["Wasted GPU-hours"]) for r in _rows(_one(results, "Runs that wasted most"))]
    assert wasted == sorted(wasted, reverse=True)
    states = _rows(_one(results, "Where the GPU-hours went"))
    assert [r["State"] for r in states] == [LABELS[s] for s in STATES]
    total = sum((dec(r["GPU-hours"]) for r in states), Decimal(0))
    assert total == sum((dec(a["gpu_hours"]) for a in exact.values()), Decimal(0))
    stat = _rows(_one(results, "Waste"))[0]
    assert dec(stat["Wasted GPU-hours"]) == sum(
        (dec(r["Wasted GPU-hours"]) for r in per_run.values()), Decimal(0)
    )
