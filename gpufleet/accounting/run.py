"""Per-run accounting: the body of ``GET /v1/runs/{run_id}/accounting`` (contracts.md section 3).

The API, the CLI report, the web view and ``gpufleet replay`` all call
:func:`run_accounting` (or :func:`account_runs` for many runs); the figures
come from the database's ``gpufleet_accounting`` (:mod:`gpufleet.accounting.lines`; a closed
window's lines kept between readers, :mod:`gpufleet.accounting.run_lines`), this module adds the
run's facts, the values in force and its efficiency.

The window is the run's [start, end); a run still running (no end, or an end
in the future) is accounted up to ``now``.  ``since``/``until`` clip the
window further (reports for a period); ``gpu_hours``, energy and cost then
cover only the clipped part, while ``start``/``end`` stay the run's own.
With declared sharing a GPU counts with its share: ``gpu_hours`` is the
window times the shares held (``gpu_equivalents``), ``gpu_count`` the GPUs.

Money is the accounting's own figure (to 1e-9 of the currency), not rounded
to minor units: that is for presentation.  A run whose window crosses a
change of its site's currency has its money per currency in
``costs_by_currency`` and no single ``currency`` (its money fields are null).
A figure the stored settings make meaningless (a price above its bound, kept
from before the bounds existed) is null, and ``errors`` says which and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.accounting.efficiency import Window, efficiency, node_facts, progress_many
from gpufleet.accounting.ledger import Ledger, ledger_body, losses
from gpufleet.accounting.line_errors import NULLED, messages, problems
from gpufleet.accounting.lines import Line, Source, combine, lines
from gpufleet.accounting.money import number, quantized, rounded
from gpufleet.accounting.result import AccountingBody, LedgerSummary
from gpufleet.accounting.run_lines import run_lines
from gpufleet.accounting.snapshot import snapshot
from gpufleet.config import AccountingSettings
from gpufleet.db.accounting_sql import GPU_NAMES_EXPR, gpu_model_of_names
from gpufleet.facts import NodeFacts
from gpufleet.store.run_model import Run, load_runs
from gpufleet.store.runs import NotFound
from gpufleet.timeparse import iso

#: The contract's fields, in the contract's order (also the CSV's first columns).
CONTRACT_FIELDS: tuple[str, ...] = (
    "run_id",
    "start",
    "end",
    "gpu_count",
    "gpu_hours",
    "gpu_kwh",
    "host_kwh",
    "it_kwh",
    "pue",
    "facility_kwh",
    "co2e_kg",
    "energy_cost",
    "compute_cost",
    "total_cost",
    "currency",
    "coverage",
)

#: The GPU models of each run's allocations (its nodes' facts at its start), each node's facts read once.
_MODELS_SQL = f"""
WITH a AS MATERIALIZED (
  SELECT a.run_id, a.node, a.gpu, a.sharing, a.share, r.start AS at
  FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.run_id = ANY(%s)
), nd AS MATERIALIZED (
  SELECT d.node, d.at, nd.facts, {GPU_NAMES_EXPR} AS names
  FROM (SELECT DISTINCT node, at FROM a) d CROSS JOIN LATERAL (SELECT gpufleet_node_facts_at(d.node, d.at) AS facts) nd
)
SELECT a.run_id, a.sharing, {gpu_model_of_names("nd.names", "a.gpu")} AS model,
       count(*) AS gpus, sum(a.share) AS shares
FROM a JOIN nd ON nd.node = a.node AND nd.at = a.at
GROUP BY 1, 2, 3 ORDER BY 1, 3 NULLS LAST, 2"""

#: The settings in force at each (site, lo, hi), period by period (``x.i``: the ask's position).
_RATES_SQL = """
SELECT x.i, p.t0, p.t1, p.pue, p.price_per_kwh, p.gpu_hour_price, p.carbon_region, p.carbon_g_per_kwh, p.currency
FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[]) WITH ORDINALITY x(site, lo, hi, i)
CROSS JOIN LATERAL gpufleet_site_periods(x.site, x.lo, x.hi) WITH ORDINALITY p
ORDER BY x.i, p.ordinality"""

_REGIONS_SQL = "SELECT region, method, name FROM carbon_regions"

#: The GPU-hour prices of each (site, model, lo, hi) with a price of its model.
_MODEL_PRICES_SQL = """
SELECT x.i, p.t0, p.t1, p.gpu_model_key, p.price
FROM unnest(%s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[]) WITH ORDINALITY x(site, model, lo, hi, i)
CROSS JOIN LATERAL gpufleet_gpu_hour_prices(x.site, x.model, x.lo, x.hi) WITH ORDINALITY p
WHERE p.gpu_model_key <> '' ORDER BY x.i, p.ordinality"""


def used_source(source: Source, stale: bool) -> str:
    if source == "raw":
        return "raw"
    return "mixed" if stale and source == "auto" else "rollup"


Rates = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _clip(periods: Sequence[tuple[Any, ...]], lo: datetime, hi: datetime) -> list[tuple[Any, ...]]:
    """The periods of [lo, hi) from those of a span holding it: settings' periods are cut only where a
    setting changes (``gpufleet_site_periods``, ``gpufleet_gpu_hour_prices``), so a window's periods
    are the span's cut to the window."""
    return [(max(t0, lo), min(t1, hi), *rest) for t0, t1, *rest in periods if t1 > lo and t0 < hi]


def _spans(
    conn: psycopg.Connection, sql: str, asks: Sequence[tuple[tuple[str, ...], datetime, datetime]]
) -> dict[tuple[str, ...], list[tuple[Any, ...]]]:
    """The rows of ``sql`` per key over the span of all its asks (key, lo, hi): one call per key."""
    span: dict[tuple[str, ...], tuple[datetime, datetime]] = {}
    for k, lo, hi in asks:
        a, b = span.get(k, (lo, hi))
        span[k] = (min(a, lo), max(b, hi))
    keys = list(span)
    cols = [[k[i] for k in keys] for i in range(len(keys[0]))] if keys else []
    out: dict[tuple[str, ...], list[tuple[Any, ...]]] = {k: [] for k in keys}
    if keys:
        for i, *row in conn.execute(sql, [*cols, [span[k][0] for k in keys], [span[k][1] for k in keys]]):
            out[keys[i - 1]].append(tuple(row))
    return out


def _rates(
    conn: psycopg.Connection, asks: Sequence[tuple[str | None, datetime, datetime, list[dict[str, Any]]]]
) -> list[Rates]:
    """For each (site, lo, hi, GPU models) the site's settings in force during [lo, hi), period by
    period, and its GPU-model prices: read once per site and model over the span of every window."""
    sited = [
        (i, site, lo, hi if hi > lo else lo + timedelta(microseconds=1), models)
        for i, (site, lo, hi, models) in enumerate(asks)
        if site is not None
    ]
    out: list[Rates] = [([], []) for _ in asks]
    shown: dict[datetime, str] = {}  # runs share their periods' edges: each written once

    def fmt(t: datetime) -> str:
        got = shown.get(t)
        if got is None:
            got = shown[t] = iso(t)
        return got

    periods = _spans(conn, _RATES_SQL, [((site,), lo, end) for _, site, lo, end, _ in sited])
    prices = _spans(
        conn,
        _MODEL_PRICES_SQL,
        [((site, m["model"]), lo, end) for _, site, lo, end, models in sited for m in models],
    )
    for i, site, lo, end, models in sited:
        out[i][0].extend(
            {
                "from": fmt(t0),
                "to": fmt(t1),
                "pue": pue,
                "price_per_kwh": price,
                "gpu_hour_price": ghp,
                "carbon_region": region,
                "carbon_g_per_kwh": constant,
                "currency": currency,
            }
            for t0, t1, pue, price, ghp, region, constant, currency in _clip(periods[(site,)], lo, end)
        )
        by_model = out[i][1]
        for m in models:
            for t0, t1, key, price in _clip(prices[(site, m["model"])], lo, end):
                entry = {"gpu_model": key, "from": fmt(t0), "to": fmt(t1), "gpu_hour_price": price}
                if entry not in by_model:
                    by_model.append(entry)
    return out


def carbon_regions(conn: psycopg.Connection) -> dict[str, tuple[str, str | None]]:
    """region -> (method, name) of every carbon region with a record (one row per region: read once per answer)."""
    return {r: (m, n) for r, m, n in conn.execute(_REGIONS_SQL).fetchall()}


def carbon_method(
    rates: Sequence[Mapping[str, Any]], regions: Mapping[str, tuple[str, str | None]], carbon_source: str
) -> str | None:
    """``average``, ``marginal`` or ``mixed`` over the intensities the window used; null when unknown.

    A series' method is what was recorded when it was loaded or fetched (``carbon_regions``); a site's
    constant is an average emission factor, as inventories publish them.
    """
    methods: set[str | None] = set()
    if carbon_source in ("series", "mixed"):
        methods |= {regions.get(p["carbon_region"], (None, None))[0] for p in rates if p.get("carbon_region")}
    if carbon_source in ("site_constant", "mixed"):
        methods.add("average")
    methods.discard(None)
    if not methods:
        return None
    return methods.pop() if len(methods) == 1 else "mixed"


def _per_s(value: float | None, seconds: float, scale: float, places: int) -> float | None:
    """``value`` × ``scale`` per second of ``seconds``, to ``places`` decimals (a mean power in W to the
    mW, an emissions rate in kg/s to the µg/s: far below what the inputs are known to)."""
    return rounded(value * scale / seconds, places) if value is not None and seconds > 0 else None


def _body(
    conn: psycopg.Connection,
    run: Run,
    line: Line,
    now: datetime,
    max_gap_s: float,
    source: Source,
    since: datetime | None,
    until: datetime | None,
    models: list[dict[str, Any]],
    rated: Rates,
    segments: list[Line] | None,
    lost: dict[str, Any],
    ledger: Ledger | None,
    found: Mapping[str, str],
    regions: Mapping[str, tuple[str, str | None]],
    done: Mapping[str, float | None],
    facts: Mapping[str, NodeFacts],
) -> AccountingBody:
    lo, hi = run.window(now, since, until)
    gpu_hours = number(line.gpu_hours) or 0.0
    nulled = _nulled(line, found)
    compute = None if "compute_cost" in nulled else line.compute_cost
    carbon_known = _carbon_known(line, nulled)
    rates, model_prices = rated
    hours = line.gpu_hours or Decimal(0)
    effective_price = (
        number(quantized(compute / hours, 6))
        if compute is not None and hours > 0
        else None
        if "compute_cost" in nulled
        else (rates[0]["gpu_hour_price"] if rates else 0.0)
    )
    fac = float(line.facility_kwh)
    known = line.facility_kwh - line.co2e_unknown_kwh
    duration_s = max((hi - lo).total_seconds(), 0.0)
    co2e = number(line.co2e_kg) if carbon_known else None
    body: AccountingBody = {
        "run_id": run.run_id,
        "start": iso(run.start),
        "end": iso(run.end),
        "gpu_count": line.gpu_count or len(run.allocations),
        "gpu_hours": gpu_hours,
        "gpu_kwh": number(line.gpu_kwh),
        "host_kwh": number(line.host_kwh),
        "it_kwh": number(line.it_kwh),
        "pue": number(line.pue) if line.pue is not None else 1.0,
        "facility_kwh": fac,
        "co2e_kg": co2e,
        "energy_cost": None if "energy_cost" in nulled else number(line.energy_cost),
        "compute_cost": None if "compute_cost" in nulled else (number(compute) or 0.0),
        "total_cost": None if "total_cost" in nulled else number(line.total_cost),
        "currency": line.currency,
        "coverage": line.coverage,
        # extras
        "name": run.name,
        "site": run.site,
        "team": run.team,
        "state": run.state_at(now),
        "planned_end": iso(run.end) if run.end is not None and run.end > now else None,
        "window_start": iso(lo),
        "window_end": iso(hi),
        "duration_s": duration_s,
        "source": used_source(source, line.stale),
        "max_gap_s": max_gap_s,
        "carbon_source": line.carbon_source or "none",
        "carbon_method": carbon_method(rates, regions, line.carbon_source or "none")
        if carbon_known
        else None,
        "carbon_series": [
            {"region": r, "method": regions.get(r, (None, None))[0], "name": regions.get(r, (None, None))[1]}
            for r in sorted({p["carbon_region"] for p in rates if p.get("carbon_region")})
        ],
        "price_source": line.price_source or "none",
        "gpu_hour_price": effective_price,
        "gpu_equivalents": line.gpu_equivalents if line.gpu_equivalents is not None else 0.0,
        "gpu_models": [
            {"model": m["model"], "gpus": m["gpus"], "sharing": m["sharing"], "shares": m["shares"]}
            for m in models
        ],
        "co2e_unknown_kwh": number(line.co2e_unknown_kwh),
        "g_co2e_per_kwh": (
            number(quantized(line.co2e_kg * 1000 / known, 6)) if carbon_known and known > 0 else None
        ),
        "gpu_power_w": _per_s(number(line.gpu_kwh), duration_s, 3.6e6, 3),
        "it_power_w": _per_s(number(line.it_kwh), duration_s, 3.6e6, 3),
        "emissions_rate_kg_s": _per_s(co2e, duration_s, 1.0, 9),
        "minor_units": line.minor_units,
        "costs_by_currency": {
            cur: {
                "energy_cost": None if "energy_cost" in found else number(e),
                "compute_cost": None if "compute_cost" in found else number(c),
                "total_cost": None if found.keys() & {"energy_cost", "compute_cost"} else number(e + c),
            }
            for cur, (e, c) in sorted(line.by_currency().items())
        },
        "rates": rates,
        "gpu_model_prices": model_prices,
        "efficiency": efficiency(
            conn,
            run,
            lo,
            hi,
            run.allocations,
            float(line.it_kwh),
            count_after_end=_after_end(run, now, until),
            gpu_hours=gpu_hours,
            productive_gpu_hours=None if ledger is None else number(ledger["productive"].gpu_hours) or 0.0,
            done=done,
            facts=facts,
        ),
        "lost_to_incidents": _lost(lost, line, nulled),
        "errors": _errors(conn, run, line, found),
    }
    if ledger is not None:
        body["ledger"] = _ledger_json(ledger, carbon_known, nulled)
    if segments is not None:
        body["segments"] = [
            {
                "start": iso(s.start),
                "end": iso(s.end),
                "gpu_kwh": number(s.gpu_kwh),
                "host_kwh": number(s.host_kwh),
                "facility_kwh": number(s.facility_kwh),
                "g_co2e_per_kwh": s.g_co2e_per_kwh,
                "price_per_kwh": s.price_per_kwh if s.price_per_kwh is not None else 0.0,
                "co2e_kg": None if s.g_co2e_per_kwh is None or "co2e_kg" in nulled else number(s.co2e_kg),
                "energy_cost": None if "energy_cost" in found else number(s.energy_cost),
                "currency": s.currency,
            }
            for s in segments
        ]
    return body


def _nulled(line: Line, found: Mapping[str, str]) -> set[str]:
    """The body's fields that ``found`` (the line's problems) and a mix of currencies leave null."""
    return {f for k in found for f in NULLED[k]} | (
        {"energy_cost", "compute_cost", "total_cost"} if line.mixed else set()
    )


def _carbon_known(line: Line, nulled: set[str]) -> bool:
    return line.carbon_source not in (None, "none") and "co2e_kg" not in nulled


def _errors(conn: psycopg.Connection, run: Run, line: Line, found: Mapping[str, str]) -> list[str]:
    """The body's ``errors``: one sentence per problem of the run's lines, and a mix of currencies."""
    out = messages(conn, run.site, dict(found), f"run {run.run_id!r}")
    if line.mixed:
        out.append(
            f"run {run.run_id!r}: its window crosses a change of site {run.site!r}'s currency "
            f"({', '.join(line.currencies)}): energy_cost, compute_cost and total_cost are per "
            "currency in costs_by_currency"
        )
    return out


def _ledger_json(ledger: Ledger, carbon_known: bool, nulled: set[str]) -> dict[str, dict[str, float | None]]:
    """The body's ``ledger``: without money where the run's own money is unknown."""
    out = ledger_body(ledger, carbon_known)
    if nulled & {"energy_cost", "compute_cost"}:
        for cell in out.values():
            cell["total_cost"] = None
    return out


def _lost(lost: dict[str, Any], line: Line, nulled: set[str]) -> dict[str, Any]:
    """The run's ``lost_to_incidents``, in its currency, without the money its errors leave unknown."""
    out = (
        {**lost, "currency": line.currency, "minor_units": line.minor_units}
        if lost.get("currency") is None
        else dict(lost)
    )
    for f in ("energy_cost", "compute_cost", "total_cost"):
        if f in nulled:
            out[f] = None
    return out


def account_runs(
    conn: psycopg.Connection,
    runs: Iterable[Run],
    *,
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
    since: datetime | None = None,
    until: datetime | None = None,
    segments: bool = False,
    ledger: bool = True,
) -> list[AccountingBody]:
    """Accounting bodies of ``runs``, all in one consistent snapshot (``ledger``: with each run's ledger)."""
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    runs = list(runs)
    if not runs:
        return []
    ids = [r.run_id for r in runs]
    with snapshot(conn):
        parts = run_lines(conn, runs, since, until, now, max_gap_s=gap, source=source)
        segs: dict[str, list[Line]] | None = None
        if segments:
            segs = {}
            for ln in lines(
                conn, since, until, now, run_ids=ids, max_gap_s=gap, source=source, detail="segment"
            ):
                if ln.line == "run" and ln.run_id is not None and ln.start is not None and ln.end is not None:
                    segs.setdefault(ln.run_id, []).append(ln)
        return bodies(
            conn,
            runs,
            parts,
            now=now,
            max_gap_s=gap,
            source=source,
            since=since,
            until=until,
            segments=segs,
            ledger=ledger,
        )


def bodies(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    parts: Mapping[str, Sequence[Line]],
    *,
    now: datetime,
    max_gap_s: float,
    source: Source,
    since: datetime | None,
    until: datetime | None,
    segments: Mapping[str, list[Line]] | None = None,
    ledger: bool = True,
) -> list[AccountingBody]:
    """Bodies of ``runs`` from their accounting lines (:func:`~gpufleet.accounting.lines.per_run`: one per
    currency; in the caller's snapshot), with (``ledger``) each run's ledger and the goodput it gives."""
    by_run: dict[str | None, Line] = {r.run_id: combine(parts[r.run_id]) for r in runs}
    models: dict[str, list[dict[str, Any]]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for m in cur.execute(_MODELS_SQL, ([r.run_id for r in runs],)).fetchall():
            models.setdefault(m.pop("run_id"), []).append(m)
    regions = carbon_regions(conn)
    done = progress_many(
        conn, [Window(r, *r.window(now, since, until), _after_end(r, now, until)) for r in runs]
    )
    facts = node_facts(conn, (n for r in runs for n, _ in r.allocations))
    lost, ledgers = _losses(conn, runs, by_run, now, since, until, max_gap_s, source, ledger)
    rated = _rates(
        conn,
        [
            (r.site, *r.window(now, since, until), [m for m in models.get(r.run_id, []) if m["model"]])
            for r in runs
        ],
    )
    out = []
    for r, rates in zip(runs, rated, strict=True):
        segs = None if segments is None else sorted(segments.get(r.run_id, []), key=_start)
        out.append(
            _body(
                conn,
                r,
                by_run[r.run_id],
                now,
                max_gap_s,
                source,
                since,
                until,
                models.get(r.run_id, []),
                rates,
                segs,
                lost[r.run_id],
                ledgers.get(r.run_id),
                problems(list(parts[r.run_id])),
                regions,
                done[r.run_id],
                facts,
            )
        )
    return out


def ledger_summaries(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    parts: Mapping[str, Sequence[Line]],
    *,
    now: datetime,
    max_gap_s: float,
    source: Source,
    since: datetime | None,
    until: datetime | None,
) -> list[LedgerSummary]:
    """What the fleet's views read of each run's body (its ledger, currency, team, site, errors), the same
    values as :func:`bodies` gives, without the rest of the body: over a month of a large fleet the
    facts, rates, progress and efficiency of every run cost more than the ledgers they are summed with."""
    by_run: dict[str | None, Line] = {r.run_id: combine(parts[r.run_id]) for r in runs}
    _, ledgers = _losses(conn, runs, by_run, now, since, until, max_gap_s, source, True)
    out: list[LedgerSummary] = []
    for r in runs:
        line = by_run[r.run_id]
        found = problems(list(parts[r.run_id]))
        nulled = _nulled(line, found)
        out.append(
            {
                "run_id": r.run_id,
                "name": r.name,
                "site": r.site,
                "team": r.team,
                "currency": line.currency,
                "ledger": _ledger_json(ledgers[r.run_id], _carbon_known(line, nulled), nulled),
                "errors": _errors(conn, r, line, found),
            }
        )
    return out


def _losses(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    by_run: Mapping[str | None, Line],
    now: datetime,
    since: datetime | None,
    until: datetime | None,
    max_gap_s: float,
    source: Source,
    with_ledger: bool,
) -> tuple[dict[str, dict[str, Any]], dict[str, Ledger]]:
    """Each run's ``lost_to_incidents`` and ledger over its window clipped to [since, until)."""
    windows = {r.run_id: r.window(now, since, until) for r in runs}
    return losses(
        conn, runs, windows, by_run, now=now, max_gap_s=max_gap_s, source=source, with_ledger=with_ledger
    )


def _after_end(run: Run, now: datetime, until: datetime | None) -> bool:
    """Whether the run's progress report after its end counts (an ended run's final report, no period end)."""
    return run.end is not None and run.end <= now and until is None


def _start(ln: Line) -> datetime:
    assert ln.start is not None
    return ln.start


def run_accounting(
    conn: psycopg.Connection,
    run_id: str,
    *,
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
    since: datetime | None = None,
    until: datetime | None = None,
    segments: bool = False,
) -> AccountingBody:
    """The accounting of one run, exactly the body of ``GET /v1/runs/{run_id}/accounting``.

    ``now``: the clock (replay passes its simulated one); ``max_gap_s``:
    longest interval power integration bridges (default: the settings'
    default, 60 s); ``source``: ``auto`` (rollups where current, raw
    elsewhere), ``rollup`` or ``raw``.  Raises ``NotFound`` for an unknown run.
    """
    runs = load_runs(conn, [run_id])
    if not runs:
        raise NotFound(f"run {run_id!r} not found")
    return account_runs(
        conn, runs, now=now, max_gap_s=max_gap_s, source=source, since=since, until=until, segments=segments
    )[0]
