"""The finance export: one row per run overlapping a period, as CSV or JSON.

Each row is the run's accounting clipped to the period [since, until), so
consecutive periods add up to the whole run and no run is billed twice.
Columns: the contract's fields in the contract's order, then extras; times
are RFC 3339 UTC, numbers plain decimals (never exponent notation), unknown
values empty; text cells (team, name, ...) never start a spreadsheet formula.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

from gpufleet.accounting.lines import Source
from gpufleet.accounting.run import CONTRACT_FIELDS, account_runs, load_runs
from gpufleet.csvsafe import safe_text

#: Extra columns after the contract's, from the body (or its ``efficiency`` block).
CSV_EXTRAS: tuple[str, ...] = (
    "name", "site", "team", "state", "window_start", "window_end", "source", "carbon_source", "price_source",
    "tokens", "samples", "tokens_per_kwh", "mfu", "goodput",
)
CSV_COLUMNS: tuple[str, ...] = CONTRACT_FIELDS + CSV_EXTRAS


def runs_report(conn: psycopg.Connection, since: datetime, until: datetime, *, now: datetime | None = None,
                max_gap_s: float | None = None, source: Source = "auto") -> list[dict[str, Any]]:
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
    if isinstance(value, float):
        text = format(Decimal(repr(value)), "f")
        return text[:-2] if text.endswith(".0") else text
    return safe_text(str(value))


def _cell(body: Mapping[str, Any], column: str) -> str:
    if column in body:
        return plain(body[column])
    return plain((body.get("efficiency") or {}).get(column))


def report_csv(bodies: Iterable[Mapping[str, Any]]) -> str:
    """CSV text with a header row of :data:`CSV_COLUMNS`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for body in bodies:
        w.writerow([_cell(body, c) for c in CSV_COLUMNS])
    return buf.getvalue()
