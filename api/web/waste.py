"""The Waste page: the runs and teams whose GPUs were held and did not work, today, this week or this month.

An SRE looks here for the jobs to talk to; finance for what the waste cost.  The figures are the runs'
ledgers (:mod:`gpufleet.accounting.ledger`, the API's ``ledger`` and ``/v1/accounting``'s ``waste``):
every GPU-hour in one state by the one rule of :mod:`gpufleet.waste`, the waste being every state but
``productive``.  Runs and teams are ranked by wasted GPU-hours, the one measure that compares across
sites and currencies; each row says what its waste cost in its own currencies.  Periods are calendar
periods in UTC up to now (today from 00:00, the week from Monday, the month from the 1st).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal
from urllib.parse import quote

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import Response

from gpufleet.accounting.fleet import fleet_blocks
from gpufleet.accounting.ledger import LedgerSum, from_body
from gpufleet.api.deps import ApiState
from gpufleet.api.web.html import Markup, esc, h, join, link, num, page, table
from gpufleet.api.web.pages import _read
from gpufleet.api.web.session import capabilities, gate, html
from gpufleet.auth import Principal
from gpufleet.waste import PRECEDENCE

router = APIRouter(include_in_schema=False)

Period = Literal["day", "week", "month"]
PERIODS: dict[Period, str] = {"day": "Today", "week": "This week", "month": "This month"}
#: Runs listed, most wasteful first.
TOP_RUNS = 50
STATE_LABELS = {
    "idle": "Idle",
    "hung": "Hung",
    "checkpoint": "Checkpoint",
    "starved": "Starved",
    "straggler_wait": "Straggler wait",
    "throttled": "Throttled",
}


def period_start(period: Period, now: datetime) -> datetime:
    """Start of the calendar period (UTC) that holds ``now``."""
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


@dataclass
class Waste:
    """One ranked row: a run or a team with its runs' ledgers added up."""

    key: str | None
    ledger: LedgerSum
    team: str | None = None
    site: str | None = None
    names: set[str] = field(default_factory=set)

    @property
    def gpu_hours(self) -> Decimal:
        return sum((c.gpu_hours for c in self.ledger.cells.values()), Decimal(0))

    @property
    def waste_hours(self) -> Decimal:
        return self.ledger.waste().gpu_hours

    def costs(self) -> dict[str, Decimal]:
        """Waste cost per currency (runs without a site have none)."""
        out = {}
        for cur in sorted(self.ledger.costs):
            got = self.ledger.cost(None, cur)
            if got is not None:
                out[cur] = got
        return out


@dataclass
class Ranking:
    since: datetime
    until: datetime
    runs: list[Waste]
    teams: list[Waste]
    fleet: Waste


def _ranked(rows: list[Waste]) -> list[Waste]:
    return sorted(
        (r for r in rows if r.waste_hours > 0), key=lambda r: (-r.waste_hours, r.key is None, r.key or "")
    )


def ranking(
    conn: psycopg.Connection, since: datetime, until: datetime, now: datetime, max_gap_s: float
) -> Ranking:
    """The runs and teams of [since, until) ranked by wasted GPU-hours, from one fleet accounting."""
    f = fleet_blocks(conn, since, until, group_by="team", now=now, max_gap_s=max_gap_s)
    runs: list[Waste] = []
    teams: dict[str | None, Waste] = {}
    fleet = Waste("fleet", LedgerSum())
    for run in f.summaries:
        led = LedgerSum()
        led.add(from_body(run["ledger"]), run["currency"])
        runs.append(
            Waste(run["run_id"], led, run["team"], run["site"], {run["name"]} if run["name"] else set())
        )
        teams.setdefault(run["team"], Waste(run["team"], LedgerSum(), run["team"])).ledger.merge(led)
        fleet.ledger.merge(led)
    return Ranking(since, until, _ranked(runs), _ranked(list(teams.values())), fleet)


def _money(costs: Mapping[str, Decimal]) -> Markup:
    if not costs:
        return Markup("&mdash;")
    return join((num(float(v), 2, cur) for cur, v in costs.items()), Markup("; "))


def _share(w: Waste) -> Markup:
    total = w.gpu_hours
    return num(float(100 * w.waste_hours / total) if total > 0 else None, 1, "%")


def _states(w: Waste) -> list[object]:
    return [num(float(w.ledger.cells[s].gpu_hours), 2) for s in PRECEDENCE]


STATE_HEADERS = tuple(f"{STATE_LABELS[s]} GPU-h" for s in PRECEDENCE)


def run_href(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def _body(conn: psycopg.Connection, st: ApiState, period: Period, can_read: bool) -> Markup:
    now = datetime.now(UTC)
    r = ranking(conn, period_start(period, now), now, now, st.settings.accounting.max_gap_s)
    tabs = join(
        h(
            '<a href="/waste?period={}"{}>{}</a>',
            p,
            Markup(' aria-current="page"') if p == period else Markup(""),
            label,
        )
        for p, label in PERIODS.items()
    )
    cards = join(
        h('<div class="card"><div class="value">{}</div><div class="label">{}</div></div>', v, label)
        for v, label in (
            (num(float(r.fleet.waste_hours), 1, "h"), "GPU-hours wasted"),
            (_share(r.fleet), "of the runs' GPU-hours"),
            (_money(r.fleet.costs()), "what the waste cost"),
        )
    )
    runs = table(
        ("Run", "Name", "Team", "Site", "GPU-hours", "Wasted GPU-h", "Waste", *STATE_HEADERS, "Waste cost"),
        (
            [
                link(run_href(w.key), w.key) if can_read and w.key else esc(w.key or ""),
                ", ".join(sorted(w.names)),
                w.team or "",
                w.site or "",
                num(float(w.gpu_hours), 2),
                num(float(w.waste_hours), 2),
                _share(w),
                *_states(w),
                _money(w.costs()),
            ]
            for w in r.runs[:TOP_RUNS]
        ),
        numeric=range(4, 8 + len(PRECEDENCE)),
        empty="No run wasted GPU time in this period.",
    )
    teams = table(
        ("Team", "Runs", "GPU-hours", "Wasted GPU-h", "Waste", *STATE_HEADERS, "Waste cost"),
        (
            [
                w.key if w.key is not None else h("<em>{}</em>", "no team"),
                w.ledger.runs,
                num(float(w.gpu_hours), 2),
                num(float(w.waste_hours), 2),
                _share(w),
                *_states(w),
                _money(w.costs()),
            ]
            for w in r.teams
        ),
        numeric=range(1, 6 + len(PRECEDENCE)),
        empty="No team wasted GPU time in this period.",
    )
    more = (
        h(" The {} most wasteful of {} runs are listed.", TOP_RUNS, len(r.runs))
        if len(r.runs) > TOP_RUNS
        else Markup("")
    )
    return h(
        '<nav class="tabs" aria-label="Period">{}</nav>'
        '<p class="hint">{} to {} UTC.{}</p>'
        '<section class="cards">{}</section>'
        "<section><h2>Runs that wasted most</h2>{}</section>"
        "<section><h2>Teams that wasted most</h2>{}</section>"
        '<p class="hint">Waste is every GPU-hour a run held that its ledger puts in a state other than productive: '
        "idle (GPUs held doing nothing), hung (a collective that stopped), checkpoint, starved, straggler wait "
        "and throttled, each second in one state only, the most specific first. Ranked by wasted GPU-hours; "
        "costs in each run's currency, at its site's prices. The same figures as each run's "
        "<code>GET /v1/runs/{{id}}/accounting</code> <code>ledger</code> and <code>GET /v1/accounting</code>.</p>",
        tabs,
        r.since.strftime("%Y-%m-%d %H:%M"),
        r.until.strftime("%Y-%m-%d %H:%M"),
        more,
        cards,
        runs,
        teams,
    )


def _render(who: Principal, body: Markup, status: int = 200) -> Response:
    return html(page("Waste", body, who=who, active="/waste", allowed=capabilities(who)), status)


@router.get("/waste")
async def waste_page(request: Request, period: str = "week") -> Response:
    who = await gate(request, "read_accounting")
    if isinstance(who, Response):
        return who
    if period not in PERIODS:
        return _render(
            who,
            h(
                '<p class="error" role="alert">Period must be one of {}.</p>'
                '<p><a href="/waste">This week</a></p>',
                ", ".join(PERIODS),
            ),
            422,
        )
    body = await _read(request, _body, period, "read" in capabilities(who))
    if isinstance(body, Response):
        return body
    return _render(who, body)
