"""The finance page: a period, rows per site, team or run with the unallocated GPU time and the totals,
kWh and cost per day per team, and the report's CSV and JSON downloadable from the browser session.

The figures are the finance report's (:func:`gpufleet.accounting.report.finance_report`, the API's
``/v1/reports/finance.*``) and, per day, the same accounting a day at a time, so the page, the API,
the CSV and the Grafana board cannot disagree.  The downloads here use the browser's session cookie
(the API's own ``/v1/reports`` take a bearer token), checked by the same gate as every page.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gpufleet.accounting.line_errors import problems
from gpufleet.accounting.lines import by_day
from gpufleet.accounting.report import FinanceReport, finance_csv, finance_report
from gpufleet.accounting.snapshot import snapshot
from gpufleet.api.deps import ApiState
from gpufleet.api.web.html import Markup, esc, h, join, num, page, table
from gpufleet.api.web.pages import _read
from gpufleet.api.web.session import capabilities, gate, html, secure
from gpufleet.api.web.svg import bar_chart
from gpufleet.auth import Principal
from gpufleet.store import views

router = APIRouter(include_in_schema=False)

GROUPS = ("team", "site", "run")
DEFAULT_DAYS = 7
#: Longest period the page draws per day (a year); longer ones are refused with a message.
MAX_DAYS = 366


class PeriodError(ValueError):
    pass


def _day(text: str | None, name: str) -> date | None:
    if not text:
        return None
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise PeriodError(f"{name}: {text!r} is not a date; use YYYY-MM-DD (00:00 UTC)") from None


def period(since: str | None, until: str | None, today: date) -> tuple[date, date]:
    """[from, to) in whole UTC days; the default is the last week up to and including today."""
    lo = _day(since, "From")
    hi = _day(until, "To")
    if hi is None:
        hi = today + timedelta(days=1)
    if lo is None:
        lo = hi - timedelta(days=DEFAULT_DAYS + 1)
    if hi <= lo:
        raise PeriodError("To must be after From")
    if (hi - lo).days > MAX_DAYS:
        raise PeriodError(f"choose at most {MAX_DAYS} days")
    return lo, hi


def _utc(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _money(r: dict[str, Any], key: str) -> Markup:
    if r.get(key) is None:
        return Markup("&mdash;")
    return num(r[key], int(r.get("minor_units", 2)), r.get("currency") or "")


LABELS = {
    "run": "Run",
    "site": "Site",
    "team": "Team",
    "unallocated": "No run (with telemetry)",
    "no_telemetry": "No run, no telemetry",
    "total": "Total",
}


def _row_cells(r: dict[str, Any]) -> list[object]:
    kind = r["row_type"]
    if kind in ("run", "site", "team"):
        name = r["key"] if r["key"] is not None else h("<em>{}</em>", f"no {kind}")
    elif kind == "total" and r["key"] == "all":
        name = h("<strong>{}</strong>", "Whole fleet")
    else:
        name = h("<strong>{}</strong>", LABELS[kind]) if kind == "total" else esc(LABELS[kind])
    return [
        name,
        r["runs"],
        num(r["gpu_hours"], 2),
        num(r["facility_kwh"], 3),
        num(r["co2e_kg"], 3),
        _money(r, "energy_cost"),
        _money(r, "compute_cost"),
        _money(r, "total_cost"),
        r.get("currency") or "",
        num(None if r["coverage"] is None else 100.0 * float(r["coverage"]), 1, "%"),
        num(r.get("waste_gpu_hours"), 2),
        _money(r, "waste_cost"),
    ]


HEADERS = (
    "",
    "Runs",
    "GPU-hours",
    "Facility kWh",
    "kg CO2e",
    "Energy cost",
    "Compute cost",
    "Total",
    "Currency",
    "Coverage",
    "Wasted GPU-h",
    "Waste cost",
)


#: Day labels, and facility kWh and cost per day per team.
Daily = tuple[list[str], dict[str, list[float]], dict[str, list[float]]]


def _daily(conn: psycopg.Connection, st: ApiState, lo: datetime, hi: datetime, now: datetime) -> Daily:
    """Facility kWh and total cost per day per team (and for GPU time no run held), from the accounting a
    day at a time (:func:`~gpufleet.accounting.lines.by_day`)."""
    days = [(lo + timedelta(days=i)) for i in range((hi - lo).days)]
    index = {d: i for i, d in enumerate(days)}
    with snapshot(conn):
        rows = by_day(conn, lo, hi, now, fleet=True, max_gap_s=st.settings.accounting.max_gap_s)
        teams = views.teams(conn, [r.run_id for r in rows if r.run_id])
    kwh: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    cost: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    for ln in rows:
        if ln.line == "total" or ln.start is None:
            continue
        day = datetime(ln.start.year, ln.start.month, ln.start.day, tzinfo=UTC)
        if day not in index:
            continue
        who = (teams.get(ln.run_id or "") or "no team") if ln.line == "run" else "no run"
        kwh[who][index[day]] += float(ln.facility_kwh)
        if ln.currency and not problems([ln]).keys() & {"energy_cost", "compute_cost"}:
            # a line a stored price makes meaningless is left out of the chart (the tables say why)
            cost[f"{who} ({ln.currency})"][index[day]] += float(ln.total_cost)
    return [d.strftime("%m-%d") for d in days], dict(sorted(kwh.items())), dict(sorted(cost.items()))


def _report_of(
    conn: psycopg.Connection, st: ApiState, lo: datetime, hi: datetime, group_by: str, now: datetime
) -> FinanceReport:
    return finance_report(
        conn,
        lo,
        hi,
        group_by=group_by,  # type: ignore[arg-type]
        now=now,
        max_gap_s=st.settings.accounting.max_gap_s,
    )


def _finance(rep: FinanceReport, daily: Daily, lo_d: date, hi_d: date, group_by: str) -> Markup:
    labels, kwh, cost = daily
    query = urlencode({"from": lo_d.isoformat(), "to": hi_d.isoformat(), "group_by": group_by})
    groups = [r for r in rep.rows if r["row_type"] == group_by]
    others = [r for r in rep.rows if r["row_type"] != group_by]
    totals = [r for r in rep.rows if r["row_type"] == "total"]
    whole = next((t for t in totals if t["key"] == "all"), totals[0] if totals else None)
    idle_h = sum(
        float(r["gpu_hours"] or 0) for r in others if r["row_type"] in ("unallocated", "no_telemetry")
    )
    figures = [(_money(t, "total_cost"), f"total {t['currency']}") for t in totals if t["currency"]]
    figures += [
        (num(whole["facility_kwh"] if whole else 0.0, 1, "kWh"), "facility energy"),
        (num(idle_h, 1, "h"), "GPU-hours no run held (with or without telemetry)"),
    ]
    cards = join(
        h('<div class="card"><div class="value">{}</div><div class="label">{}</div></div>', v, label)
        for v, label in figures
    )
    problems_seen = list(dict.fromkeys(e for r in rep.rows for e in r.get("errors") or []))
    notice = join(h('<p class="error" role="alert">{}</p>', e) for e in problems_seen[:20])
    return join(
        [
            notice,
            h(
                '<form method="get" action="/finance" class="period">'
                '<label for="from">From (00:00 UTC)</label><input id="from" name="from" type="date" value="{}">'
                '<label for="to">To (exclusive)</label><input id="to" name="to" type="date" value="{}">'
                '<label for="group_by">Rows per</label><select id="group_by" name="group_by">{}</select>'
                '<button type="submit">Show</button></form>'
                '<p class="downloads">Download: <a href="/finance/report.csv?{}" download>CSV</a> '
                '<a href="/finance/report.json?{}">JSON</a> (the columns of <code>GET /v1/reports/finance.csv</code>)</p>'
                '<section class="cards">{}</section>'
                "<section><h2>By {}</h2>{}</section>"
                "<section><h2>GPU time no run held, and totals</h2>{}</section>"
                "<section><h2>Per day</h2>{}{}</section>"
                '<p class="hint">Money in each currency\'s minor units; totals are the sum of the rows above them to the '
                "cent. GPU time no run held is split by telemetry: hours with samples carry energy and cost, hours without "
                "any are only counted. Wasted GPU-hours are those the runs' ledgers put in any state but productive "
                '(idle, hung, checkpoint, starved, straggler wait, throttled); the <a href="/waste">Waste</a> page ranks '
                "them. Up to {}.</p>",
                lo_d.isoformat(),
                hi_d.isoformat(),
                join(
                    h(
                        '<option value="{}"{}>{}</option>',
                        g,
                        Markup(" selected") if g == group_by else Markup(""),
                        g,
                    )
                    for g in GROUPS
                ),
                query,
                query,
                cards,
                group_by,
                table(
                    HEADERS,
                    (_row_cells(r) for r in groups),
                    numeric=range(1, 12),
                    empty="No runs in this period.",
                ),
                table(HEADERS, (_row_cells(r) for r in others), numeric=range(1, 12)),
                bar_chart("Facility energy per day, per team", labels, list(kwh.items()), "kWh"),
                bar_chart(
                    "Cost per day, per team",
                    labels,
                    list(cost.items()),
                    " / ".join(sorted({t["currency"] for t in totals if t["currency"]})) or "money",
                ),
                rep.window_end.strftime("%Y-%m-%d %H:%M UTC"),
            ),
        ]
    )


def _render(who: Principal, body: Markup, status: int = 200) -> Response:
    return html(page("Finance", body, who=who, active="/finance", allowed=capabilities(who)), status)


@router.get("/finance")
async def finance_page(request: Request, group_by: str = "team") -> Response:
    who = await gate(request, "read_accounting")
    if isinstance(who, Response):
        return who
    q = request.query_params
    try:
        lo, hi = period(q.get("from"), q.get("to"), datetime.now(UTC).date())
    except PeriodError as e:
        return _render(
            who,
            h(
                '<p class="error" role="alert">{}</p><p><a href="/finance">Back to the last week</a></p>',
                str(e),
            ),
            422,
        )
    group = group_by if group_by in GROUPS else "team"
    now = datetime.now(UTC)
    # the report and the day chart are two independent fleet-wide accountings: each on a connection of
    # its own, at once, so the page waits for the longer, not for both
    rep, daily = await asyncio.gather(
        _read(request, _report_of, _utc(lo), _utc(hi), group, now),
        _read(request, _daily, _utc(lo), _utc(hi), now),
    )
    if isinstance(rep, Response):
        return rep
    if isinstance(daily, Response):
        return daily
    return _render(who, _finance(rep, daily, lo, hi, group))


async def _report(request: Request) -> tuple[Principal, Any] | Response:
    who = await gate(request, "read_accounting")
    if isinstance(who, Response):
        return who
    q = request.query_params
    group_by = q.get("group_by") or "run"
    try:
        lo, hi = period(q.get("from"), q.get("to"), datetime.now(UTC).date())
    except PeriodError as e:
        return secure(JSONResponse({"detail": str(e)}, status_code=422))
    if group_by not in GROUPS:
        return secure(
            JSONResponse({"detail": f"group_by must be one of {', '.join(GROUPS)}"}, status_code=422)
        )

    rep = await _read(request, _report_of, _utc(lo), _utc(hi), group_by, datetime.now(UTC))
    if isinstance(rep, Response):
        return rep
    return who, rep


@router.get("/finance/report.csv")
async def finance_report_csv(request: Request) -> Response:
    got = await _report(request)
    if isinstance(got, Response):
        return got
    _, rep = got
    name = f"finance_{rep.group_by}_{rep.since:%Y%m%d}_{rep.until:%Y%m%d}.csv"
    return secure(
        Response(
            finance_csv(rep),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    )


@router.get("/finance/report.json")
async def finance_report_json(request: Request) -> Response:
    got = await _report(request)
    if isinstance(got, Response):
        return got
    return secure(JSONResponse(got[1].body()))
