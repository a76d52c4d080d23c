"""The fleet's waste: ledgers added up per site, team and run in ``/v1/accounting`` and the finance report.

Two sites in two currencies; runs of two teams; idle, hung and starved GPU-time in some of them
(tests/accounting/test_finance_report.py's fleet with incidents added).
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from gpufleet.accounting import fleet_accounting, run_accounting
from gpufleet.accounting.lines import lines, per_run
from gpufleet.accounting.report import LEDGER_COLUMNS, finance_csv, finance_report
from gpufleet.accounting.run import bodies, ledger_summaries
from gpufleet.store.run_model import load_runs
from gpufleet.waste import PRECEDENCE, STATES
from tests.accounting.builders import approx, at
from tests.accounting.test_finance_report import fill
from tests.accounting.test_incident_cost import incident
from tests.accounting.test_stored_out_of_bounds import stored_before_the_bounds


def wasteful(conn: psycopg.Connection) -> None:
    fill(conn)
    # pretrain (eu, lm; e1 GPUs 0-2, [0, 3600)): GPU 2 idle for its whole life, a hang over [3000, 3600)
    incident(conn, "idle_allocation", 0, None, {"gpus": [{"node": "e1", "gpu": 2}]}, run_id="pretrain")
    incident(conn, "hung_collective", 3000, 3600, {}, run_id="pretrain")
    # vision (us, cv; u1 GPU 0, [600, 4000)): starved at 0.5 over [1000, 2000)
    incident(conn, "starvation", 1000, 2000, {"gpu_time_lost_share": 0.5}, run_id="vision")


def dec(x: Any) -> Decimal:
    return Decimal(0) if x in (None, "") else Decimal(repr(x)) if isinstance(x, float) else Decimal(str(x))


def test_groups_add_their_runs_ledgers(conn: psycopg.Connection) -> None:
    wasteful(conn)
    now, period = at(5400), (at(0), at(86400))
    view = fleet_accounting(conn, *period, group_by="team", now=now, source="raw")
    runs = {
        r: run_accounting(conn, r, now=now, source="raw", since=period[0], until=period[1])
        for r in ("pretrain", "eval", "vision")
    }
    # pretrain: GPU 2 idle all along (idle explains before hung), GPUs 0-1 hung over [3000, 3600)
    assert approx(runs["pretrain"]["ledger"]["idle"]["gpu_hours"], 1.0)
    assert approx(runs["pretrain"]["ledger"]["hung"]["gpu_hours"], 1200 / 3600)
    assert approx(runs["vision"]["ledger"]["starved"]["gpu_hours"], 500 / 3600)
    teams = {g["key"]: g for g in view["groups"]}
    for team, members in (("lm", ("pretrain", "eval")), ("cv", ("vision",))):
        g = teams[team]
        for s in STATES:
            for f in ("gpu_hours", "gpu_kwh", "facility_kwh", "co2e_kg"):
                assert dec(g["ledger"][s][f]) == sum(dec(runs[r]["ledger"][s][f]) for r in members), (
                    team,
                    s,
                    f,
                )
            assert dec(g["ledger"][s]["total_cost"]) == sum(
                dec(runs[r]["ledger"][s]["total_cost"]) for r in members
            )
        # the states add up to the group's own figures
        assert sum(dec(g["ledger"][s]["gpu_hours"]) for s in STATES) == dec(g["gpu_hours"])
        assert sum(dec(g["ledger"][s]["total_cost"]) for s in STATES) == dec(g["total_cost"])
        waste = g["waste"]
        assert dec(waste["gpu_hours"]) == sum(dec(g["ledger"][s]["gpu_hours"]) for s in PRECEDENCE)
        assert approx(waste["share"], waste["gpu_hours"] / g["gpu_hours"])
    assert teams["lm"]["waste"]["costs_by_currency"] == {"EUR": teams["lm"]["waste"]["total_cost"]}
    # the runs block mixes EUR and USD: money per currency only
    every = view["runs"]
    assert every["waste"]["total_cost"] is None and set(every["waste"]["costs_by_currency"]) == {"EUR", "USD"}
    assert every["ledger"]["idle"]["costs_by_currency"]["USD"] == 0.0
    # GPU time no run held has no ledger
    assert view["unallocated"].get("ledger") is None and view["total"].get("ledger") is None


def test_finance_report_columns_per_run_team_and_total(conn: psycopg.Connection) -> None:
    wasteful(conn)
    now, period = at(5400), (at(0), at(86400))
    by_run = {
        r["key"]: r
        for r in csv.DictReader(
            io.StringIO(finance_csv(finance_report(conn, *period, group_by="run", now=now, source="raw")))
        )
    }
    pretrain = run_accounting(conn, "pretrain", now=now, source="raw", since=period[0], until=period[1])
    row = by_run["pretrain"]
    for s in STATES:
        assert dec(row[f"{s}_gpu_hours"]) == dec(pretrain["ledger"][s]["gpu_hours"]), s
        assert row[f"{s}_cost"] == f"{pretrain['ledger'][s]['total_cost']:.2f}", s
    assert dec(row["waste_gpu_hours"]) == sum(dec(pretrain["ledger"][s]["gpu_hours"]) for s in PRECEDENCE)
    assert dec(row["waste_gpu_hours"]) == dec(row["lost_gpu_hours"])
    assert by_run["unallocated"]["idle_gpu_hours"] == "" and by_run["unallocated"]["waste_cost"] == ""
    teams = {
        (r["row_type"], r["key"], r["currency"]): r
        for r in csv.DictReader(
            io.StringIO(finance_csv(finance_report(conn, *period, group_by="team", now=now, source="raw")))
        )
    }
    lm = teams[("team", "lm", "EUR")]
    assert dec(lm["waste_gpu_hours"]) == dec(row["waste_gpu_hours"]) + dec(by_run["eval"]["waste_gpu_hours"])
    assert dec(lm["waste_cost"]) == dec(row["waste_cost"]) + dec(by_run["eval"]["waste_cost"])
    # each currency's total carries its runs' waste; the whole fleet's row has hours and no money
    eur = teams[("total", "total", "EUR")]
    assert dec(eur["waste_gpu_hours"]) == dec(lm["waste_gpu_hours"])
    everything = teams[("total", "all", "")]
    assert dec(everything["waste_gpu_hours"]) == dec(lm["waste_gpu_hours"]) + dec(
        teams[("team", "cv", "USD")]["waste_gpu_hours"]
    )
    assert everything["waste_cost"] == "" and everything["idle_cost"] == ""
    rep = finance_report(conn, *period, group_by="team", now=now, source="raw").body()
    assert set(LEDGER_COLUMNS) <= set(rep["columns"]) and "waste_cost" in rep["rows"][0]


def test_pricing_in_batches_changes_nothing(conn: psycopg.Connection, monkeypatch: Any) -> None:
    """Runs are priced in batches of keys (gpufleet.accounting.ledger.PRICE_BATCH_KEYS): one run per call
    gives the same bodies as all of them in one."""
    from gpufleet.accounting import account_runs, ledger, load_runs

    wasteful(conn)
    runs = load_runs(conn, ["pretrain", "eval", "vision"])
    whole = account_runs(conn, runs, now=at(5400), source="raw")
    monkeypatch.setattr(ledger, "PRICE_BATCH_KEYS", 1)
    assert account_runs(conn, runs, now=at(5400), source="raw") == whole
    assert any((b["ledger"]["idle"]["gpu_hours"] or 0) > 0 for b in whole)


def test_the_api_serves_the_fleets_waste(api: Any) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        wasteful(conn)
    with api.client("finance") as c:
        view = c.get(
            "/v1/accounting", params={"from": "2026-12-01", "to": "2026-12-02", "group_by": "team"}
        ).json()
        rows = c.get(
            "/v1/reports/finance.json", params={"from": "2026-12-01", "to": "2026-12-02", "group_by": "team"}
        ).json()["rows"]
    lm = next(g for g in view["groups"] if g["key"] == "lm")
    assert set(lm["ledger"]) == set(STATES) and lm["waste"]["gpu_hours"] > 0 and lm["waste"]["total_cost"] > 0
    assert view["unallocated"]["ledger"] is None and view["unallocated"]["waste"] is None
    team = next(r for r in rows if r["row_type"] == "team" and r["key"] == "lm")
    assert team["waste_gpu_hours"] == lm["waste"]["gpu_hours"] and team["idle_gpu_hours"] > 0


@pytest.mark.parametrize("scene", ["wasteful", "price_out_of_bounds"])
@pytest.mark.parametrize("period_s", [(0, 86400), (300, 3300)])
def test_fleet_views_read_what_the_runs_bodies_say(
    conn: psycopg.Connection, scene: str, period_s: tuple[int, int]
) -> None:
    """The fleet's views sum each run's ledger summary instead of its whole body: the summary's fields are
    the body's, for whole and clipped windows, and where a stored price leaves a run's money unknown."""
    (wasteful if scene == "wasteful" else stored_before_the_bounds)(conn)
    now, since, until = at(5400), at(period_s[0]), at(period_s[1])
    runs = load_runs(conn, [r for (r,) in conn.execute("SELECT run_id FROM runs ORDER BY run_id")])
    parts = per_run(lines(conn, since, until, now, fleet=True, max_gap_s=60.0, source="raw"))
    runs = [r for r in runs if r.run_id in parts]
    kw: dict[str, Any] = dict(now=now, max_gap_s=60.0, source="raw", since=since, until=until)
    summaries = ledger_summaries(conn, runs, parts, **kw)
    full = bodies(conn, runs, parts, **kw)
    assert [s["run_id"] for s in summaries] == [b["run_id"] for b in full] and len(full) >= 2
    for s, b in zip(summaries, full, strict=True):
        assert s == {k: b[k] for k in s}  # type: ignore[literal-required]
    if scene == "price_out_of_bounds":
        typo = next(s for s in summaries if s["run_id"] == "r-typo")
        assert typo["errors"] and all(c["total_cost"] is None for c in typo["ledger"].values())
