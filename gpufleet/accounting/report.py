"""Finance exports: the per-run CSV of the contract, and the finance report with its totals.

``GET /v1/reports/runs.csv`` (contracts.md section 3): one row per run
overlapping a period, clipped to it, so consecutive periods add up to the whole
run and no run is billed twice.  Columns: the contract's fields in the
contract's order, then extras.

``GET /v1/reports/finance.csv`` / ``.json`` and ``gpufleet report``: the
report finance reconciles against (compare CodeCarbon's ``emissions.csv``,
which has one row per run and no totals): one row per run (or per site or
team with ``group_by``) and currency, then a row for the GPU time no run held
(``unallocated``), one for GPU time without telemetry (``no_telemetry``) and a
``total`` per currency; :data:`FINANCE_COLUMNS` documents every column.

Both are presentation, for a spreadsheet and a person: money is in the
currency's minor units, rounded by largest remainder
(:func:`gpufleet.accounting.money.allocate`) so that what a reader adds up
adds up: a run's energy and compute cost add up to its rounded total, and in
the finance report each currency's rows add up to its total row, column by
column, to the cent.  The accounting itself (the API's bodies, replay's
ACCOUNTING.json, ``GET /v1/accounting``) carries money as computed.

Writing: times RFC 3339 UTC, numbers plain decimals (never exponent notation),
money with every minor digit (``12.30``), lists as ``; ``-separated names,
unknown values empty (a running run's ``end`` too; its registered end is
``planned_end``); text cells (team, name, ...) never start a spreadsheet
formula (:mod:`gpufleet.csvsafe`).  A row whose money could not be computed
has empty money cells and says why in ``errors``.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg

from gpufleet.accounting.fleet import GROUP_BY, Block, GroupBy, run_block
from gpufleet.accounting.ledger import LedgerSum, from_body
from gpufleet.accounting.line_errors import messages, problems
from gpufleet.accounting.lines import ZERO, Source, lines, per_run
from gpufleet.accounting.money import allocate, as_decimal, money_text, number, rounded
from gpufleet.accounting.result import AccountingBody, group_value
from gpufleet.accounting.run import CONTRACT_FIELDS, account_runs, load_runs
from gpufleet.accounting.run import bodies as run_bodies
from gpufleet.accounting.snapshot import snapshot
from gpufleet.config import AccountingSettings
from gpufleet.csvsafe import safe_text
from gpufleet.timeparse import iso
from gpufleet.waste import STATES

#: Extra columns of runs.csv after the contract's, from the body (or its ``efficiency`` block).
CSV_EXTRAS: tuple[str, ...] = (
    "name",
    "site",
    "team",
    "state",
    "window_start",
    "window_end",
    "duration_s",
    "gpu_models",
    "gpu_equivalents",
    "carbon_regions",
    "g_co2e_per_kwh",
    "co2e_unknown_kwh",
    "lost_gpu_hours",
    "source",
    "carbon_source",
    "price_source",
    "tokens",
    "samples",
    "tokens_per_kwh",
    "mfu",
    "goodput",
    # CodeCarbon's emissions.csv has these too; then what a reader needs to trust the row
    "planned_end",
    "gpu_power_w",
    "it_power_w",
    "emissions_rate_kg_s",
    "carbon_method",
    "carbon_region_names",
    "mfu_problem",
    "errors",
)
CSV_COLUMNS: tuple[str, ...] = CONTRACT_FIELDS + CSV_EXTRAS
MONEY = ("energy_cost", "compute_cost", "total_cost")
#: Ratios written with six decimals (a share of 1e-6 is far below what any input is known to).
RATIOS = ("coverage", "pue", "g_co2e_per_kwh", "gpu_equivalents", "mfu", "goodput")

#: The finance report's columns and what each one means.
FINANCE_COLUMNS: dict[str, str] = {
    "row_type": "run, site or team (the rows of group_by); unallocated: GPU time no run held, with telemetry; "
    "no_telemetry: GPU time no run held and no sample covers; total: the fleet, per currency",
    "key": "run id, site or team of the row (empty for a run without a site or team); the row type otherwise; "
    "'all' on the total of the whole fleet (every currency, and GPU time at nodes without a site), "
    "which has energies and hours but no money",
    "name": "run name (run rows)",
    "team": "team (run rows; team rows: the team)",
    "site": "site the row is priced at (run rows: the run's site)",
    "state": "pending, running or ended at the time of the report, as GET /v1/runs says it (run rows)",
    "start": "run start, RFC 3339 UTC (run rows)",
    "end": "run end; empty while running (run rows)",
    "window_start": "start of the accounted window: the run's start clipped to the period",
    "window_end": "end of the accounted window: the run's end (or now) clipped to the period",
    "duration_s": "window_end - window_start, seconds",
    "runs": "runs in the row",
    "gpu_models": "GPU model(s) from node facts, '; '-separated (unknown: empty)",
    "gpu_count": "GPUs held (run rows)",
    "gpu_equivalents": "GPUs' worth held: the sum of declared shares (= gpu_count without sharing)",
    "gpu_hours": "GPU-hours: window duration x shares held (unallocated: hours with telemetry; no_telemetry: "
    "hours without)",
    "gpu_kwh": "GPU energy, kWh (counter differences, else integrated power)",
    "host_kwh": "host energy times the share of the node's GPUs the row held, kWh",
    "it_kwh": "gpu_kwh + host_kwh",
    "pue": "facility_kwh / it_kwh: the PUE in force, energy-weighted",
    "facility_kwh": "IT energy x the PUE in force at each time, kWh",
    "carbon_regions": "grid region(s) whose carbon intensity applied, '; '-separated",
    "g_co2e_per_kwh": "carbon intensity used, energy-weighted: co2e_kg x 1000 / facility kWh of known intensity",
    "co2e_kg": "facility energy x the carbon intensity in force, kg CO2e; empty when no intensity is known",
    "co2e_unknown_kwh": "facility energy with no known carbon intensity, kWh",
    "energy_cost": "facility energy x the energy price in force, in the row's currency",
    "compute_cost": "GPU-hours x the GPU-hour price in force (per GPU model where the site gives one)",
    "total_cost": "energy_cost + compute_cost",
    "currency": "ISO 4217 code of the row's money (a row never mixes currencies)",
    "coverage": "share (0-1) of the row's GPU-seconds inside counted sample intervals",
    "lost_gpu_hours": "GPU-hours the incidents lost: every state of the ledger but productive (= waste_gpu_hours)",
}
#: The ledger's columns (contracts.md section 3, ledger): GPU-hours and money per state, then the waste.
LEDGER_COLUMNS: dict[str, str] = {
    **{
        c: d
        for state in STATES
        for c, d in (
            (f"{state}_gpu_hours", f"GPU-hours the ledger puts in state {state} (run rows and their sums)"),
            (
                f"{state}_cost",
                f"total_cost of the {state} GPU-hours (their energy and compute) in the row's currency",
            ),
        )
    },
    "waste_gpu_hours": "GPU-hours in every state but productive: idle, hung, checkpoint, starved, straggler_wait, "
    "throttled",
    "waste_cost": "total_cost of the waste GPU-hours in the row's currency",
}
LEDGER_MONEY: tuple[str, ...] = tuple(c for c in LEDGER_COLUMNS if c.endswith("_cost"))
FINANCE_COLUMNS.update(LEDGER_COLUMNS)
#: Columns added after the ledger's: the CodeCarbon-parity figures and what a reader needs to trust a row.
FINANCE_COLUMNS.update(
    {
        "planned_end": "the end a running run was registered with (run rows; empty once it ended or without one)",
        "gpu_power_w": "average power of the run's GPUs together over its window, W (run rows)",
        "it_power_w": "average IT power of the run (GPUs and their host share), W (run rows)",
        "emissions_rate_kg_s": "co2e_kg / duration_s, kg CO2e per second (run rows; CodeCarbon's emissions_rate)",
        "carbon_method": "average or marginal carbon intensity (mixed: both) as recorded for the series used; a site's "
        "constant is an average factor",
        "carbon_region_names": "readable names of carbon_regions as recorded (country or grid region), '; '-separated",
        "errors": "what could not be computed in the row and why (its money cells are then empty)",
    }
)
FINANCE_COLUMN_NAMES: tuple[str, ...] = tuple(FINANCE_COLUMNS)


def runs_report(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
) -> list[AccountingBody]:
    """Accounting bodies of every run overlapping [since, until), clipped to it, by start then id."""
    runs = load_runs(conn, since=since, until=until)
    return account_runs(conn, runs, now=now, max_gap_s=max_gap_s, source=source, since=since, until=until)


def plain(value: Any) -> str:
    """A CSV cell: empty for unknown, plain decimal for numbers, text that
    could start a formula neutralised (:mod:`gpufleet.csvsafe`)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format(value.normalize() if value != value.to_integral() else value.quantize(Decimal(1)), "f")
    if isinstance(value, float):
        text = format(Decimal(repr(value)), "f")
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, Mapping):
        return safe_text("; ".join(f"{k}={plain(v)}" for k, v in value.items()))
    if isinstance(value, list | tuple):
        return safe_text(
            "; ".join(plain(v) if isinstance(v, Mapping) else str(v) for v in value if v is not None)
        )
    return safe_text(str(value))


def _run_extras(body: Mapping[str, Any]) -> dict[str, Any]:
    eff = body.get("efficiency") or {}
    start, end = body.get("window_start"), body.get("window_end")
    duration = (
        (
            datetime.fromisoformat(end.replace("Z", "+00:00"))
            - datetime.fromisoformat(start.replace("Z", "+00:00"))
        ).total_seconds()
        if start and end
        else None
    )
    series = body.get("carbon_series") or []
    return {
        "duration_s": duration,
        "gpu_models": sorted({m["model"] for m in body.get("gpu_models") or [] if m.get("model")}),
        "carbon_regions": sorted(
            {p["carbon_region"] for p in body.get("rates") or [] if p.get("carbon_region")}
        ),
        "carbon_region_names": sorted({c["name"] for c in series if c.get("name")}),
        "lost_gpu_hours": eff.get("lost_gpu_hours"),
        # a running run has no end yet (the one it was registered with is its planned_end)
        "end": body.get("end") if body.get("state") == "ended" else None,
    }


def _text(column: str, value: Any, minor_units: int) -> str:
    if value is None:
        return ""
    if column in MONEY or column in LEDGER_MONEY:
        return money_text(value, minor_units)
    if column in RATIOS and isinstance(value, float):
        return plain(rounded(value, 6))
    return plain(value)


def presented_money(body: Mapping[str, Any]) -> dict[str, Decimal | None]:
    """A run's money in minor units as a person reads it: energy and compute rounded by largest remainder
    so that they add up to the rounded total (None where the body has none)."""
    e, c = body.get("energy_cost"), body.get("compute_cost")
    if e is None or c is None:
        return {k: None if body.get(k) is None else as_decimal(body[k]) for k in MONEY}
    re, rc = allocate([as_decimal(e), as_decimal(c)], int(body.get("minor_units") or 2))
    return {"energy_cost": re, "compute_cost": rc, "total_cost": re + rc}


def _cell(body: Mapping[str, Any], column: str, extras: Mapping[str, Any], money: Mapping[str, Any]) -> str:
    if column in MONEY:
        return _text(column, money[column], int(body.get("minor_units") or 2))
    if column in RATIOS:
        if column in body:
            return _text(column, body[column], 2)
        return _text(column, (body.get("efficiency") or {}).get(column), 2)
    if column in extras:
        return plain(extras[column])
    if column in body:
        return plain(body[column])
    return plain((body.get("efficiency") or {}).get(column))


def report_csv(bodies: Iterable[Mapping[str, Any]]) -> str:
    """runs.csv text with a header row of :data:`CSV_COLUMNS`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for body in bodies:
        extras, money = _run_extras(body), presented_money(body)
        w.writerow([_cell(body, c, extras, money) for c in CSV_COLUMNS])
    return buf.getvalue()


# ---------------------------------------------------------------- the finance report


@dataclass
class _Group:
    block: Block = field(default_factory=Block)
    names: set[str] = field(default_factory=set)
    teams: set[str] = field(default_factory=set)
    sites: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    regions: set[str] = field(default_factory=set)
    gpu_count: int = 0
    gpu_equivalents: float = 0.0
    lost_gpu_hours: float = 0.0
    minor_units: int = 2
    body: Mapping[str, Any] | None = None  # a run row's own body
    #: the run row is the run's only line (a run across a currency change has one row per currency)
    whole: bool = True
    methods: set[str] = field(default_factory=set)
    names_of_regions: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


def _row(row_type: str, key: str | None, currency: str | None, g: _Group) -> dict[str, Any]:
    """A row with its money exact (:class:`~decimal.Decimal`; None where unknown); :func:`_present`
    rounds it for people."""
    b = g.block
    money = b.cost_of(currency) if currency else (ZERO, ZERO)
    e, c = money if money is not None else (None, None)
    known = b.facility_kwh - b.co2e_unknown_kwh
    body = g.body or {}
    extras = _run_extras(body)
    run_row = g.body is not None
    out: dict[str, Any] = {
        "row_type": row_type,
        "key": key,
        "name": body.get("name"),
        "team": body.get("team") if g.body else (key if row_type == "team" else None),
        "site": body.get("site") if g.body else (key if row_type == "site" else None),
        "state": body.get("state"),
        "start": body.get("start"),
        "end": extras["end"],
        "window_start": body.get("window_start"),
        "window_end": body.get("window_end"),
        "duration_s": extras["duration_s"] if g.body else None,
        "runs": b.runs,
        "gpu_models": sorted(g.models),
        "gpu_count": g.gpu_count if row_type != "total" else None,
        "gpu_equivalents": g.gpu_equivalents if g.body or row_type in ("site", "team") else None,
        "gpu_hours": number(b.gpu_hours),
        "gpu_kwh": number(b.gpu_kwh),
        "host_kwh": number(b.host_kwh),
        "it_kwh": number(b.it_kwh),
        "pue": rounded(float(b.facility_kwh / b.it_kwh), 6) if b.it_kwh > 0 else None,
        "facility_kwh": number(b.facility_kwh),
        "carbon_regions": sorted(g.regions),
        "g_co2e_per_kwh": rounded(float(b.co2e_kg * 1000 / known), 6) if known > 0 else None,
        "co2e_kg": number(b.co2e_kg)
        if known > 0 or row_type == "no_telemetry"
        else (None if b.facility_kwh > 0 else 0.0),
        "co2e_unknown_kwh": number(b.co2e_unknown_kwh),
        "energy_cost": e if currency else (ZERO if row_type != "total" else None),
        "compute_cost": c if currency else (ZERO if row_type != "total" else None),
        "total_cost": (None if e is None or c is None else e + c)
        if currency
        else (ZERO if row_type != "total" else None),
        "currency": currency,
        "coverage": min(b.covered_s / b.gpu_s, 1.0) if b.gpu_s > 0 else 0.0,
        "lost_gpu_hours": g.lost_gpu_hours,
    }
    out.update(_ledger_cells(row_type, currency, b.ledger))
    if g.body and g.whole:
        out["pue"] = body.get("pue")
        out["g_co2e_per_kwh"] = body.get("g_co2e_per_kwh")
        out["co2e_kg"] = body.get("co2e_kg")
    out.update(
        {
            "planned_end": body.get("planned_end"),
            "gpu_power_w": body.get("gpu_power_w") if run_row and g.whole else None,
            "it_power_w": body.get("it_power_w") if run_row and g.whole else None,
            "emissions_rate_kg_s": body.get("emissions_rate_kg_s") if run_row and g.whole else None,
            "carbon_method": (g.methods.copy().pop() if len(g.methods) == 1 else "mixed")
            if g.methods
            else None,
            "carbon_region_names": sorted(g.names_of_regions),
            "errors": list(dict.fromkeys(g.errors)),
        }
    )
    out["minor_units"] = g.minor_units
    return out


_MONEY_ROWS = ("run", "site", "team", "unallocated")


def _present(rows: list[dict[str, Any]]) -> None:
    """Money of the rows in minor units, for people: per currency, each money column of the rows above its
    total allocated by largest remainder so that the rows add up to the total row, and each row's
    total_cost the sum of its energy and compute cost as shown."""
    by_currency: dict[str, list[dict[str, Any]]] = defaultdict(list)
    totals: dict[str, dict[str, Any]] = {}
    for r in rows:
        cur = r["currency"]
        if cur is None:
            continue
        if r["row_type"] == "total":
            totals[cur] = r
        elif r["row_type"] in _MONEY_ROWS:
            by_currency[cur].append(r)
    for cur, members in by_currency.items():
        mu = members[0]["minor_units"]
        total = totals.get(cur)
        complete = all(r["energy_cost"] is not None and r["compute_cost"] is not None for r in members)
        for col in ("energy_cost", "compute_cost"):
            known = [r for r in members if r[col] is not None]
            for r, v in zip(known, allocate([r[col] for r in known], mu), strict=True):
                r[col] = v
            if total is not None:
                total[col] = sum((r[col] for r in members), ZERO) if complete else None
        for r in members:
            r["total_cost"] = (
                None
                if r["energy_cost"] is None or r["compute_cost"] is None
                else r["energy_cost"] + r["compute_cost"]
            )
        if total is not None:
            total["total_cost"] = None if not complete else total["energy_cost"] + total["compute_cost"]
    for r in rows:
        for col in MONEY:
            if isinstance(r[col], Decimal):
                r[col] = number(r[col])


def _ledger_cells(row_type: str, currency: str | None, led: LedgerSum | None) -> dict[str, Any]:
    """The ledger columns of a row: its runs' ledgers added up (none for GPU time no run held); money in the
    row's currency, none on the whole fleet's row (it mixes currencies)."""
    if led is None and row_type == "total":
        led = LedgerSum()
    if led is None:
        return dict.fromkeys(LEDGER_COLUMNS)
    priced = currency is not None or row_type != "total"

    def money(state: str | None) -> float | None:
        return number(led.cost(state, currency) if currency else ZERO) if priced else None

    out: dict[str, Any] = {}
    for state in STATES:
        out[f"{state}_gpu_hours"] = number(led.cells[state].gpu_hours)
        out[f"{state}_cost"] = money(state)
    out["waste_gpu_hours"] = number(led.waste().gpu_hours)
    out["waste_cost"] = money(None)
    return out


@dataclass(frozen=True)
class FinanceReport:
    since: datetime
    until: datetime
    window_end: datetime
    group_by: GroupBy
    rows: list[dict[str, Any]]

    def body(self) -> dict[str, Any]:
        return {
            "from": iso(self.since),
            "to": iso(self.until),
            "window_end": iso(self.window_end),
            "group_by": self.group_by,
            "columns": FINANCE_COLUMNS,
            "rows": [{k: v for k, v in r.items() if k != "minor_units"} for r in self.rows],
        }


def finance_report(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    group_by: GroupBy = "run",
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
    gone_after_s: float | None = None,
) -> FinanceReport:
    """The rows of the period [since, until): per run (or site or team) and currency, then unallocated,
    no telemetry, and the total per currency; money in minor units (:func:`_present`)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {group_by!r}")
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    gone = AccountingSettings().gone_after_s if gone_after_s is None else gone_after_s
    with snapshot(conn):
        rows = lines(conn, since, until, now, fleet=True, max_gap_s=gap, source=source, gone_after_s=gone)
        parts = per_run(rows)
        runs = load_runs(conn, sorted(parts))
        bodies = run_bodies(
            conn, runs, parts, now=now, max_gap_s=gap, source=source, since=since, until=until
        )
        idle_errors = {
            id(ln): messages(conn, ln.site, problems([ln]), "GPU time no run held")
            for ln in rows
            if ln.line == "unallocated"
        }
    groups: dict[tuple[str | None, str | None], _Group] = defaultdict(_Group)
    totals: dict[str | None, _Group] = defaultdict(_Group)
    for body in bodies:
        mine = parts[body["run_id"]]
        extras = _run_extras(body)
        for ln in mine:
            g = groups[(group_value(body, group_by), ln.currency)]
            blk = run_block([ln], body if len(mine) == 1 else None)
            g.block.merge(blk)
            g.models.update(extras["gpu_models"])
            g.regions.update(extras["carbon_regions"])
            g.names_of_regions.update(extras["carbon_region_names"])
            if body.get("carbon_method"):
                g.methods.add(str(body["carbon_method"]))
            g.gpu_count += body["gpu_count"]
            g.gpu_equivalents += body["gpu_equivalents"]
            g.lost_gpu_hours += extras["lost_gpu_hours"] or 0.0
            g.minor_units = ln.minor_units
            if group_by == "run":
                g.body, g.whole = body, len(mine) == 1
            line_errors = [e for e in body["errors"] if "not computed" in e] if blk.broken else []
            g.errors += line_errors
            t = totals[ln.currency]
            t.block.add_cost(ln.currency, ln.energy_cost, ln.compute_cost or ZERO)
            t.block.broken |= blk.broken
            t.errors += line_errors
            if "ledger" in body and len(mine) == 1:
                if t.block.ledger is None:
                    t.block.ledger = LedgerSum()
                t.block.ledger.add(from_body(body["ledger"]), ln.currency)
            t.block.runs += 1 if ln is mine[0] else 0
            t.lost_gpu_hours += extras["lost_gpu_hours"] or 0.0
            t.models.update(extras["gpu_models"])
            t.regions.update(extras["carbon_regions"])
            t.names_of_regions.update(extras["carbon_region_names"])
    idle: dict[str | None, _Group] = defaultdict(_Group)
    dark = _Group()
    for ln in rows:
        if ln.line == "unallocated":
            gpu_s = ln.gpu_s or 0.0
            covered = min(ln.covered_s, gpu_s)
            u = idle[ln.currency]
            u.block.add_time(ln.covered_hours or ZERO, covered, covered)
            u.block.add_energy(ln)
            u.block.add_cost(ln.currency, ln.energy_cost, ZERO)
            u.minor_units = ln.minor_units
            totals[ln.currency].block.add_cost(ln.currency, ln.energy_cost, ZERO)
            if idle_errors[id(ln)] and ln.currency is not None:
                u.block.broken.add(ln.currency)
                totals[ln.currency].block.broken.add(ln.currency)
                u.errors += idle_errors[id(ln)]
                totals[ln.currency].errors += idle_errors[id(ln)]
            dark.block.add_time((ln.gpu_hours or ZERO) - (ln.covered_hours or ZERO), gpu_s - covered, 0.0)
        elif ln.line == "total":
            t = totals[ln.currency]
            t.block.add_time(ln.gpu_hours or ZERO, ln.gpu_s or 0.0, ln.covered_s)
            t.block.add_energy(ln)
            t.minor_units = ln.minor_units
    out: list[dict[str, Any]] = []
    for (k, cur), g in sorted(
        groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or "", kv[0][1] or "")
    ):
        out.append(_row(group_by, k, cur, g))
    for cur, g in sorted(idle.items(), key=lambda kv: kv[0] or ""):
        out.append(_row("unallocated", "unallocated", cur, g))
    out.append(_row("no_telemetry", "no_telemetry", None, dark))
    priced = {cur: g for cur, g in totals.items() if cur is not None}
    for cur, g in sorted(priced.items()):
        out.append(_row("total", "total", cur, g))
    if len(totals) != 1 or not priced:
        # more than one currency, or GPU time priced nowhere (nodes without a site): the whole fleet
        every = _Group()
        for g in totals.values():
            every.block.merge(g.block)
            every.models |= g.models
            every.regions |= g.regions
            every.lost_gpu_hours += g.lost_gpu_hours
            every.names_of_regions |= g.names_of_regions
        every.block.costs = {}
        out.append(_row("total", "all", None, every))
    _present(out)
    return FinanceReport(since, until, max(since, min(until, now)), group_by, out)


def finance_csv(report: FinanceReport) -> str:
    """The finance report as CSV: a header of :data:`FINANCE_COLUMN_NAMES`, then its rows."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FINANCE_COLUMN_NAMES)
    for r in report.rows:
        w.writerow([_text(c, r[c], r["minor_units"]) for c in FINANCE_COLUMN_NAMES])
    return buf.getvalue()
