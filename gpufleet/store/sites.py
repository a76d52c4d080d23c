"""Sites (PUE, prices, carbon region), time-of-use prices and carbon series."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.store.runs import NotFound
from gpufleet.timeparse import TimeParseError, parse_time

SITE_COLUMNS = ("pue", "price_per_kwh", "gpu_hour_price", "currency", "carbon_region", "carbon_g_per_kwh")


#: What a column is when a site is created (or replaced by PUT) without it.
SITE_DEFAULTS: dict[str, Any] = {"pue": 1.0, "price_per_kwh": 0.0, "gpu_hour_price": 0.0, "currency": "USD",
                                 "carbon_region": None, "carbon_g_per_kwh": None}


def upsert_site(conn: psycopg.Connection, site: str, values: dict[str, Any]) -> dict[str, Any]:
    """Create or replace the whole site: a column missing from ``values`` is NULL / its default
    (PUT semantics; :func:`patch_site` changes only the columns given)."""
    cols = ", ".join(SITE_COLUMNS)
    conn.execute(
        f"INSERT INTO sites (site, {cols}) VALUES (%s, {', '.join(['%s'] * len(SITE_COLUMNS))}) "
        f"ON CONFLICT (site) DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in SITE_COLUMNS),
        (site, *(values.get(c) for c in SITE_COLUMNS)),
    )
    return get_site(conn, site)


def patch_site(conn: psycopg.Connection, site: str, changes: dict[str, Any], *,
               create: bool = False) -> tuple[dict[str, Any], bool]:
    """Change only the columns in ``changes``; the others keep their values.

    A site that does not exist is :class:`NotFound`, or with ``create`` is created with
    :data:`SITE_DEFAULTS` for the columns not given.  Returns (site, created).
    """
    unknown = set(changes) - set(SITE_COLUMNS)
    if unknown:
        raise ValueError(f"not a site setting: {', '.join(sorted(unknown))}")
    with conn.transaction():
        created = False
        if create:
            created = conn.execute(
                "INSERT INTO sites (site) VALUES (%s) ON CONFLICT (site) DO NOTHING RETURNING site", (site,)
            ).fetchone() is not None
        if changes:
            cur = conn.execute(
                "UPDATE sites SET " + ", ".join(f"{c} = %s" for c in changes) + " WHERE site = %s RETURNING site",
                (*changes.values(), site),
            )
            if cur.fetchone() is None:
                raise NotFound(f"site {site!r} not found; create it with PUT /v1/sites/{site}")
        return get_site(conn, site), created


def get_site(conn: psycopg.Connection, site: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(f"SELECT site, {', '.join(SITE_COLUMNS)} FROM sites WHERE site = %s", (site,)).fetchone()
    if row is None:
        raise NotFound(f"site {site!r} not found")
    return row


def list_sites(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT site, {', '.join(SITE_COLUMNS)} FROM sites ORDER BY site").fetchall()


def set_prices(conn: psycopg.Connection, site: str, points: list[tuple[datetime, float]]) -> int:
    get_site(conn, site)
    with conn.transaction():
        conn.execute(
            "INSERT INTO site_prices (site, time, price_per_kwh) SELECT %s, t, p FROM unnest(%s::timestamptz[], "
            "%s::float8[]) AS u(t, p) ON CONFLICT (site, time) DO UPDATE SET price_per_kwh = EXCLUDED.price_per_kwh",
            (site, [p[0] for p in points], [p[1] for p in points]),
        )
    return len(points)


def set_carbon(conn: psycopg.Connection, region: str, points: list[tuple[datetime, float]]) -> int:
    """Upsert a carbon-intensity step series (each value holds until the next)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) SELECT %s, t, g FROM "
            "unnest(%s::timestamptz[], %s::float8[]) AS u(t, g) ON CONFLICT (region, time) DO UPDATE "
            "SET g_co2e_per_kwh = EXCLUDED.g_co2e_per_kwh",
            (region, [p[0] for p in points], [p[1] for p in points]),
        )
    return len(points)


def get_carbon(conn: psycopg.Connection, region: str, since: datetime | None = None,
               until: datetime | None = None) -> list[dict[str, Any]]:
    sql = "SELECT time, g_co2e_per_kwh FROM carbon_intensity WHERE region = %s"
    params: list[Any] = [region]
    if since:
        sql += " AND time >= %s"
        params.append(since)
    if until:
        sql += " AND time < %s"
        params.append(until)
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql + " ORDER BY time", params).fetchall()


class CsvError(ValueError):
    """A CSV file is malformed; the message names the file, line and column."""


def parse_carbon_csv(path: Path, region: str | None = None) -> list[tuple[datetime, float]]:
    """Read ``time, g_co2e_per_kwh`` rows (an optional ``region`` column must
    match ``region`` when given).  Nothing is returned unless every row parses."""
    text = path.read_text(encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        raise CsvError(f"{path}: empty file, expected a header 'time,g_co2e_per_kwh'")
    cols = [c.strip() for c in reader.fieldnames]
    value_col = next((c for c in ("g_co2e_per_kwh", "carbon_intensity", "g_per_kwh") if c in cols), None)
    if "time" not in cols or value_col is None:
        raise CsvError(f"{path}: line 1: header must have 'time' and 'g_co2e_per_kwh' columns, has {cols}")
    out: list[tuple[datetime, float]] = []
    for lineno, row in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in row.items()}
        if region is not None and row.get("region") and row["region"] != region:
            continue
        try:
            t = parse_time(row["time"])
        except TimeParseError as e:
            raise CsvError(f"{path}: line {lineno}, column 'time': {e}") from None
        try:
            g = float(row[value_col])
        except ValueError:
            raise CsvError(f"{path}: line {lineno}, column '{value_col}': not a number: {row[value_col]!r}") from None
        if not (0 <= g <= 5000):
            raise CsvError(f"{path}: line {lineno}, column '{value_col}': {g} is outside 0..5000 g/kWh")
        out.append((t, g))
    if not out:
        raise CsvError(f"{path}: no data rows" + (f" for region {region!r}" if region else ""))
    return out
