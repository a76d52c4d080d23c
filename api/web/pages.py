"""The pages: fleet overview, runs with live accounting, a run with its charts, accounting.

sre and admin see everything; finance sees the accounting page only (the
roles' ``read`` and ``read_accounting`` capabilities, as in the API).  Each
handler checks the viewer, then reads the database in the thread pool.
Incidents have pages of their own (:mod:`gpufleet.api.web.incident_pages`);
every page links to the runs, nodes and incidents it names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpufleet.accounting.result import AccountingBody
from gpufleet.api.deps import ApiState
from gpufleet.api.web.cause import explain
from gpufleet.api.web.charts import gpu_charts, incident_spans
from gpufleet.api.web.common import (
    LIVE_REFRESH_S,
    costed,
    incident_href,
    node_href,
    q,
    read,
    render,
    run_href,
    run_state,
    severity_badge,
)
from gpufleet.api.web.costs import Costs, run_costs
from gpufleet.api.web.html import Markup, ago, esc, h, join, link, num, page, table, when, when_short
from gpufleet.api.web.incident_pages import INCIDENT_HEADERS, incident_rows, incident_table
from gpufleet.api.web.landing import or_landing
from gpufleet.api.web.session import capabilities, gate, html
from gpufleet.auth import Principal
from gpufleet.store import views as queries

router = APIRouter(include_in_schema=False)

RUNS_LIMIT = 100
#: Longest run id the API registers (gpufleet.store.runs.RUN_ID_RE).
MAX_RUN_ID = 128
WINDOWS_H = (1.0, 6.0, 24.0, 168.0)
#: Open incidents named on the fleet page, most severe first.
FLEET_INCIDENTS = 12

# Names other page modules import from here.
_read = read
__all__ = ["INCIDENT_HEADERS", "_incident_rows", "_read", "_render", "costed", "router"]


def _render(who: Principal, title: str, body: Markup, active: str, refresh_s: int | None = None) -> Response:
    return render(who, title, body, active, refresh_s)


def _incident_rows(rows: list[dict[str, Any]], can_read: bool) -> list[list[object]]:
    return incident_rows(rows, can_read)


def _q(run_id: str) -> str:
    return q(run_id)


# ---------------------------------------------------------------- accounting columns

#: The run tables' accounting columns (the whole body is one click away, on the run's page).
ACCOUNTING_HEADERS = ("GPU-hours", "Facility kWh", "Total cost", "CO2e kg", "Coverage")
#: The accounting page's: energy and compute cost apart.
ACCOUNTING_DETAIL_HEADERS = (
    "GPU-hours",
    "IT kWh",
    "Facility kWh",
    "Energy cost",
    "Compute cost",
    "Total cost",
    "CO2e kg",
    "Coverage",
)


def _money(a: Mapping[str, Any], key: str) -> Markup:
    return num(a.get(key), int(a.get("minor_units", 2) or 2), a.get("currency") or "")


def _coverage(a: Mapping[str, Any]) -> Markup:
    cov = a.get("coverage")
    return num(None if cov is None else 100.0 * float(cov), 1, "%")


def _accounting_cells(a: AccountingBody | None) -> list[object]:
    if a is None:
        return [Markup("&mdash;")] * len(ACCOUNTING_HEADERS)
    return [
        num(a.get("gpu_hours"), 2),
        num(a.get("facility_kwh"), 3),
        _money(a, "total_cost"),
        num(a.get("co2e_kg"), 3),
        _coverage(a),
    ]


def _accounting_detail_cells(a: AccountingBody | None) -> list[object]:
    if a is None:
        return [Markup("&mdash;")] * len(ACCOUNTING_DETAIL_HEADERS)
    return [
        num(a.get("gpu_hours"), 2),
        num(a.get("it_kwh"), 3),
        num(a.get("facility_kwh"), 3),
        _money(a, "energy_cost"),
        _money(a, "compute_cost"),
        _money(a, "total_cost"),
        num(a.get("co2e_kg"), 3),
        _coverage(a),
    ]


def _note(costs: Costs) -> Markup:
    return h('<p class="notice" role="status">{}</p>', costs.note) if costs.note else Markup("")


def _run_cell(r: Mapping[str, Any], can_read: bool = True) -> Markup:
    """A run's id (linked) with its name under it."""
    ident = link(run_href(r["run_id"]), r["run_id"]) if can_read else esc(r["run_id"])
    return h('{}<br><span class="sub">{}</span>', ident, r.get("name") or "") if r.get("name") else ident


# ---------------------------------------------------------------- fleet


def _fleet(conn: psycopg.Connection, st: ApiState) -> Markup:
    f = queries.fleet_now(conn)
    now = datetime.now(UTC)
    if f.as_of is None:
        freshness = Markup('<p class="notice">No samples received yet.</p>')
    else:
        freshness = h(
            '<p class="asof">Latest readings as of {} ({} ago). This page reloads every {} s.</p>',
            when(f.as_of),
            ago((now - f.as_of).total_seconds()),
            LIVE_REFRESH_S,
        )
    cards = join(
        h('<div class="card"><div class="value">{}</div><div class="label">{}</div></div>', v, label)
        for v, label in (
            (f.gpus, "GPUs reporting"),
            (f.busy, "busy"),
            (f.idle, "idle"),
            (f.starved, "starved"),
            (num(f.power_w / 1000.0, 1, "kW"), "GPU power now"),
            (f.running_runs, "runs running"),
            (sum(n for _, n, _ in f.open_by_kind), "open incidents"),
        )
    )
    open_rows = costed(conn, st, queries.incidents(conn, state="open", limit=FLEET_INCIDENTS))
    shown = len(open_rows)
    total_open = sum(n for _, n, _ in f.open_by_kind)
    more = (
        h(
            '<p class="hint">{} of {} open incidents, most severe first: {}.</p>',
            shown,
            total_open,
            link("/incidents", "all of them"),
        )
        if total_open > shown
        else Markup("")
    )
    kinds = table(
        ("Kind", "Open", "Critical"),
        ([link("/incidents", k.replace("_", " ")), n, c] for k, n, c in f.open_by_kind),
        numeric=(1, 2),
        empty="No open incidents.",
    )
    on_node = queries.running_runs_by_node(conn)
    nodes = table(
        ("Node", "Site", "Runs now", "GPUs", "Busy", "Starved", "GPU-Util", "Power", "Last batch"),
        (
            [
                link(node_href(n["node"]), n["node"]),
                n["site"] or "",
                join((link(run_href(r["run_id"]), r["run_id"]) for r in on_node.get(n["node"], [])), ", ")
                or Markup("&mdash;"),
                n.get("gpus", 0),
                n.get("busy", 0),
                n.get("starved", 0),
                num(n.get("util_pct"), 0, "%"),
                num(n.get("power_w"), 0, "W"),
                h("{} ago", ago(n["silent_s"])) if n["silent_s"] is not None else Markup("&mdash;"),
            ]
            for n in f.nodes
        ),
        numeric=(3, 4, 5, 6, 7),
        empty="No node has reported yet.",
    )
    return h(
        '{}<section class="cards">{}</section><section><h2>Open incidents</h2>{}{}</section>'
        '<div class="cols"><section><h2>By kind</h2>{}</section><section><h2>Nodes</h2>{}</section></div>',
        freshness,
        cards,
        incident_table(open_rows, "No open incidents."),
        more,
        kinds,
        nodes,
    )


@router.get("/")
async def fleet(request: Request) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return await or_landing(request, who)
    body = await read(request, _fleet)
    if isinstance(body, Response):
        return body
    return render(who, "Fleet", body, "/", refresh_s=LIVE_REFRESH_S, request=request)


# ---------------------------------------------------------------- runs


def _open_links(conn_rows: list[dict[str, Any]], run_id: str) -> Markup:
    mine = [i for i in conn_rows if i["run_id"] == run_id]
    if not mine:
        return Markup("0")
    return join(
        (
            h(
                "{} {}",
                link(incident_href(i["id"]), f"#{i['id']} {i['kind'].replace('_', ' ')}"),
                severity_badge(i["severity"]),
            )
            for i in mine
        ),
        "<br>",
    )


def _runs(conn: psycopg.Connection, st: ApiState) -> Markup:
    rows = queries.runs(conn, RUNS_LIMIT)
    costs = run_costs(conn, [r["run_id"] for r in rows], st.settings.accounting.max_gap_s)
    open_incidents = queries.incidents(conn, state="open", limit=1000)
    now = datetime.now(UTC)
    body = table(
        ("Run", "Team", "Site", "State", "Start", "GPUs", "Open incidents", *ACCOUNTING_HEADERS),
        (
            [
                _run_cell(r),
                r["team"] or "",
                r["site"] or "",
                run_state(r, now),
                when_short(r["start"]),
                r["gpus"],
                _open_links(open_incidents, r["run_id"]),
                *_accounting_cells(costs.by_run.get(r["run_id"])),
            ]
            for r in rows
        ),
        numeric=(5, 7, 8, 9, 10, 11),
        empty="No runs registered.",
    )
    return h(
        '{}{}<p class="hint">Energy, cost and CO2e up to now, as <code>GET /v1/runs/&lt;run&gt;/accounting'
        "</code> reports them; newest {} runs. Times are UTC.</p>",
        _note(costs),
        body,
        RUNS_LIMIT,
    )


@router.get("/runs")
async def runs(request: Request) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    body = await read(request, _runs)
    if isinstance(body, Response):
        return body
    return render(who, "Runs", body, "/runs", request=request)


def _window(run: dict[str, Any], newest: datetime | None, hours: float | None) -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    hi = min(t for t in (run["end"], newest or now, now) if t is not None)
    lo = run["start"] if hours is None else max(run["start"], hi - timedelta(hours=hours))
    return lo, max(hi, lo)


def _run_page(conn: psycopg.Connection, st: ApiState, run_id: str, hours: float | None) -> Markup | None:
    run = queries.run(conn, run_id)
    if run is None:
        return None
    now = datetime.now(UTC)
    costs = run_costs(conn, [run_id], st.settings.accounting.max_gap_s, now)
    a = costs.by_run.get(run_id)
    nodes = queries.run_nodes(conn, run_id)
    facts = table(
        ("Run", "Name", "Team", "Site", "State", "Start", "End", "GPUs", "Nodes"),
        [
            [
                run["run_id"],
                run["name"] or "",
                run["team"] or "",
                run["site"] or "",
                run_state(run, now),
                when(run["start"]),
                when(run["end"]),
                run["gpus"],
                join((link(node_href(n), n) for n in nodes), ", ") or Markup("&mdash;"),
            ]
        ],
    )
    acc = table(
        ("Energy (GPU)", "Energy (host share)", "PUE", *ACCOUNTING_DETAIL_HEADERS),
        [
            [
                num(a.get("gpu_kwh"), 3, "kWh"),
                num(a.get("host_kwh"), 3, "kWh"),
                num(a.get("pue"), 2),
                *_accounting_detail_cells(a),
            ]
        ]
        if a
        else [],
        empty="No accounting figures.",
        numeric=range(11),
    )
    lost = a["lost_to_incidents"] if a else None
    if lost and a:
        acc = join(
            (
                acc,
                h(
                    '<p class="lost">Lost to incidents ({} incidents, overlaps counted once): {} GPU-hours, '
                    "{} facility, {} &mdash; {} of the run's cost.</p>",
                    lost["incidents"],
                    num(lost["gpu_hours"], 2),
                    num(lost["facility_kwh"], 3, "kWh"),
                    num(lost["total_cost"], lost.get("minor_units", 2), lost.get("currency") or ""),
                    num(100.0 * lost["total_cost"] / a["total_cost"], 1, "%")
                    if a and a.get("total_cost")
                    else Markup("&mdash;"),
                ),
            )
        )
    lo, hi = _window(run, queries.newest_sample_time(conn), hours)
    series = queries.run_gpu_series(conn, run_id, lo, hi)
    run_incidents = costed(conn, st, queries.incidents(conn, run_id=run_id))
    span = "whole run" if hours is None else f"last {hours:g} h"
    picks = join((link(f"/runs/{q(run_id)}?hours={w:g}", f"{w:g} h") for w in WINDOWS_H), " ")
    charts = h(
        '<p class="window">Window: {} ({} to {}). Show: {} {}. Shaded: the run\'s incidents (each links to '
        "its page).</p>{}",
        span,
        when(lo),
        when(hi),
        picks,
        link(f"/runs/{q(run_id)}?hours=all", "whole run"),
        gpu_charts(series, lo, hi, incident_spans(run_incidents, lo, hi))
        if series.points
        else h('<p class="empty">No samples in this window.</p>'),
    )
    open_now = [i for i in run_incidents if i["state"] == "open"]
    why = join(
        (
            h(
                "<li>{} {}: {}</li>",
                link(incident_href(i["id"]), f"#{i['id']} {explain(i).title}"),
                severity_badge(i["severity"]),
                explain(i).sentence,
            )
            for i in open_now
        ),
        "",
    )
    headline = (
        h('<section><h2>Why it is slow now</h2><ul class="whys">{}</ul></section>', why)
        if open_now
        else Markup("")
    )
    incs = incident_table(run_incidents, "No incidents for this run.")
    return h(
        "{}<section>{}</section>{}<section><h2>Accounting so far</h2>{}</section>"
        "<section><h2>GPUs</h2>{}</section><section><h2>Incidents</h2>{}</section>",
        _note(costs),
        facts,
        headline,
        acc,
        charts,
        incs,
    )


def _span_hours(hours: str | None) -> float | None:
    """The chart window from ``?hours=``: None for ``all``, else hours clamped to [0.05, 366 days].

    Raises ValueError for anything that is not a finite number (``nan`` would reach timedelta)."""
    if hours == "all":
        return None
    value = float(hours or 1)
    if not math.isfinite(value):
        raise ValueError(hours)
    return min(max(value, 0.05), 24.0 * 366)


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str, hours: str | None = "1") -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    try:
        span = _span_hours(hours)
    except ValueError:
        return html(
            page(
                "Bad request",
                h("<p>hours must be a number of hours or 'all'.</p>"),
                who=who,
                allowed=capabilities(who),
            ),
            400,
        )
    # An id no run can have (longer than any registered one) is not looked up; a NUL is a 400 (read).
    body = await read(request, _run_page, run_id, span) if len(run_id) <= MAX_RUN_ID else None
    if isinstance(body, Response):
        return body
    if body is None:
        return html(
            page(
                "Run not found",
                h("<p>No run {} is registered.</p>", run_id),
                who=who,
                allowed=capabilities(who),
            ),
            404,
        )
    return render(who, f"Run {run_id}", body, "/runs", request=request)


# ---------------------------------------------------------------- accounting


def _accounting(conn: psycopg.Connection, st: ApiState, can_read: bool) -> Markup:
    rows = queries.runs(conn, RUNS_LIMIT)
    costs = run_costs(conn, [r["run_id"] for r in rows], st.settings.accounting.max_gap_s)
    now = datetime.now(UTC)
    body = table(
        ("Run", "Team", "Site", "State", "Start", "End", "GPUs", *ACCOUNTING_DETAIL_HEADERS),
        (
            [
                _run_cell(r, can_read),
                r["team"] or "",
                r["site"] or "",
                run_state(r, now),
                when_short(r["start"]),
                when_short(r["end"]),
                r["gpus"],
                *_accounting_detail_cells(costs.by_run.get(r["run_id"])),
            ]
            for r in rows
        ),
        numeric=range(6, 15),
        empty="No runs registered.",
    )
    return h(
        '{}{}<p class="hint">Up to now; times are UTC. Periods, totals and the finance report\'s CSV are on '
        'the <a href="/finance">Finance</a> page.</p>',
        _note(costs),
        body,
    )


@router.get("/accounting")
async def accounting(request: Request) -> Response:
    who = await gate(request, "read_accounting")
    if isinstance(who, Response):
        return who
    body = await read(request, _accounting, "read" in capabilities(who))
    if isinstance(body, Response):
        return body
    return render(who, "Accounting", body, "/accounting", request=request)
