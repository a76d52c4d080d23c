"""The node page: what an SRE checks first on a slow GPU node, as its agent last reported it.

The agent runs the node checks (``gpufleet diagnose``) at each facts refresh
and sends them as facts (:class:`gpufleet.facts.NodeFacts`): each check's
status, finding, number and decision; the job cgroups feeding the GPUs with
their CPU quota and throttling; where the processes on each GPU may run
against the GPU's NUMA node; the NFS mounts' RPC figures.  The page shows
them with the job cgroup figures of the newest samples (the ``job_*``
columns) and the node's incidents.  Facts are read through ``NodeFacts``, so a
node whose stored facts do not fit shows what does, never an error page.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpufleet.api.deps import ApiState
from gpufleet.api.web.charts import gpu_charts, incident_spans
from gpufleet.api.web.common import LIVE_REFRESH_S, costed, read, render, run_href
from gpufleet.api.web.html import Markup, ago, badge, h, join, link, num, page, table, when, when_short
from gpufleet.api.web.incident_pages import incident_table
from gpufleet.api.web.node_health import fabric_section, quarantine_section
from gpufleet.api.web.session import capabilities, gate, html
from gpufleet.facts import NodeFacts
from gpufleet.store import views as queries

router = APIRouter(include_in_schema=False)

#: Check status -> badge style.
STATUS_BADGE = {"fail": "critical", "warn": "warning", "ok": "ok", "unknown": "muted", "skipped": "muted"}
#: The newest sample of a GPU counts as current within this of the node's newest.
FRESH = timedelta(minutes=2)

#: Checks worst first (``skipped``: an item that cannot run on this node, with the reason).
CHECK_ORDER = ("fail", "warn", "unknown", "ok", "skipped")
#: GPUs probed when the node reports no GPU count.
DEFAULT_GPUS = 16
#: The node's charts: the last hour up to its newest sample.
CHART_WINDOW = timedelta(hours=1)


def node_href(node: str) -> str:
    return "/nodes/" + quote(node, safe="")


def _status(s: str | None) -> Markup:
    return badge(s or "unknown", STATUS_BADGE.get(s or "unknown", "muted"))


def _value(v: Any, unit: str | None) -> Markup:
    if v is None:
        return Markup("&mdash;")
    if isinstance(v, float):
        return num(v, 2 if abs(v) < 100 else 0, unit or "")
    return h("{} {}", v, unit or "") if unit else h("{}", v)


def _node_page(conn: psycopg.Connection, st: ApiState, name: str) -> Markup | None:
    row = queries.node(conn, name)
    if row is None:
        return None
    facts = NodeFacts.read(row["facts"])
    n = min(max(int(row["gpu_count"] or facts.gpu_count or DEFAULT_GPUS), 1), 1024)
    jobs_now = queries.newest_job_samples(conn, name, n)
    if jobs_now:
        newest = max(r["time"] for r in jobs_now)
        jobs_now = [r for r in jobs_now if r["time"] >= newest - FRESH]
    summary = table(
        ("Node", "Site", "GPUs", "GPU model", "Driver", "CPUs", "Governor", "Last batch", "Checks"),
        [
            [
                row["node"],
                row["site"] or "",
                facts.gpu_count or row["gpu_count"] or "",
                facts.gpu_model_of(0) or "",
                facts.driver_version or "",
                facts.cpu_count or "",
                facts.cpu_governor if isinstance(facts.cpu_governor, str) else "",
                h("{} ago", ago(row["silent_s"])) if row["silent_s"] is not None else Markup("&mdash;"),
                _status(facts.checks_status) if facts.checks else Markup("&mdash;"),
            ]
        ],
    )
    checks = table(
        ("Status", "Check", "Subject", "Value", "Finding", "Decision"),
        (
            [
                _status(c.status),
                c.check.replace("_", " "),
                c.subject or "",
                _value(c.value, c.unit),
                c.finding or "",
                c.decision or "",
            ]
            for c in sorted(facts.checks or [], key=lambda c: CHECK_ORDER.index(c.status))
        ),
        empty="The agent has not reported node checks (an older agent, or node_checks off).",
    )
    asof = (
        h('<p class="asof">As the agent last reported them: {}.</p>', when(row["facts_time"]))
        if facts.checks
        else Markup("")
    )
    jobs = table(
        (
            "Cgroup",
            "Version",
            "GPUs",
            "Processes",
            "CPU quota",
            "Limit",
            "CPU used",
            "Throttled",
            "CPU pressure",
            "I/O pressure",
        ),
        (
            [
                j.cgroup or "",
                j.cgroup_version or "",
                ",".join(str(g) for g in j.gpus or []),
                j.pids or 0,
                num(j.cpu_quota_cores, 1, "cores"),
                j.quota_kind or "none",
                num(j.cpu_cores, 2, "cores"),
                num(None if j.cpu_throttled_share is None else 100 * j.cpu_throttled_share, 0, "%"),
                num(j.cpu_pressure_pct, 1, "%"),
                num(j.io_pressure_pct, 1, "%"),
            ]
            for j in facts.job_cgroups or []
        ),
        numeric=(4, 6, 7, 8, 9),
        empty="No job cgroup reported (no process on the GPUs).",
    )
    now = table(
        ("GPU", "Run", "Sample", "CPU used", "CPU quota", "Throttled", "CPU pressure", "I/O pressure"),
        (
            [
                r["gpu"],
                r["run_id"] or "",
                when(r["time"]),
                num(r["job_cpu_cores"], 2, "cores"),
                num(r["job_cpu_quota_cores"], 1, "cores"),
                num(
                    None if r["job_cpu_throttled_share"] is None else 100 * r["job_cpu_throttled_share"],
                    0,
                    "%",
                ),
                num(r["job_cpu_pressure_pct"], 1, "%"),
                num(r["job_io_pressure_pct"], 1, "%"),
            ]
            for r in jobs_now
            if r["job_cpu_cores"] is not None or r["job_cpu_quota_cores"] is not None
        ),
        numeric=(3, 4, 5, 6, 7),
        empty="No GPU sample carries job cgroup figures.",
    )
    numa = table(
        ("GPU", "Processes", "GPU NUMA node", "CPUs allowed", "Their NUMA nodes"),
        (
            [
                p.gpu,
                p.pids or 0,
                "" if p.gpu_numa_node is None else p.gpu_numa_node,
                p.cpus_allowed or "",
                ",".join(str(n) for n in p.numa_nodes or []),
            ]
            for p in facts.gpu_processes or []
        ),
        empty="No process placement reported.",
    )
    nfs = table(
        ("Mount", "Device", "Over", "RPCs", "Retrans", "Timeouts", "Backlog wait", "Round trip", "Request"),
        (
            [
                m.mountpoint,
                m.device or "",
                "since mount" if m.since_mount else num(m.interval_s, 0, "s"),
                m.ops if m.ops is not None else "",
                m.retrans if m.retrans is not None else "",
                m.timeouts if m.timeouts is not None else "",
                num(m.queue_ms, 2, "ms"),
                num(m.rtt_ms, 2, "ms"),
                num(m.execute_ms, 1, "ms"),
            ]
            for m in facts.nfs_mounts or []
        ),
        numeric=(3, 4, 5, 6, 7, 8),
        empty="No NFS mount reported.",
    )
    incident_rows = costed(conn, st, queries.node_incidents(conn, name))
    incidents = incident_table(incident_rows, "No incidents on this node or on the runs it holds.")
    runs = table(
        ("Run", "Name", "Team", "GPUs here", "Start", "End"),
        (
            [
                link(run_href(r["run_id"]), r["run_id"]),
                r["name"] or "",
                r["team"] or "",
                ",".join(str(g) for g in r["gpus"] or []),
                when_short(r["start"]),
                when_short(r["end"]),
            ]
            for r in queries.node_runs(conn, name)
        ),
        empty="No run has held GPUs of this node.",
    )
    hi = min(datetime.now(UTC), row["last_seen"] or datetime.now(UTC))
    lo = hi - CHART_WINDOW
    series = queries.node_gpu_series(conn, name, lo, hi)
    charts = join(
        (
            h(
                '<p class="window">The last hour to the newest sample ({} to {}). Shaded: incidents on this '
                "node or its runs (each links to its page).</p>",
                when(lo),
                when(hi),
            ),
            gpu_charts(series, lo, hi, incident_spans(incident_rows, lo, hi))
            if series.points
            else h('<p class="empty">No GPU samples in the last hour.</p>'),
        )
    )
    fabric = fabric_section(conn, name, lo, hi, incident_spans(incident_rows, lo, hi))
    return h(
        "<section>{}</section><section><h2>Runs</h2>{}</section><section><h2>Incidents</h2>{}</section>"
        "<section><h2>GPUs</h2>{}</section><section><h2>Checks</h2>{}{}</section>"
        "<section><h2>Quarantine</h2>{}</section><section><h2>Fabric</h2>{}</section>"
        "<section><h2>Job cgroups</h2>{}<h3>Newest samples</h3>{}</section>"
        "<section><h2>NUMA placement</h2>{}</section><section><h2>NFS</h2>{}</section>",
        summary,
        runs,
        incidents,
        charts,
        asof,
        checks,
        quarantine_section(conn, name),
        fabric,
        jobs,
        now,
        numa,
        nfs,
    )


@router.get("/nodes/{node}")
async def node_page(request: Request, node: str) -> Response:
    who = await gate(request, "read")
    if isinstance(who, Response):
        return who
    body = await read(request, _node_page, node)
    if isinstance(body, Response):
        return body
    if body is None:
        return html(
            page(
                "Node not found",
                h("<p>No node {} has reported.</p>", node),
                who=who,
                allowed=capabilities(who),
            ),
            404,
        )
    return render(who, f"Node {node}", body, "/", refresh_s=LIVE_REFRESH_S, request=request)
