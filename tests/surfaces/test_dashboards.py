"""The Grafana dashboards: structure, and every query run as Grafana would against a simulated fleet."""

from __future__ import annotations

import copy
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gpufleet.dashboards import build
from gpufleet.dashboards.dryrun import QueryResult, panels, run_dashboard, shape_problems
from gpufleet.dashboards.loader import load_all
from gpufleet.dashboards.macros import TimeRange, query_interval_ms
from gpufleet.dashboards.model import DS_REF
from gpufleet.dashboards.sql import HOURS_FROM_MS
from gpufleet.dashboards.validate import validate, validate_all
from gpufleet.store.gpu_states import BUSY_UTIL_PCT
from tests.surfaces.fleetdb import FilledFleet

UIDS = {"gpufleet-fleet", "gpufleet-run", "gpufleet-starvation", "gpufleet-energy", "gpufleet-node"}
#: Picks for single-value variables (multi-value ones stay at All).
PICKS: dict[str, dict[str, Any]] = {"gpufleet-run": {"run": "demo-pretrain"}}


def _results(
    fleet: FilledFleet, uid: str, mode: str, picks: dict[str, Any] | None = None
) -> list[QueryResult]:
    d = load_all()[uid]
    rng = TimeRange(fleet.start, fleet.end)
    interval = None
    if mode == "rollup":  # the interval of a longer range or a narrower panel
        interval = 60_000
    elif mode == "long":  # three days: hourly energy, rollups everywhere
        rng = TimeRange(fleet.start - timedelta(days=3), fleet.end)
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        return run_dashboard(
            conn,
            d,
            rng,
            picks if picks is not None else PICKS.get(uid),
            interval_ms=interval,
            timescaledb=fleet.backend == "timescaledb",
        )


def _one(results: list[QueryResult], title: str) -> QueryResult:
    hits = [r for r in results if r.title == title]
    assert len(hits) == 1, f"{title!r}: {[r.title for r in results]}"
    return hits[0]


def _rows(r: QueryResult) -> list[dict[str, Any]]:
    names = r.names()
    return [dict(zip(names, row, strict=True)) for row in r.rows]


def test_json_files_are_built_from_the_definitions() -> None:
    assert build.stale() == [], "run: python -m gpufleet.dashboards.build"


@pytest.mark.parametrize(
    "hours,column_ms", [(6, 120_000), (24, 300_000), (24 * 7, 3_600_000), (24 * 30, 10_800_000)]
)
def test_node_heatmap_columns(hours: int, column_ms: int) -> None:
    """A row per node makes the heatmap's cells rows times columns: its points are fewer than other
    panels' (2-minute columns at 6 h), but a day stays on minutes (5-minute columns, below the hours'
    10-minute threshold), as it was at 300 points."""
    board = load_all()["gpufleet-fleet"]
    p = next(p for p in panels(board) if p.get("title") == "GPU-Util by node")
    end = datetime(2026, 12, 7, tzinfo=UTC)
    got = query_interval_ms(
        TimeRange(end - timedelta(hours=hours), end), p["maxDataPoints"], p.get("interval")
    )
    assert got == column_ms
    assert (got < HOURS_FROM_MS) == (hours <= 24)


def test_dashboards_are_valid() -> None:
    boards = load_all()
    assert set(boards) == UIDS
    assert validate_all(boards) == []
    for d in boards.values():
        assert sum(1 for p in panels(d) if p["type"] not in ("row", "text")) >= 6


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: d["panels"][2].__setitem__("id", d["panels"][1]["id"]), "panel id"),
        (
            lambda d: d["panels"][1].__setitem__(
                "datasource", {"type": "grafana-postgresql-datasource", "uid": "P1"}
            ),
            "datasource must be",
        ),
        (lambda d: d["panels"][1]["targets"][0].__setitem__("rawSql", ""), "needs rawSql"),
        (
            lambda d: d["panels"][1].__setitem__("description", "see http://grafana.internal:3000/d/x"),
            "a URL",
        ),
        (lambda d: d["panels"][1].__setitem__("description", "db at 10.1.2.3"), "an IP address"),
        (lambda d: d["panels"][1].__setitem__("description", "pg on db-01:5432"), "host:port"),
        (lambda d: d.pop("schemaVersion"), "schemaVersion"),
        (
            lambda d: d["panels"][1]["targets"][0].__setitem__("rawSql", "SELECT 1 WHERE x = '$nosuch'"),
            "not a dashboard variable",
        ),
        (
            lambda d: d["panels"][1]["targets"][0].__setitem__("rawSql", "SELECT 1 WHERE s IN ($site)"),
            "sqlstring",
        ),
        (
            lambda d: d["panels"][1]["targets"][0].__setitem__("rawSql", "SELECT $__timeBucket(t)"),
            "unknown macro",
        ),
        (lambda d: d["panels"][1]["gridPos"].__setitem__("x", 20), "outside the 24-column grid"),
        (lambda d: d["panels"][2].__setitem__("gridPos", dict(d["panels"][1]["gridPos"])), "overlap"),
        (lambda d: d["templating"]["list"].pop(0), "'datasource' variable"),
        (lambda d: d.__setitem__("id", 7), "id must be null"),
    ],
)
def test_validator_catches(mutate: Any, expect: str) -> None:
    d = copy.deepcopy(load_all()["gpufleet-fleet"])
    mutate(d)
    problems = validate(d)
    assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("mode", ["raw", "rollup", "long"])
@pytest.mark.parametrize("uid", sorted(UIDS))
def test_every_query_runs_with_the_columns_its_panel_needs(fleet: FilledFleet, uid: str, mode: str) -> None:
    results = _results(fleet, uid, mode)
    problems = [p for r in results for p in shape_problems(r)]
    assert problems == []
    assert all("$__" not in r.sql for r in results), "a macro survived expansion"
    empty = [r.where for r in results if not r.rows]
    assert empty == [], "the demo fleet guarantees data for every panel"
    assert len(results) >= 8


@pytest.mark.parametrize("time_bucket", [False, True], ids=["floor", "time_bucket"])
def test_every_query_on_timescaledb(timescale_fleet: FilledFleet, time_bucket: bool) -> None:
    """Continuous aggregates instead of tables, and Grafana's TimescaleDB option ($__timeGroup as time_bucket)."""
    rng = TimeRange(timescale_fleet.start, timescale_fleet.end)
    with psycopg.connect(timescale_fleet.url, autocommit=True) as conn:
        for uid, d in load_all().items():
            for interval in (None, 60_000):
                results = run_dashboard(
                    conn, d, rng, PICKS.get(uid), interval_ms=interval, timescaledb=time_bucket
                )
                assert [p for r in results for p in shape_problems(r)] == []
                assert [r.where for r in results if not r.rows] == []


@pytest.mark.parametrize("interval_ms", [60_000, 600_000])
def test_fleet_activity_is_the_samples_average(fleet: FilledFleet, interval_ms: int) -> None:
    """The board's fleet activity, read from node_activity (minutes, or hours from 10-minute intervals),
    is each interval's average over the raw samples themselves."""
    d = load_all()["gpufleet-fleet"]
    rng = TimeRange(fleet.start - timedelta(hours=1), fleet.end)
    step = 3600 if interval_ms >= 600_000 else 60
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        r = _one(run_dashboard(conn, d, rng, interval_ms=interval_ms), "Fleet activity")
        raw = conn.execute(
            "SELECT floor(extract(epoch FROM time) / %(step)s) * %(step)s, avg(util_pct), avg(sm_active) * 100, "
            "avg(tensor_active) * 100 FROM gpu_samples WHERE time BETWEEN %(lo)s AND %(hi)s "
            "AND mig_instance IS NULL GROUP BY 1",
            {"step": step, "lo": rng.start, "hi": rng.end},
        ).fetchall()
    want = {float(t): tuple(v) for t, *v in raw if t >= rng.start.timestamp()}
    got = {
        row["time"].timestamp(): (row["GPU-Util"], row["SM active"], row["Tensor active"]) for row in _rows(r)
    }
    assert sorted(got) == sorted(want) and len(got) >= (1 if step == 3600 else 14)
    for t, values in want.items():
        assert got[t] == pytest.approx(values, rel=1e-6), t


def test_power_by_site_sums_each_gpus_minute_power(fleet: FilledFleet) -> None:
    """At one-minute intervals, a site's power is the sum over its GPUs of each one's mean power in the
    minute, recounted from the raw samples."""
    d = load_all()["gpufleet-fleet"]
    rng = TimeRange(fleet.start, fleet.end)
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        r = _one(run_dashboard(conn, d, rng, interval_ms=60_000), "GPU power by site")
        raw = conn.execute(
            "SELECT m, site, sum(p) FROM (SELECT floor(extract(epoch FROM s.time) / 60) * 60 AS m, "
            "coalesce(n.site, 'no site') AS site, s.node, s.gpu, avg(s.power_w) AS p FROM gpu_samples s "
            "LEFT JOIN nodes n USING (node) WHERE s.time BETWEEN %s AND %s AND s.mig_instance IS NULL "
            "GROUP BY 1, 2, 3, 4) g GROUP BY 1, 2",
            (rng.start, rng.end),
        ).fetchall()
    want = {(float(t), site): w for t, site, w in raw}
    got = {(float(row["time"]), row["metric"]): row["value"] for row in _rows(r)}
    assert sorted(got) == sorted(want) and len({site for _, site in got}) >= 2
    for key, watts in want.items():
        assert got[key] == pytest.approx(watts, rel=1e-6), key


@pytest.mark.parametrize("interval_ms", [None, 60_000, 7_000])
def test_open_incidents_over_time_count_what_is_open_at_each_step(
    fleet: FilledFleet, interval_ms: int
) -> None:
    """At each step t of the range, the incidents of each kind with start <= t < end (open ones
    without end), counted here from the incidents themselves; the range starts inside incidents."""
    d = load_all()["gpufleet-fleet"]
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        first_end = conn.execute('SELECT min("end") FROM incidents').fetchone()[0]  # type: ignore[index]
        assert first_end is not None, "the fleet has resolved incidents"
        rng = TimeRange(first_end - timedelta(minutes=3), fleet.end + timedelta(minutes=5))
        results = run_dashboard(conn, d, rng, interval_ms=interval_ms)
        incidents = conn.execute('SELECT kind, start, "end" FROM incidents').fetchall()
    r = next(x for x in results if x.title == "Open incidents" and x.kind == "timeseries")
    step = timedelta(milliseconds=max(r.interval_ms, 1000))
    want: dict[tuple[Any, str], int] = {}
    t = rng.start
    while t <= rng.end:
        for kind, start, end in incidents:
            if start <= t and (end is None or end > t):
                want[(t, kind)] = want.get((t, kind), 0) + 1
        t += step
    got = {(row["time"], row["metric"]): row["value"] for row in _rows(r)}
    assert got == want
    assert len({k for _, k in want}) >= 2 and any(
        end is not None and end > rng.start for _, _, end in incidents
    )


def test_run_detail_shows_each_gpu_of_each_run(fleet: FilledFleet) -> None:
    with psycopg.connect(fleet.url) as conn:
        held: dict[str, int] = dict(
            conn.execute("SELECT run_id, count(*) FROM run_allocations GROUP BY 1").fetchall()
        )
    for run_id in fleet.runs:
        results = _results(fleet, "gpufleet-run", "raw", {"run": run_id})
        assert [p for r in results for p in shape_problems(r)] == []
        for title in ("GPU-Util per GPU", "Power per GPU", "GPU temperature"):
            series = {row[1] for row in _one(results, title).rows}
            assert len(series) == held[run_id], (run_id, title)
        summary = _rows(_one(results, "Run"))[0]
        assert summary["Run"] == run_id and summary["GPUs"] == held[run_id]
        so_far = _rows(_one(results, "So far"))[0]
        assert so_far["Facility energy"] >= so_far["IT energy"] > 0
        assert so_far["Currency"] == "EUR" and so_far["Total cost"] > 0 and so_far["CO2e"] > 0


def test_one_node_narrows_the_run_detail(fleet: FilledFleet) -> None:
    results = _results(fleet, "gpufleet-run", "raw", {"run": "demo-pretrain", "node": ["h100-02"]})
    series = {row[1] for row in _one(results, "GPU-Util per GPU").rows}
    assert series == {f"h100-02/{g}" for g in range(8)}
    assert {row[1].split()[0] for row in _one(results, "CPU").rows} == {"h100-02"}


def test_hostile_variable_values_stay_literals(fleet: FilledFleet) -> None:
    picks = {"run": "x'); DROP TABLE runs; --", "node": ["a'b", "c\\'d"]}
    results = _results(fleet, "gpufleet-run", "raw", picks)
    assert [r.error for r in results if r.error] == []
    assert all(not r.rows for r in results if r.kind in ("timeseries", "heatmap"))
    results = _results(fleet, "gpufleet-energy", "raw", {"site": ["lab-'a"], "team": ["--"]})
    assert [r.error for r in results if r.error] == []
    with psycopg.connect(fleet.url) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (len(fleet.runs),)


def test_site_filter_keeps_to_the_site(fleet: FilledFleet) -> None:
    results = _results(fleet, "gpufleet-fleet", "raw", {"site": ["lab-b"]})
    assert [p for r in results for p in shape_problems(r)] == []
    assert {row[1] for row in _one(results, "GPU power by site").rows} == {"lab-b"}
    gpus = _rows(_one(results, "GPUs"))[0]
    assert gpus["Reporting"] == 16  # the two A100 nodes


def test_fleet_numbers_match_the_fleet(fleet: FilledFleet) -> None:
    results = _results(fleet, "gpufleet-fleet", "raw")
    gpus = _rows(_one(results, "GPUs"))[0]
    with psycopg.connect(fleet.url) as conn:
        starved = conn.execute(
            "SELECT count(DISTINCT (a.node, a.gpu)) FROM incidents i JOIN run_allocations a USING (run_id) "
            "WHERE i.kind = 'starvation' AND i.state = 'open'"
        ).fetchone()
        open_by_kind: dict[str, int] = dict(
            conn.execute("SELECT kind, count(*) FROM incidents WHERE state = 'open' GROUP BY 1").fetchall()
        )
    assert gpus["Reporting"] == 64
    assert gpus["Starved"] == starved[0] > 0  # type: ignore[index]
    assert gpus["Busy"] + gpus["Idle"] + gpus["Starved"] == 64
    assert dict(_one(results, "Open incidents by kind").rows) == open_by_kind


def _states_want(conn: psycopg.Connection, rng: TimeRange, step: float) -> dict[float, dict[str, float]]:
    """The GPU states panel's rows counted from the samples and incidents themselves."""
    samples = conn.execute(
        "SELECT node, gpu, extract(epoch FROM time)::float8, util_pct FROM gpu_samples "
        "WHERE time BETWEEN %s AND %s AND mig_instance IS NULL",
        (rng.start, rng.end),
    ).fetchall()
    starved = conn.execute(
        "SELECT a.node, a.gpu, extract(epoch FROM i.start)::float8, "
        "coalesce(extract(epoch FROM i.\"end\")::float8, 'infinity') "
        "FROM incidents i JOIN run_allocations a USING (run_id) WHERE i.kind = 'starvation'"
    ).fetchall()
    cells: dict[tuple[float, str, int], list[float]] = {}
    for node, gpu, t, util in samples:
        c = cells.setdefault((math.floor(t / 60) * 60, node, gpu), [0.0, 0])
        if util is not None:
            c[0], c[1] = c[0] + util, c[1] + 1
    counts: dict[float, dict[str, float]] = {}
    node_minutes: dict[tuple[float, str], set[float]] = {}
    for (minute, node, gpu), (total, n) in cells.items():
        if any(sn == node and sg == gpu and a <= minute < b for sn, sg, a, b in starved):
            state = "starved"
        else:
            state = "busy" if n and total / n >= BUSY_UTIL_PCT else "idle"
        bucket = math.floor(minute / step) * step
        counts.setdefault(bucket, {"busy": 0.0, "starved": 0.0, "idle": 0.0})[state] += 1
        # the minutes each stored row (a minute, or an hour) says its node reported
        node_minutes.setdefault(
            (math.floor(minute / 3600) * 3600 if step == 3600 else minute, node), set()
        ).add(minute)
    reported: dict[float, float] = {}  # per stored row time: the most minutes any node reported
    for (row_t, _node), ms in node_minutes.items():
        reported[row_t] = max(reported.get(row_t, 0), len(ms))
    want: dict[float, dict[str, float]] = {}
    for bucket, c in counts.items():
        minutes = sum(m for t, m in reported.items() if math.floor(t / step) * step == bucket)
        want[bucket] = {state: k / minutes for state, k in c.items()}
    if step == 3600.0:  # an hour's row is kept whole or not at all: only those starting in the range
        want = {b: c for b, c in want.items() if b >= rng.start.timestamp()}
    return want


def _assert_states(r: QueryResult, want: dict[float, dict[str, float]]) -> None:
    got = {float(row["time"]): {k: row[k] for k in ("busy", "starved", "idle")} for row in _rows(r)}
    assert sorted(got) == sorted(want)
    for bucket, counts in want.items():
        assert got[bucket] == pytest.approx(counts, rel=1e-9), bucket
    assert any(c["starved"] for c in got.values()) and any(c["busy"] for c in got.values())


@pytest.mark.parametrize("interval_ms", [60_000, 300_000, 600_000])
def test_gpu_states_over_time_count_every_gpu_minute_by_the_one_definition(
    fleet: FilledFleet, interval_ms: int
) -> None:
    """Each interval: the fleet's GPU-minutes by state divided by the minutes it reported; a GPU-minute is starved while a starvation incident of a run holding the GPU is open at the
    minute's start, else busy or idle by its mean GPU-Util (:mod:`gpufleet.store.gpu_states`).  Counted
    here from the samples and incidents themselves, at one-minute and five-minute intervals (from
    node_activity_1m) and ten-minute ones (from node_activity_1h: hourly points)."""
    d = load_all()["gpufleet-fleet"]
    rng = TimeRange(fleet.start - timedelta(hours=1), fleet.end)
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        results = run_dashboard(
            conn, d, rng, interval_ms=interval_ms, timescaledb=fleet.backend == "timescaledb"
        )
        want = _states_want(conn, rng, 3600.0 if interval_ms >= 600_000 else interval_ms / 1000)
    _assert_states(_one(results, "GPU states"), want)


def test_gpu_states_count_a_minute_starved_twice_once(fleet: FilledFleet) -> None:
    """A GPU whose run has overlapping starvation incidents (one inside another, one overlapping its
    end, one after a gap): each of its starved minutes counts once.  Added in a transaction that is
    rolled back, so the shared fleet is left as it was."""
    d = load_all()["gpufleet-fleet"]
    rng = TimeRange(fleet.start - timedelta(hours=1), fleet.end)
    with psycopg.connect(fleet.url) as conn:
        run_id, start = conn.execute(
            "SELECT r.run_id, r.start FROM runs r WHERE EXISTS (SELECT 1 FROM run_allocations a "
            "WHERE a.run_id = r.run_id) ORDER BY r.run_id LIMIT 1"
        ).fetchone()
        t0 = max(start, rng.start + timedelta(hours=1))
        for lo, hi in ((60, 600), (120, 300), (500, 720), (780, None)):
            conn.execute(
                'INSERT INTO incidents (kind, scope_key, run_id, severity, state, start, "end", last_seen) '
                "VALUES ('starvation', 'test:' || %s, %s, 'warning', %s, %s, %s, %s)",
                (
                    lo,
                    run_id,
                    "open" if hi is None else "resolved",
                    t0 + timedelta(seconds=lo),
                    None if hi is None else t0 + timedelta(seconds=hi),
                    t0,
                ),
            )
        results = run_dashboard(conn, d, rng, interval_ms=60_000, timescaledb=fleet.backend == "timescaledb")
        _assert_states(_one(results, "GPU states"), _states_want(conn, rng, 60.0))
        conn.rollback()


def test_fleet_board_and_web_view_count_gpus_alike(fleet: FilledFleet) -> None:
    # one definition of busy / idle / starved (gpufleet.store.gpu_states): the board at the end of the range
    # and the web view at the newest sample (the same moment here) must give the same counts
    from gpufleet.store import views

    gpus = _rows(_one(_results(fleet, "gpufleet-fleet", "raw"), "GPUs"))[0]
    with psycopg.connect(fleet.url) as conn:
        now = views.fleet_now(conn)
    assert now.as_of is not None and abs((now.as_of - fleet.end).total_seconds()) < 1.0
    assert (now.busy, now.idle, now.starved, now.gpus) == (
        gpus["Busy"],
        gpus["Idle"],
        gpus["Starved"],
        gpus["Reporting"],
    )
    assert now.starved > 0 and now.busy > 0


def test_starvation_board_ranks_the_starved_runs_with_their_cause(fleet: FilledFleet) -> None:
    ranked = _rows(_one(_results(fleet, "gpufleet-starvation", "raw"), "Runs by GPU time lost"))
    found = {(r["Run"], r["Kind"], r["Cause"]) for r in ranked}
    assert {
        ("demo-vision", "starvation", "cpu"),
        ("demo-audio", "starvation", "io"),
        ("demo-pretrain", "checkpoint_stall", ""),
    } <= found
    lost = [r["GPU-hours lost"] for r in ranked]
    assert lost == sorted(lost, reverse=True) and all(x > 0 for x in lost)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def test_energy_board_shows_exactly_the_apis_figures(fleet: FilledFleet) -> None:
    """One definition: the board's per-run table, totals, currencies, teams and fleet figures are the API's."""
    from datetime import UTC, datetime

    from gpufleet import accounting

    results = _results(fleet, "gpufleet-energy", "raw")
    per_run = {r["Run"]: r for r in _rows(_one(results, "Runs"))}
    assert set(per_run) == set(fleet.runs)
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
        view = accounting.fleet_accounting(conn, fleet.start, fleet.end, group_by="team", now=now)
    columns = (
        ("GPU-hours", "gpu_hours"),
        ("GPU kWh", "gpu_kwh"),
        ("Host kWh", "host_kwh"),
        ("PUE", "pue"),
        ("Facility kWh", "facility_kwh"),
        ("CO2e kg", "co2e_kg"),
        ("Energy cost", "energy_cost"),
        ("Compute cost", "compute_cost"),
        ("Total cost", "total_cost"),
        ("Coverage", "coverage"),
        ("GPUs", "gpu_count"),
    )
    for run_id, row in per_run.items():
        for col, key in columns:
            assert _num(row[col]) == exact[run_id][key], (run_id, col, row[col], exact[run_id][key])
        assert row["Currency"] == exact[run_id]["currency"]
        assert exact[run_id]["gpu_kwh"] > 0 and exact[run_id]["total_cost"] > 0
    totals = _rows(_one(results, "Runs in range"))[0]
    runs = view["runs"]
    assert (_num(totals["IT energy"]), _num(totals["Facility energy"]), _num(totals["CO2e"])) == (
        runs["it_kwh"],
        runs["facility_kwh"],
        runs["co2e_kg"],
    )
    currencies = {r["Currency"]: r for r in _rows(_one(results, "Cost by currency"))}
    for cur, c in runs["costs_by_currency"].items():
        assert (
            _num(currencies[cur]["Energy cost"]),
            _num(currencies[cur]["Compute cost"]),
            _num(currencies[cur]["Total cost"]),
        ) == (c["energy_cost"], c["compute_cost"], c["total_cost"])
    teams = {r["Team"]: r for r in _rows(_one(results, "Energy and CO2e by team"))}
    for g in view["groups"]:
        assert _num(teams[g["key"] or "no team"]["Facility kWh"]) == g["facility_kwh"], g["key"]
    f = _rows(_one(results, "Fleet"))[0]
    assert _num(f["GPU energy, all GPUs"]) == view["total"]["gpu_kwh"]
    assert _num(f["Facility energy, all GPUs"]) == view["total"]["facility_kwh"]
    assert _num(f["Facility energy, no run"]) == view["unallocated"]["facility_kwh"]
    assert _num(f["GPU-hours, no run"]) == view["unallocated"]["gpu_hours"]
    assert _num(f["GPU-hours, no telemetry"]) == view["no_telemetry"]["gpu_hours"]
    # the time series is the same accounting per step: its steps add up to the fleet total
    series = _rows(_one(results, "Facility energy by site"))
    assert sum(float(r["value"]) for r in series) == pytest.approx(
        view["total"]["facility_kwh"], abs=1e-8 * len(series)
    )


def test_run_detail_accounting_is_the_apis(fleet: FilledFleet) -> None:
    from datetime import UTC, datetime

    from gpufleet.accounting import run_accounting

    row = _rows(_one(_results(fleet, "gpufleet-run", "raw"), "So far"))[0]
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        a = run_accounting(conn, "demo-pretrain", now=datetime.now(UTC), until=fleet.end)
    assert (
        _num(row["GPU-hours"]),
        _num(row["IT energy"]),
        _num(row["Facility energy"]),
        _num(row["Total cost"]),
        _num(row["CO2e"]),
        row["Currency"],
    ) == (a["gpu_hours"], a["it_kwh"], a["facility_kwh"], a["total_cost"], a["co2e_kg"], a["currency"])


def test_panels_and_variables_use_the_datasource_variable() -> None:
    for d in load_all().values():
        for p in panels(d):
            if p["type"] not in ("row", "text"):
                assert p["datasource"] == DS_REF


def test_cli_check_runs_every_query_against_the_database(fleet: FilledFleet) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli import app

    out = CliRunner().invoke(app, ["dashboards", "check", "--db", fleet.url, "--hours", "1"])
    assert out.exit_code == 0, out.output
    assert re.search(rf"{len(UIDS)} dashboards, \d+ queries, 0 problems", out.output), out.output
