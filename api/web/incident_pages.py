"""Incidents as people read them: the list, and one incident's page.

Every incident answers four questions in words: which job (its run, linked,
with its name and team, and the GPUs it names, each node linked), why (the
cause as a sentence with its numbers, :mod:`gpufleet.api.web.cause`), since
when (start, and how long it has lasted), and what it costs (the GPU-hours,
energy and money it lost, contracts.md section 3.2).  The raw evidence stays
one click away for whoever wants the detector's own figures.  Both pages
reload themselves while the fleet is live.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpufleet import xid
from gpufleet.api.deps import ApiState
from gpufleet.api.web.cause import explain
from gpufleet.api.web.charts import gpu_charts, incident_spans
from gpufleet.api.web.common import (
    LIVE_REFRESH_S,
    costed,
    incident_href,
    node_href,
    read,
    render,
    run_href,
    severity_badge,
)
from gpufleet.api.web.html import Markup, ago, badge, esc, h, join, link, num, page, table, when, when_short
from gpufleet.api.web.session import capabilities, gate, html
from gpufleet.store import views as queries
from gpufleet.store.incidents import get_incident

router = APIRouter(include_in_schema=False)

INCIDENT_HEADERS = ("Incident", "Run and GPUs", "Why", "Since", "Lost")
#: Longest chart window of an incident's page (a week-long incident shows its last day).
CHART_SPAN = timedelta(hours=24)
#: Context shown around an incident on its chart.
CHART_MARGIN = timedelta(minutes=10)


def raw_evidence(ev: dict[str, Any] | None) -> Markup:
    if not ev:
        return Markup("")
    full = json.dumps(ev, sort_keys=True, indent=1, default=str)
    return h('<details class="raw"><summary>Detector evidence</summary><pre>{}</pre></details>', full)


def actions_list(actions: list[dict[str, Any]] | None) -> Markup:
    """What the quarantine hooks did about the incident (drain, cordon, dry run), newest last."""
    items = [a for a in actions or [] if isinstance(a, dict)]
    if not items:
        return Markup("")
    lines = join(
        (
            h(
                "<li>{} {} {}: <strong>{}</strong> {}</li>",
                a.get("time", ""),
                a.get("action", ""),
                a.get("target", ""),
                a.get("result", ""),
                a.get("detail", ""),
            )
            for a in items
        ),
        "",
    )
    return h('<ul class="actions" aria-label="quarantine actions">{}</ul>', lines)


def xid_lines(ev: dict[str, Any]) -> Markup:
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
        items.append(
            h(
                "<li>{} &mdash; {} (first action: {})</li>",
                xid.label(c),
                info.meaning,
                info.action.replace("_", " "),
            )
            if info
            else h("<li>{}</li>", xid.label(c))
        )
    return h('<ul class="xids">{}</ul>', join(items, ""))


def lost_cell(i: dict[str, Any]) -> Markup:
    """What a run-scoped incident lost: GPU-hours and total cost (contracts.md section 3.2)."""
    lost = i.get("lost")
    if not lost:
        return Markup("&mdash;")
    return h(
        "{} GPU-h<br>{}",
        num(lost.get("gpu_hours"), 2),
        num(lost.get("total_cost"), lost.get("minor_units", 2), lost.get("currency") or ""),
    )


def _gpu_links(gpus: tuple[tuple[str, int], ...], node: str | None) -> Markup:
    by_node: dict[str, list[int]] = {}
    for n, g in gpus:
        by_node.setdefault(n, []).append(g)
    if not by_node and node:
        return link(node_href(node), node)
    return join(
        (
            h(
                '{} <span class="gpus">GPU {}</span>',
                link(node_href(n), n),
                ",".join(str(g) for g in sorted(gs)),
            )
            for n, gs in sorted(by_node.items())
        ),
        "; ",
    )


def _since(i: dict[str, Any], now: datetime) -> Markup:
    start, end = i.get("start"), i.get("end")
    if start is None:
        return Markup("&mdash;")
    lasted = ((end or now) - start).total_seconds()
    if end is None:
        return h(
            '<span class="nowrap">{}</span><br><span class="sub">{} so far</span>',
            when_short(start),
            ago(lasted),
        )
    return h(
        '<span class="nowrap">{}</span><br><span class="sub">lasted {}</span>', when_short(start), ago(lasted)
    )


def incident_rows(rows: list[dict[str, Any]], can_read: bool = True) -> list[list[object]]:
    """Table rows: the incident (linked) with its severity and state, its run and GPUs (linked), the cause
    sentence, since when, and what it lost."""
    now = datetime.now(UTC)
    out: list[list[object]] = []
    for i in rows:
        ex = explain(i)
        head = h(
            "{} {} {}",
            link(incident_href(i["id"]), f"#{i['id']} {ex.title}"),
            severity_badge(i["severity"]),
            badge(i["state"], "muted" if i["state"] == "resolved" else "warning"),
        )
        run = (
            link(run_href(i["run_id"]), i["run_id"])
            if i.get("run_id") and can_read
            else esc(i.get("run_id") or "")
        )
        where = join((x for x in (run, _gpu_links(ex.gpus, i.get("node"))) if x), "<br>")
        out.append(
            [
                head,
                where or Markup("&mdash;"),
                h('<span class="why">{}</span>', ex.sentence),
                _since(i, now),
                lost_cell(i),
            ]
        )
    return out


def incident_table(rows: list[dict[str, Any]], empty: str, can_read: bool = True) -> Markup:
    return table(INCIDENT_HEADERS, incident_rows(rows, can_read), empty=empty, numeric=(4,))


# ---------------------------------------------------------------- the list


def _incidents(conn: psycopg.Connection, st: ApiState, which: str) -> Markup:
    rows = costed(conn, st, queries.incidents(conn, state=None if which == "all" else which))
    tabs = join(
        (
            link(f"/incidents?state={s}", s) if s != which else h("<strong>{}</strong>", s)
            for s in ("open", "resolved", "all")
        ),
        " | ",
    )
    return h(
        '<p class="tabs">{}</p>{}<p class="hint">This page reloads every {} s.</p>',
        tabs,
        incident_table(rows, f"No {which} incidents."),
        LIVE_REFRESH_S,
    )


@router.get("/incidents")
async def incidents(request: Request, state: str = "open") -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    which = state if state in ("open", "resolved", "all") else "open"
    body = await read(request, _incidents, which)
    if isinstance(body, Response):
        return body
    return render(who, "Incidents", body, "/incidents", refresh_s=LIVE_REFRESH_S, request=request)


# ---------------------------------------------------------------- one incident


def _cost_block(i: dict[str, Any]) -> Markup:
    lost = i.get("lost")
    if not lost:
        why = (
            "It has no run, so no job's time is counted as lost."
            if not i.get("run_id")
            else "No cost figures could be computed just now."
        )
        return h('<p class="hint">{}</p>', why)
    cur, mu = lost.get("currency") or "", lost.get("minor_units", 2)
    rows = [
        ["GPU time lost", num(lost.get("gpu_hours"), 2, "GPU-hours")],
        ["Energy of that time", num(lost.get("facility_kwh"), 3, "kWh (facility)")],
        ["CO2e", num(lost.get("co2e_kg"), 3, "kg")],
        ["Energy cost", num(lost.get("energy_cost"), mu, cur)],
        ["Compute cost", num(lost.get("compute_cost"), mu, cur)],
        ["Total", h("<strong>{}</strong>", num(lost.get("total_cost"), mu, cur))],
    ]
    basis = str(lost.get("basis") or "").replace("_", " ")
    share = lost.get("lost_share")
    note = h(
        '<p class="hint">{} GPUs over {}, {} of their time lost (basis: {}).</p>',
        lost.get("gpus"),
        ago(lost.get("span_s")),
        num(None if share is None else 100.0 * share, 0, "%"),
        basis,
    )
    return join((table(("What", "So far"), rows, numeric=(1,)), note))


def _incident_page(
    conn: psycopg.Connection, st: ApiState, incident_id: int
) -> tuple[Markup, dict[str, Any]] | None:
    row = get_incident(conn, incident_id)
    if row is None:
        return None
    i = costed(conn, st, [dict(row)])[0]
    ex = explain(i)
    now = datetime.now(UTC)
    run = queries.run(conn, i["run_id"]) if i.get("run_id") else None
    facts: list[Markup] = [
        h(
            "{} {}",
            severity_badge(i["severity"]),
            badge(i["state"], "muted" if i["state"] == "resolved" else "warning"),
        )
    ]
    if run is not None:
        facts.append(
            h(
                "Run {} ({}{})",
                link(run_href(run["run_id"]), run["run_id"]),
                run["name"] or "unnamed",
                f", team {run['team']}" if run["team"] else "",
            )
        )
    elif i.get("run_id"):
        facts.append(h("Run {} (not registered)", i["run_id"]))
    nodes = sorted(
        {n for n, _ in ex.gpus}
        | ({i["node"]} if i.get("node") else set())
        | (set(queries.run_nodes(conn, i["run_id"])) if run is not None and not ex.gpus else set())
    )
    if ex.gpus:
        facts.append(h("GPUs {}", _gpu_links(ex.gpus, i.get("node"))))
    elif nodes:
        facts.append(h("Nodes {}", join((link(node_href(n), n) for n in nodes), ", ")))
    lasted = ((i["end"] or now) - i["start"]).total_seconds()
    facts.append(
        h("Since {} ({} {})", when(i["start"]), ago(lasted), "so far" if i["end"] is None else "in all")
    )
    if i["end"] is not None:
        facts.append(h("Ended {}", when(i["end"])))
    facts.append(link(f"/runbooks#{i['kind']}", "Runbook"))
    figures = table(
        ("Figure", "Value"),
        ([label, value] for label, value in ex.figures),
        numeric=(1,),
        empty="The detector recorded no figures.",
    )
    lo = max(i["start"] - CHART_MARGIN, (i["end"] or now) - CHART_SPAN)
    hi = min((i["end"] or now) + CHART_MARGIN, now)
    if run is not None:
        series = queries.run_gpu_series(conn, run["run_id"], lo, hi)
        others = queries.incidents(conn, run_id=run["run_id"])
    elif i.get("node"):
        series = queries.node_gpu_series(conn, i["node"], lo, hi)
        others = [i]
    else:
        series, others = None, [i]
    spans = incident_spans([o for o in others if o["id"] == i["id"]], lo, hi)
    charts = (
        gpu_charts(series, lo, hi, spans)
        if series is not None and series.points
        else h('<p class="empty">No GPU samples around this incident.</p>')
    )
    related = [o for o in others if o["id"] != i["id"]]
    body = h(
        '<p class="cause" id="cause">{}</p><p class="facts">{}</p>'
        '<div class="cols2"><section><h2>What it costs</h2>{}</section>'
        "<section><h2>The numbers behind it</h2>{}{}</section></div>"
        '<section><h2>GPUs around it</h2><p class="hint">The shaded stretch is this incident.</p>{}</section>'
        "{}{}<section><h2>More</h2>{}</section>",
        ex.sentence,
        join(facts, Markup(' <span class="sep">&middot;</span> ')),
        _cost_block(i),
        figures,
        xid_lines(i.get("evidence") or {}),
        charts,
        h("<section><h2>Quarantine</h2>{}</section>", actions_list(i.get("actions")))
        if i.get("actions")
        else Markup(""),
        h(
            "<section><h2>Other incidents of this run</h2>{}</section>",
            incident_table(costed(conn, st, related), "None."),
        )
        if related
        else Markup(""),
        join(
            (
                raw_evidence(i.get("evidence")),
                h("<p>{} &middot; {}</p>", link("/incidents", "All open incidents"), link("/", "Fleet")),
            )
        ),
    )
    return body, i


@router.get("/incidents/{incident_id}")
async def incident_page(request: Request, incident_id: str) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    if not incident_id.isdigit() or len(incident_id) > 18:
        return html(
            page(
                "Incident not found",
                h("<p>{} is not an incident number.</p>", incident_id),
                who=who,
                allowed=capabilities(who),
            ),
            404,
        )
    got = await read(request, _incident_page, int(incident_id))
    if isinstance(got, Response):
        return got
    if got is None:
        return html(
            page(
                "Incident not found",
                h("<p>No incident #{} is recorded.</p>", incident_id),
                who=who,
                allowed=capabilities(who),
            ),
            404,
        )
    body, i = got
    return render(
        who,
        f"Incident #{i['id']}: {explain(i).title}",
        body,
        "/incidents",
        refresh_s=LIVE_REFRESH_S if i["state"] == "open" else None,
        request=request,
    )
