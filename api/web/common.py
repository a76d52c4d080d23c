"""What every page handler shares: reading the database off the event loop, rendering a page, links.

Kept apart from the pages themselves so that the fleet, run, node and
incident pages can link to each other without importing each other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from psycopg_pool import PoolTimeout

from gpufleet.api.deps import ApiState, state
from gpufleet.api.web.html import Markup, badge, h, page
from gpufleet.api.web.session import capabilities, html
from gpufleet.auth import Principal
from gpufleet.store.run_model import state_at

T = TypeVar("T")
log = logging.getLogger(__name__)

#: How often pages that follow the fleet live (fleet, incidents, an open incident) reload, seconds.
LIVE_REFRESH_S = 30


async def read(request: Request, fn: Callable[..., T], *args: Any) -> T | Response:
    """``fn(conn, state, *args)`` in the thread pool; a page saying what went wrong when the database fails."""
    st: ApiState = state(request)

    def work() -> T:
        with st.pool.connection() as conn:
            return fn(conn, st, *args)

    try:
        return await run_in_threadpool(work)
    except psycopg.errors.QueryCanceled:
        # the statement limit, not a database that does not answer: say which, and what to ask instead
        limit = st.settings.api.statement_timeout_s
        return html(
            page(
                "Took too long",
                h(
                    "<p>Reading this page took longer than the {}-second statement limit "
                    "(<code>api.statement_timeout_s</code>) and was cancelled. Ask for a shorter period, "
                    "or retry in a moment.</p>",
                    f"{limit:g}",
                ),
            ),
            503,
        )
    except (psycopg.OperationalError, PoolTimeout):
        return html(
            page("Database unavailable", h("<p>The database does not answer; retry in a moment.</p>")), 503
        )
    except psycopg.DataError:
        # A value PostgreSQL cannot hold (a NUL in text, a time out of range) is the request's fault.
        return html(page("Bad request", h("<p>The address holds a value that cannot be looked up.</p>")), 400)


def notice_of(request: Request) -> str | None:
    """A line the process running the API wants every page to show (the demo while it back-fills)."""
    value = getattr(request.app.state, "web_notice", None)
    return value if isinstance(value, str) and value else None


def render(
    who: Principal,
    title: str,
    body: Markup,
    active: str,
    refresh_s: int | None = None,
    request: Request | None = None,
) -> Response:
    notice = notice_of(request) if request is not None else None
    if notice:
        body = Markup(h('<p class="notice" role="status" id="web-notice">{}</p>', notice) + body)
    return html(page(title, body, who=who, active=active, refresh_s=refresh_s, allowed=capabilities(who)))


def q(value: str) -> str:
    """A path segment."""
    return quote(value, safe="")


def run_href(run_id: str) -> str:
    return f"/runs/{q(run_id)}"


def node_href(node: str) -> str:
    return f"/nodes/{q(node)}"


def incident_href(incident_id: int) -> str:
    return f"/incidents/{int(incident_id)}"


def run_state(run: dict[str, Any], now: datetime) -> Markup:
    st = state_at(run["start"], run["end"], now)
    return badge(st, "ok" if st == "running" else "muted")


def severity_badge(sev: str) -> Markup:
    return badge(sev, "critical" if sev == "critical" else "warning")


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
