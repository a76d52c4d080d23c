"""The Waste page: runs and teams ranked by wasted GPU-hours, linked to the runs, for finance and SREs."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from gpufleet.api.web.waste import period_start, ranking
from tests.api.conftest import Api


def _run(
    conn: psycopg.Connection,
    run_id: str,
    team: str | None,
    start: datetime,
    end: datetime,
    gpus: int,
    site: str | None = "eu",
) -> None:
    conn.execute(
        'INSERT INTO runs (run_id, site, team, start, "end") VALUES (%s, %s, %s, %s, %s)',
        (run_id, site, team, start, end),
    )
    for g in range(gpus):
        conn.execute(
            "INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s)",
            (run_id, f"node-{run_id}", g),
        )


def _incident(
    conn: psycopg.Connection,
    kind: str,
    run_id: str,
    start: datetime,
    end: datetime,
    evidence: dict[str, object],
) -> None:
    conn.execute(
        'INSERT INTO incidents (kind, scope_key, run_id, severity, state, start, "end", last_seen, evidence) '
        "VALUES (%s, %s, %s, 'warning', 'resolved', %s, %s, %s, %s)",
        (kind, f"{kind}|{run_id}|{start.isoformat()}", run_id, start, end, end, json.dumps(evidence)),
    )


def fill(conn: psycopg.Connection, now: datetime) -> None:
    """Three runs of the last 20 minutes: one idle on all of its 8 GPUs, one hung half the time, one clean."""
    conn.execute("INSERT INTO sites (site, currency) VALUES ('eu', 'EUR')")
    conn.execute(
        "INSERT INTO site_settings (site, setting, valid_from, num) VALUES "
        "('eu', 'gpu_hour_price', '-infinity', 3.0), ('eu', 'pue', '-infinity', 1.0), "
        "('eu', 'price_per_kwh', '-infinity', 0.0)"
    )
    t0, t1 = now - timedelta(minutes=20), now - timedelta(seconds=10)
    _run(conn, "notebook", "research", t0, t1, 8)
    _run(conn, "allreduce-stuck", "lm", t0, t1, 4)
    _run(conn, "busy", "lm", t0, t1, 4)
    _incident(
        conn,
        "idle_allocation",
        "notebook",
        t0 - timedelta(minutes=1),
        t1,
        {"gpus": [{"node": "node-notebook", "gpu": g} for g in range(8)]},
    )
    _incident(conn, "hung_collective", "allreduce-stuck", t0 + (t1 - t0) / 2, t1, {})


def test_ranking_puts_the_idle_notebook_first(conn: psycopg.Connection) -> None:
    now = datetime(2026, 12, 9, 15, 0, tzinfo=UTC)
    fill(conn, now)
    r = ranking(conn, period_start("day", now), now, now, 60.0)
    assert [w.key for w in r.runs] == ["notebook", "allreduce-stuck"]  # the clean run wasted nothing
    hours = (20 * 60 - 10) / 3600
    assert float(r.runs[0].waste_hours) == pytest.approx(8 * hours, abs=1e-8)
    assert float(r.runs[1].waste_hours) == pytest.approx(4 * hours / 2, abs=1e-8)
    assert [w.key for w in r.teams] == ["research", "lm"]
    assert r.teams[1].ledger.runs == 2 and float(r.teams[1].gpu_hours) == pytest.approx(8 * hours, abs=1e-8)
    # money: 3 EUR per GPU-hour
    assert float(r.runs[0].costs()["EUR"]) == pytest.approx(8 * hours * 3.0, abs=0.01)


@pytest.mark.parametrize(
    ("period", "start"),
    [
        ("day", datetime(2026, 12, 9, tzinfo=UTC)),
        ("week", datetime(2026, 12, 7, tzinfo=UTC)),
        ("month", datetime(2026, 12, 1, tzinfo=UTC)),
    ],
)
def test_periods_are_calendar_periods_in_utc(period: str, start: datetime) -> None:
    assert period_start(period, datetime(2026, 12, 9, 15, 0, tzinfo=UTC)) == start  # type: ignore[arg-type]


def test_the_page_ranks_links_and_is_in_the_nav(api: Api) -> None:
    now = datetime.now(UTC)
    with psycopg.connect(api.db, autocommit=True) as conn:
        fill(conn, now)
    with httpx.Client(base_url=api.url, cookies={"gpufleet_token": api.tokens["sre"]}, timeout=30) as c:
        page = c.get("/waste", params={"period": "month"})
        bad = c.get("/waste", params={"period": "year"})
    assert page.status_code == 200, page.text
    text = page.text
    assert '<a href="/waste" aria-current="page">Waste</a>' in text
    runs = text[text.index("Runs that wasted most") : text.index("Teams that wasted most")]
    assert runs.index("notebook") < runs.index("allreduce-stuck") and "busy" not in runs
    assert '<a href="/runs/notebook">notebook</a>' in runs
    assert re.search(r"EUR", runs)
    assert bad.status_code == 422 and "Period must be one of day, week, month" in bad.text
    # finance sees the page, without links to run pages it may not open
    with httpx.Client(base_url=api.url, cookies={"gpufleet_token": api.tokens["finance"]}, timeout=30) as c:
        seen = c.get("/waste", params={"period": "month"})
    assert seen.status_code == 200 and "notebook" in seen.text and 'href="/runs/notebook"' not in seen.text


def test_the_finance_page_shows_each_rows_waste(api: Api) -> None:
    now = datetime.now(UTC)
    with psycopg.connect(api.db, autocommit=True) as conn:
        fill(conn, now)
    with httpx.Client(base_url=api.url, cookies={"gpufleet_token": api.tokens["finance"]}, timeout=30) as c:
        page = c.get("/finance", params={"group_by": "run"})
    assert page.status_code == 200 and "Wasted GPU-h" in page.text
    row = re.search(r"<tr><td>notebook</td>.*?</tr>", page.text)
    assert row is not None
    # 8 GPUs idle for 1190 s: 2.64 GPU-hours, at 3 EUR each
    assert '<td class="num">2.64</td><td class="num">7.93 EUR</td></tr>' in row.group(0), row.group(0)
