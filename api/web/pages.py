"""The pages: fleet overview, runs with live accounting, a run with its charts, incidents, accounting.

sre and admin see everything; finance sees the accounting page only (the
roles' ``read`` and ``read_accounting`` capabilities, as in the API).  Each
handler checks the viewer, then reads the database in the thread pool.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from psycopg_pool import PoolTimeout

from gpufleet import xid
from gpufleet.accounting.result import AccountingBody
from gpufleet.api.deps import ApiState, state
from gpufleet.api.web.costs import Costs, run_costs
from gpufleet.api.web.html import Markup, ago, badge, esc, h, join, link, num, page, table, when
from gpufleet.api.web.session import capabilities, gate, html
from gpufleet.api.web.svg import Series, line_chart
from gpufleet.auth import Principal
from gpufleet.store import views as queries
from gpufleet.store.run_model import state_at

router = APIRouter(include_in_schema=False)
T = TypeVar("T")
log = logging.getLogger(__name__)

RUNS_LIMIT = 100
#: Longest run id the API registers (gpufleet.store.runs.RUN_ID_RE).
MAX_RUN_ID = 128
WINDOWS_H = (1.0, 6.0, 24.0, 168.0)


async def _read(request: Request, fn: Callable[..., T], *args: Any) -> T | Response:
    st: ApiState = state(request)

    def work() -> T:
        with st.pool.connection() as conn:
            return fn(conn, st, *args)

    try:
        return await run_in_threadpool(work)
    except (psycopg.OperationalError, PoolTimeout):
        return html(page("Database unavailable", h("<p>The database does not answer; retry in a moment.</p>")), 503)
    except psycopg.DataError:
        # A value PostgreSQL cannot hold (a NUL in text, a time out of range) is the request's fault.
        return html(page("Bad request", h("<p>The address holds a value that cannot be looked up.</p>")), 400)


def _render(who: Principal, title: str, body: Markup, active: str, refresh_s: int | None = None) -> Response:
    return html(page(title, body, who=who, active=active, refresh_s=refresh_s, allowed=capabilities(who)))


def _run_state(run: dict[str, Any], now: datetime) -> Markup:
    state = state_at(run["start"], run["end"], now)
    return badge(state, "ok" if state == "running" else "muted")


def _severity(sev: str) -> Markup:
    return badge(sev, "critical" if sev == "critical" else "warning")


def _evidence(ev: dict[str, Any] | None) -> Markup:
    if not ev:
        return Markup("")
    scalars = [(k, v) for k, v in ev.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    short = join((h("{}={}", k, f"{v:.3g}" if isinstance(v, float) else v) for k, v in scalars[:6]), " ")
    full = json.dumps(ev, sort_keys=True, indent=1, default=str)
    return h('<details><summary>{}</summary>{}<pre>{}</pre></details>', short or "details", _xid_lines(ev), full)


def _actions(actions: list[dict[str, Any]] | None) -> Markup:
    """What the quarantine hooks did about the incident (drain, cordon, dry run), newest last."""
    items = [a for a in actions or [] if isinstance(a, dict)]
    if not items:
        return Markup("")
    lines = join((h("<li>{} {} {}: <strong>{}</strong> {}</li>", a.get("time", ""), a.get("action", ""),
                    a.get("target", ""), a.get("result", ""), a.get("detail", "")) for a in items), "")
    return h('<ul class="actions" aria-label="quarantine actions">{}</ul>', lines)


def _xid_lines(ev: dict[str, Any]) -> Markup:
    """The XIDs an incident names, decoded (gpufleet.xid): what each means and what to do."""
    codes: set[int] = set()
    for key in ("xid_codes", "xids"):
        if isinstance(ev.get(key), list):
            codes.update(int(c) for c in ev[key] if isinstance(c, int) and not isinstance(c, bool))
    if isinstance(ev.get("last_xid"), int) and ev["last_xid"] > 0:
        codes.add(int(ev["last_xid"]))
    if not codes:
        return Markup("")
    items = []
    for c in sorted(codes):
        info = xid.describe(c)
        items.append(h("<li>{} &mdash; {} (first action: {})</li>", xid.label(c), info.meaning,
                       info.action.replace("_", " ")) if info else h("<li>{}</li>", xid.label(c)))
    return h('<ul class="xids">{}</ul>', join(items, ""))


def _where(i: dict[str, Any]) -> Markup:
    gpus = (i.get("evidence") or {}).get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(g, dict) for g in gpus):
        by_node: dict[str, list[str]] = {}
        for g in gpus:
            by_node.setdefault(str(g.get("node")), []).append(str(g.get("gpu")))
        return esc("; ".join(f"{n}/{','.join(gs)}" for n, gs in sorted(by_node.items())))
    if i["node"] is None:
        return Markup("whole run")
    if i["gpu"] is None:
        return esc(f"{i['node']}")
    return esc(f"{i['node']}/{i['gpu']}")


def _lost(i: dict[str, Any]) -> object:
    """What a run-scoped incident lost: GPU-hours and total cost (contracts.md section 3.2)."""
    lost = i.get("lost")
    if not lost:
        return Markup("&mdash;")
    return h("{} GPU-h, {}", num(lost.get("gpu_hours"), 2), num(lost.get("total_cost"), lost.get("minor_units", 2),
                                                              lost.get("currency") or ""))


def costed(conn: psycopg.Connection, st: ApiState, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Incidents with what each lost (``lost``); without it where accounting fails (the page still renders)."""
    try:
        from gpufleet.accounting.incidents import incident_costs

        lost = incident_costs(conn, rows, now=datetime.now(UTC), max_gap_s=st.settings.accounting.max_gap_s)
    except (ImportError, psycopg.Error) as e:
        log.warning("incident costs for the web view failed: %s", type(e).__name__)
        return rows
    for r in rows:
        r["lost"] = lost.get(r["id"])
    return rows


def _incident_rows(rows: list[dict[str, Any]], can_read: bool) -> list[list[object]]:
    out: list[list[object]] = []
    for i in rows:
        run_cell: object = link(f"/runs/{_q(i['run_id'])}", i["run_id"]) if i["run_id"] and can_read else \
            (i["run_id"] or "")
        out.append([esc(i["kind"].replace("_", " ")), _severity(i["severity"]),
                    badge(i["state"], "muted" if i["state"] == "resolved" else "warning"),
                    run_cell, _where(i), i["cause"] or "", when(i["start"]), when(i["end"]), _lost(i),
                    join((_evidence(i["evidence"]), _actions(i.get("actions"))))])
    return out


INCIDENT_HEADERS = ("Kind", "Severity", "State", "Run", "Where", "Cause", "Start", "End", "Lost", "Evidence")


def _q(run_id: str) -> str:
    return quote(run_id, safe="")


# ---------------------------------------------------------------- accounting columns

ACCOUNTING_HEADERS = ("GPU-hours", "IT kWh", "Facility kWh", "Energy cost", "Compute cost", "Total cost",
                      "CO2e kg", "Coverage")


def _money(a: Mapping[str, Any], key: str) -> Markup:
    return num(a.get(key), 2, a.get("currency") or "")


def _accounting_cells(a: AccountingBody | None) -> list[object]:
    if a is None:
        return [Markup("&mdash;")] * len(ACCOUNTING_HEADERS)
    cov = a.get("coverage")
    return [num(a.get("gpu_hours"), 2), num(a.get("it_kwh"), 3), num(a.get("facility_kwh"), 3),
            _money(a, "energy_cost"), _money(a, "compute_cost"), _money(a, "total_cost"), num(a.get("co2e_kg"), 3),
            num(None if cov is None else 100.0 * float(cov), 1, "%")]


def _note(costs: Costs) -> Markup:
    return h('<p class="notice" role="status">{}</p>', costs.note) if costs.note else Markup("")


# ---------------------------------------------------------------- fleet


def _fleet(conn: psycopg.Connection, st: ApiState) -> Markup:
    f = queries.fleet_now(conn)
    now = datetime.now(UTC)
    if f.as_of is None:
        freshness = Markup('<p class="notice">No samples received yet.</p>')
    else:
        freshness = h('<p class="asof">Latest readings as of {} ({} ago).</p>', when(f.as_of),
                      ago((now - f.as_of).total_seconds()))
    cards = join(h('<div class="card"><div class="value">{}</div><div class="label">{}</div></div>', v, label)
                 for v, label in ((f.gpus, "GPUs reporting"), (f.busy, "busy"), (f.idle, "idle"),
                                  (f.starved, "starved"), (num(f.power_w / 1000.0, 1, "kW"), "GPU power now"),
                                  (f.running_runs, "runs running"),
                                  (sum(n for _, n, _ in f.open_by_kind), "open incidents")))
    kinds = table(("Kind", "Open", "Critical"),
                  ([link("/incidents", k.replace("_", " ")), n, c] for k, n, c in f.open_by_kind),
                  numeric=(1, 2), empty="No open incidents.")
    nodes = table(("Node", "Site", "GPUs", "Busy", "Starved", "GPU-Util", "Power", "Last batch"),
                  ([link("/nodes/" + quote(n["node"], safe=""), n["node"]), n["site"] or "", n.get("gpus", 0),
                    n.get("busy", 0), n.get("starved", 0),
                    num(n.get("util_pct"), 0, "%"), num(n.get("power_w"), 0, "W"),
                    h("{} ago", ago(n["silent_s"])) if n["silent_s"] is not None else Markup("&mdash;")]
                   for n in f.nodes), numeric=(2, 3, 4, 5, 6), empty="No node has reported yet.")
    return h('{}<section class="cards">{}</section><div class="cols"><section><h2>Open incidents</h2>{}'
             '</section><section><h2>Nodes</h2>{}</section></div>', freshness, cards, kinds, nodes)


@router.get("/")
async def fleet(request: Request) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    body = await _read(request, _fleet)
    if isinstance(body, Response):
        return body
    return _render(who, "Fleet", body, "/", refresh_s=30)


# ---------------------------------------------------------------- runs


def _runs(conn: psycopg.Connection, st: ApiState) -> Markup:
    rows = queries.runs(conn, RUNS_LIMIT)
    costs = run_costs(conn, [r["run_id"] for r in rows], st.settings.accounting.max_gap_s)
    now = datetime.now(UTC)
    body = table(
        ("Run", "Name", "Team", "Site", "State", "Start", "GPUs", "Open incidents", *ACCOUNTING_HEADERS),
        ([link(f"/runs/{_q(r['run_id'])}", r["run_id"]), r["name"] or "", r["team"] or "", r["site"] or "",
          _run_state(r, now), when(r["start"]), r["gpus"],
          h("{} {}", r["open_incidents"], r["open_kinds"] or "") if r["open_incidents"] else 0,
          *_accounting_cells(costs.by_run.get(r["run_id"]))] for r in rows),
        numeric=(6, 8, 9, 10, 11, 12, 13, 14, 15), empty="No runs registered.")
    return h("{}{}<p class=\"hint\">Energy, cost and CO2e up to now, as <code>GET /v1/runs/&lt;run&gt;/accounting"
             "</code> reports them; newest {} runs.</p>", _note(costs), body, RUNS_LIMIT)


@router.get("/runs")
async def runs(request: Request) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    body = await _read(request, _runs)
    if isinstance(body, Response):
        return body
    return _render(who, "Runs", body, "/runs")


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
    facts = table(("Run", "Name", "Team", "Site", "State", "Start", "End", "GPUs", "Allocation"),
                  [[run["run_id"], run["name"] or "", run["team"] or "", run["site"] or "", _run_state(run, now),
                    when(run["start"]), when(run["end"]), run["gpus"], run["allocation"] or ""]])
    acc = table(("Energy (GPU)", "Energy (host share)", "PUE", *ACCOUNTING_HEADERS),
                [[num(a.get("gpu_kwh"), 3, "kWh"), num(a.get("host_kwh"), 3, "kWh"), num(a.get("pue"), 2),
                  *_accounting_cells(a)]] if a else [], empty="No accounting figures.",
                numeric=range(11))
    lost = a["lost_to_incidents"] if a else None
    if lost and a:
        acc = join((acc, h("<p class=\"lost\">Lost to incidents ({} incidents, overlaps counted once): {} GPU-hours, "
                           "{} facility, {} &mdash; {} of the run's cost.</p>", lost["incidents"],
                           num(lost["gpu_hours"], 2), num(lost["facility_kwh"], 3, "kWh"),
                           num(lost["total_cost"], lost.get("minor_units", 2), lost.get("currency") or ""),
                           num(100.0 * lost["total_cost"] / a["total_cost"], 1, "%")
                           if a and a.get("total_cost") else Markup("&mdash;"))))
    lo, hi = _window(run, queries.newest_sample_time(conn), hours)
    series = queries.run_gpu_series(conn, run_id, lo, hi)
    names = {k: f"{k[0]}/{k[1]}" for k in series.points}
    util = [Series(names[k], [(t, u) for t, u, _ in pts]) for k, pts in sorted(series.points.items())]
    power = [Series(names[k], [(t, p) for t, _, p in pts]) for k, pts in sorted(series.points.items())]
    span = "whole run" if hours is None else f"last {hours:g} h"
    picks = join((link(f"/runs/{_q(run_id)}?hours={w:g}", f"{w:g} h") for w in WINDOWS_H), " ")
    charts = h('<p class="window">Window: {} ({} to {}). Show: {} {}</p>{}{}', span, when(lo), when(hi), picks,
               link(f"/runs/{_q(run_id)}?hours=all", "whole run"),
               line_chart("GPU-Util per GPU", util, "%", y_max=100.0, step_s=series.step_s),
               line_chart("Board power per GPU", power, "W", step_s=series.step_s))
    incs = table(INCIDENT_HEADERS, _incident_rows(costed(conn, st, queries.incidents(conn, run_id=run_id)), True),
                 empty="No incidents for this run.")
    return h("{}<section>{}</section><section><h2>Accounting so far</h2>{}</section>"
             "<section><h2>GPUs</h2>{}</section><section><h2>Incidents</h2>{}</section>",
             _note(costs), facts, acc, charts, incs)


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
        return html(page("Bad request", h("<p>hours must be a number of hours or 'all'.</p>"), who=who,
                         allowed=capabilities(who)), 400)
    # An id no run can have (longer than any registered one) is not looked up; a NUL is a 400 (_read).
    body = await _read(request, _run_page, run_id, span) if len(run_id) <= MAX_RUN_ID else None
    if isinstance(body, Response):
        return body
    if body is None:
        return html(page("Run not found", h("<p>No run {} is registered.</p>", run_id), who=who,
                         allowed=capabilities(who)), 404)
    return _render(who, f"Run {run_id}", body, "/runs")


# ---------------------------------------------------------------- incidents and accounting


def _incidents(conn: psycopg.Connection, st: ApiState, which: str) -> Markup:
    rows = costed(conn, st, queries.incidents(conn, state=None if which == "all" else which))
    tabs = join((link(f"/incidents?state={s}", s) if s != which else h("<strong>{}</strong>", s)
                 for s in ("open", "resolved", "all")), " | ")
    return h('<p class="tabs">{}</p>{}', tabs,
             table(INCIDENT_HEADERS, _incident_rows(rows, True), empty=f"No {which} incidents."))


@router.get("/incidents")
async def incidents(request: Request, state: str = "open") -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    which = state if state in ("open", "resolved", "all") else "open"
    body = await _read(request, _incidents, which)
    if isinstance(body, Response):
        return body
    return _render(who, "Incidents", body, "/incidents")


def _accounting(conn: psycopg.Connection, st: ApiState, can_read: bool) -> Markup:
    rows = queries.runs(conn, RUNS_LIMIT)
    costs = run_costs(conn, [r["run_id"] for r in rows], st.settings.accounting.max_gap_s)
    now = datetime.now(UTC)
    body = table(
        ("Run", "Name", "Team", "Site", "State", "Start", "End", "GPUs", *ACCOUNTING_HEADERS),
        ([link(f"/runs/{_q(r['run_id'])}", r["run_id"]) if can_read else r["run_id"], r["name"] or "",
          r["team"] or "", r["site"] or "", _run_state(r, now), when(r["start"]), when(r["end"]), r["gpus"],
          *_accounting_cells(costs.by_run.get(r["run_id"]))] for r in rows),
        numeric=range(7, 16), empty="No runs registered.")
    return h("{}{}<p class=\"hint\">Up to now. Periods, totals and the finance report's CSV are on the "
             "<a href=\"/finance\">Finance</a> page.</p>", _note(costs), body)


@router.get("/accounting")
async def accounting(request: Request) -> Response:
    who = await gate(request, "read_accounting")
    if isinstance(who, Response):
        return who
    body = await _read(request, _accounting, "read" in capabilities(who))
    if isinstance(body, Response):
        return body
    return _render(who, "Accounting", body, "/accounting")
