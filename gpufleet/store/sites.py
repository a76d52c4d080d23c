"""Sites and their dated settings, time-of-use prices, PUE and carbon series.

A site's PUE, energy price, GPU-hour price (per GPU model where given),
carbon region and constant carbon intensity are step series in
``site_settings`` (migration 0004): each value holds from its
``valid_from`` until the next change of the same setting.  Changes take
effect from a time, *now* unless told otherwise, so the accounting of the
past never moves unless a change is dated back on purpose; the values of a
new site hold from the beginning (``-infinity``).

* :func:`patch_site` (``site set``, ``PATCH``) changes only the settings
  given, from a time;
* :func:`put_site` (``PUT``) replaces the whole site from a time: every
  setting not given takes its default and later scheduled changes are
  dropped; it reports which settings it defaulted;
* :func:`set_series` loads many points of one setting (PUE per month,
  time-of-use prices), like carbon series.

Every value is checked against its bound (:mod:`gpufleet.accounting.bounds`)
on the way in, whoever writes it; :class:`SiteError` names the setting and
the bound.

Money never has a silent currency: a site with a price needs one (a site
without prices has none, :data:`NO_CURRENCY`, until it is given), and a
currency change is dated like the other settings: the amounts before it stay
in the old currency, those after it are in the new one (never converted), so
the prices in force must be given again in the new currency with it.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.accounting import bounds
from gpufleet.store.runs import NotFound
from gpufleet.timeparse import TimeParseError, parse_time

#: The dated settings, in the order the API and CLI show them.
SETTINGS = ("pue", "price_per_kwh", "gpu_hour_price", "carbon_region", "carbon_g_per_kwh")
SITE_COLUMNS = ("pue", "price_per_kwh", "gpu_hour_price", "currency", "carbon_region", "carbon_g_per_kwh")

#: What a setting is when a site is created (or replaced by PUT) without it (the currency: none).
SITE_DEFAULTS: dict[str, Any] = {
    "pue": 1.0,
    "price_per_kwh": 0.0,
    "gpu_hour_price": 0.0,
    "currency": None,
    "carbon_region": None,
    "carbon_g_per_kwh": None,
}

#: ``sites.currency`` of a site that has no prices and was given no currency (ISO 4217: "no currency").
NO_CURRENCY = "XXX"

#: The prices that are money in the site's currency.
PRICES = ("price_per_kwh", "gpu_hour_price")


class SiteError(ValueError):
    """A site write that is refused as given; ``field`` names what to change (``currency``, ``pue``, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


#: ``valid_from`` of the values a site starts with.
BEGINNING = "-infinity"

_IN_FORCE = """
SELECT DISTINCT ON (s.setting, s.gpu_model) s.setting, s.gpu_model, s.num, s.txt
FROM site_settings s WHERE s.site = %s AND s.valid_from <= %s
ORDER BY s.setting, s.gpu_model, s.valid_from DESC"""


@dataclass(frozen=True)
class SiteWrite:
    """What a write did: the site as now in force, whether it was created, what PUT defaulted."""

    site: dict[str, Any]
    created: bool
    valid_from: datetime | None
    defaulted: tuple[str, ...] = ()


_TEXT = {"carbon_region", "currency"}


def _point(setting: str, value: Any) -> tuple[float | None, str | None]:
    return (None, value) if setting in _TEXT else (None if value is None else float(value), None)


def check_value(setting: str, value: Any) -> None:
    """:class:`SiteError` when ``value`` is outside the bound of ``setting``."""
    if setting in _TEXT or value is None:
        return
    why = bounds.problem(setting, value)
    if why is not None:
        raise SiteError(setting, why)


def _check_all(changes: Mapping[str, Any], gpu_hour_prices: Mapping[str, float | None] | None) -> None:
    for setting, value in changes.items():
        check_value(setting, value)
    for model, price in (gpu_hour_prices or {}).items():
        if price is not None and (why := bounds.problem("gpu_hour_price", price)) is not None:
            raise SiteError("gpu_hour_prices", f"GPU-hour price of {model!r}: {why}")


def _upsert(
    conn: psycopg.Connection, site: str, setting: str, model: str, valid_from: datetime | str, value: Any
) -> None:
    num, txt = _point(setting, value)
    conn.execute(
        "INSERT INTO site_settings (site, setting, gpu_model, valid_from, num, txt) VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (site, setting, gpu_model, valid_from) DO UPDATE SET num = EXCLUDED.num, txt = EXCLUDED.txt, "
        "set_at = now()",
        (site, setting, model, valid_from, num, txt),
    )


def currency_at(conn: psycopg.Connection, site: str, at: datetime | str) -> str | None:
    """The site's currency in force at ``at`` (None: it has none)."""
    row = conn.execute(
        "SELECT coalesce((SELECT s.txt FROM site_settings s WHERE s.site = st.site AND s.setting = 'currency' "
        "AND s.valid_from <= %s ORDER BY s.valid_from DESC LIMIT 1), st.currency) FROM sites st WHERE st.site = %s",
        (at, site),
    ).fetchone()
    if row is None:
        raise NotFound(f"site {site!r} not found")
    return None if row[0] == NO_CURRENCY else row[0]


def get_site(conn: psycopg.Connection, site: str, at: datetime | None = None) -> dict[str, Any]:
    """The site's settings in force at ``at`` (default now), with its GPU-model prices."""
    at = at or datetime.now(UTC)
    currency = currency_at(conn, site, at)
    out: dict[str, Any] = {"site": site, **{k: SITE_DEFAULTS[k] for k in SETTINGS}, "currency": currency}
    models: dict[str, float] = {}
    for setting, model, num, txt in conn.execute(_IN_FORCE, (site, at)).fetchall():
        value = txt if setting in _TEXT else num
        if setting == "currency":
            continue
        if model:
            if value is not None:
                models[model] = value
        else:
            out[setting] = (
                value
                if value is not None or setting in ("carbon_region", "carbon_g_per_kwh")
                else SITE_DEFAULTS[setting]
            )
    out["gpu_hour_prices"] = dict(sorted(models.items()))
    out["as_of"] = at
    return {
        "site": out["site"],
        **{k: out[k] for k in SITE_COLUMNS},
        "gpu_hour_prices": out["gpu_hour_prices"],
        "as_of": at,
    }


def list_sites(conn: psycopg.Connection, at: datetime | None = None) -> list[dict[str, Any]]:
    return [get_site(conn, s, at) for (s,) in conn.execute("SELECT site FROM sites ORDER BY site").fetchall()]


def site_history(conn: psycopg.Connection, site: str) -> list[dict[str, Any]]:
    """Every dated value of the site, by setting and time: what was (or will be) in force from when."""
    get_site(conn, site)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT setting, nullif(gpu_model, '') AS gpu_model, CASE WHEN valid_from > '-infinity' THEN valid_from END "
            "AS valid_from, num, txt, set_at FROM site_settings s "
            "WHERE site = %s ORDER BY s.setting, s.gpu_model, s.valid_from",
            (site,),
        ).fetchall()
    return [
        {
            "setting": r["setting"],
            "gpu_model": r["gpu_model"],
            "valid_from": r["valid_from"],
            "value": r["txt"] if r["setting"] in _TEXT else r["num"],
            "set_at": r["set_at"],
        }
        for r in rows
    ]


def _ever_priced(conn: psycopg.Connection, site: str) -> bool:
    """Whether any price of the site, at any time, is other than zero."""
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM site_settings WHERE site = %s AND setting = ANY(%s) AND num > 0)",
        (site, list(PRICES)),
    ).fetchone() == (True,)


def _prices_at(conn: psycopg.Connection, site: str, at: datetime | str) -> dict[str, float]:
    """The non-zero prices of the site in force at ``at``: setting (or ``gpu_hour_prices:<model>``) -> value."""
    out: dict[str, float] = {}
    for setting, model, num, _ in conn.execute(_IN_FORCE, (site, at)).fetchall():
        if setting in PRICES and num:
            out[f"gpu_hour_prices:{model}" if model else setting] = num
    return out


def _set_currency(
    conn: psycopg.Connection,
    site: str,
    currency: str,
    when: datetime | str,
    changes: Mapping[str, Any],
    gpu_hour_prices: Mapping[str, float | None] | None,
) -> None:
    """A currency for the site from ``when``: the site's own when it never had a price (nothing is in another
    currency), else a dated change, with every price in force then given again in the new currency."""
    old = currency_at(conn, site, when)
    if old == currency:
        return
    if old is None and not _ever_priced(conn, site):
        conn.execute("UPDATE sites SET currency = %s WHERE site = %s", (currency, site))
        conn.execute("DELETE FROM site_settings WHERE site = %s AND setting = 'currency'", (site,))
        return
    restated = {k for k in changes if k in PRICES} | {f"gpu_hour_prices:{m}" for m in (gpu_hour_prices or {})}
    missing = sorted(set(_prices_at(conn, site, when)) - restated)
    if missing:
        flags = ", ".join(
            "--gpu-model-price " + m.split(":", 1)[1] + "=..."
            if m.startswith("gpu_hour_prices:")
            else "--" + m.replace("_", "-")
            for m in missing
        )
        raise SiteError(
            "currency",
            f"site {site!r} prices in {old}; from {_when_text(when)} its prices are in "
            f"{currency}, and amounts are never converted: give the prices in force then in "
            f"{currency} too ({flags}; in the API: {', '.join(missing)})",
        )
    _upsert(conn, site, "currency", "", when, currency)


def _when_text(when: datetime | str) -> str:
    return (
        "the beginning"
        if when == BEGINNING
        else when.isoformat()
        if isinstance(when, datetime)
        else str(when)
    )


def _require_currency(conn: psycopg.Connection, site: str, when: datetime | str, priced: bool) -> None:
    if priced and currency_at(conn, site, when) is None:
        raise SiteError(
            "currency",
            f"site {site!r} has prices but no currency: give --currency (ISO 4217, e.g. "
            'EUR; in the API: "currency"); amounts are never assumed to be in one',
        )


def _priced(values: Mapping[str, Any], gpu_hour_prices: Mapping[str, float | None] | None) -> bool:
    return any(values.get(p) for p in PRICES) or any(v for v in (gpu_hour_prices or {}).values())


def _create(conn: psycopg.Connection, site: str, currency: str | None) -> bool:
    created = (
        conn.execute(
            "INSERT INTO sites (site, currency) VALUES (%s, %s) ON CONFLICT (site) DO NOTHING RETURNING site",
            (site, currency or NO_CURRENCY),
        ).fetchone()
        is not None
    )
    if created:
        for setting in SETTINGS:
            _upsert(conn, site, setting, "", BEGINNING, SITE_DEFAULTS[setting])
    return created


def patch_site(
    conn: psycopg.Connection,
    site: str,
    changes: Mapping[str, Any],
    *,
    valid_from: datetime | None = None,
    gpu_hour_prices: Mapping[str, float | None] | None = None,
    create: bool = False,
    now: datetime | None = None,
) -> SiteWrite:
    """Change only the settings in ``changes`` (and the GPU-model prices given; None ends one), from
    ``valid_from`` (default now; a new site's values hold from the beginning).

    A site that does not exist is :class:`NotFound`, or with ``create`` is created with
    :data:`SITE_DEFAULTS` for the settings not given.
    """
    unknown = set(changes) - set(SITE_COLUMNS)
    if unknown:
        raise ValueError(f"not a site setting: {', '.join(sorted(unknown))}")
    _check_all(changes, gpu_hour_prices)
    now = now or datetime.now(UTC)
    with conn.transaction():
        created = False
        if create:
            created = _create(conn, site, changes.get("currency"))
        elif conn.execute("SELECT 1 FROM sites WHERE site = %s", (site,)).fetchone() is None:
            raise NotFound(f"site {site!r} not found; create it with PUT /v1/sites/{site}")
        when: datetime | str = BEGINNING if created and valid_from is None else (valid_from or now)
        if changes.get("currency") and not created:
            _set_currency(conn, site, changes["currency"], when, changes, gpu_hour_prices)
        _require_currency(conn, site, when, _priced(changes, gpu_hour_prices))
        for setting in SETTINGS:
            if setting in changes:
                _upsert(conn, site, setting, "", when, changes[setting])
        for model, price in (gpu_hour_prices or {}).items():
            _upsert(conn, site, "gpu_hour_price", model, when, price)
        return SiteWrite(get_site(conn, site, now), created, None if when == BEGINNING else when)  # type: ignore[arg-type]


def put_site(
    conn: psycopg.Connection,
    site: str,
    values: Mapping[str, Any],
    *,
    given: Iterable[str],
    valid_from: datetime | None = None,
    gpu_hour_prices: Mapping[str, float] | None = None,
    now: datetime | None = None,
) -> SiteWrite:
    """Replace the whole site from ``valid_from`` (default now; a new site: from the beginning).

    Every setting takes its value in ``values``, the ones not ``given`` their default; GPU-model prices
    not in ``gpu_hour_prices`` end; changes scheduled after ``valid_from`` are dropped.
    """
    now = now or datetime.now(UTC)
    given = set(given)
    defaulted = tuple(f for f in SETTINGS if f not in given)
    currency = values.get("currency") if "currency" in given else None
    replacing = {k: values.get(k, SITE_DEFAULTS[k]) for k in SETTINGS if k in given}
    _check_all(replacing, gpu_hour_prices)
    with conn.transaction():
        created = _create(conn, site, currency)
        when: datetime | str = BEGINNING if created and valid_from is None else (valid_from or now)
        if not created:
            if currency:
                _set_currency(
                    conn,
                    site,
                    currency,
                    when,
                    {**dict.fromkeys(PRICES), **replacing},
                    {**{m: None for m in _models(conn, site)}, **dict(gpu_hour_prices or {})},
                )
            if when != BEGINNING:
                conn.execute("DELETE FROM site_settings WHERE site = %s AND valid_from > %s", (site, when))
        _require_currency(conn, site, when, _priced(replacing, gpu_hour_prices))
        for setting in SETTINGS:
            _upsert(
                conn,
                site,
                setting,
                "",
                when,
                values.get(setting, SITE_DEFAULTS[setting]) if setting in given else SITE_DEFAULTS[setting],
            )
        prices = dict(gpu_hour_prices or {})
        models = _models(conn, site)
        for model in sorted(models | set(prices)):
            _upsert(conn, site, "gpu_hour_price", model, when, prices.get(model))
        return SiteWrite(
            get_site(conn, site, now),
            created,
            None if when == BEGINNING else when,  # type: ignore[arg-type]
            defaulted,
        )


def _models(conn: psycopg.Connection, site: str) -> set[str]:
    return {
        m
        for (m,) in conn.execute(
            "SELECT DISTINCT gpu_model FROM site_settings WHERE site = %s AND gpu_model <> ''", (site,)
        ).fetchall()
    }


def set_series(
    conn: psycopg.Connection, site: str, setting: str, points: list[tuple[datetime, Any]], gpu_model: str = ""
) -> int:
    """Upsert dated values of one setting (a PUE per month, time-of-use prices, ...)."""
    if setting not in SETTINGS:
        raise ValueError(f"not a site setting: {setting}")
    for i, (_, v) in enumerate(points):
        why = None if setting in _TEXT or v is None else bounds.problem(setting, v)
        if why is not None:
            raise SiteError(setting, f"points[{i}]: {why}")
    with conn.transaction():
        if conn.execute("SELECT 1 FROM sites WHERE site = %s", (site,)).fetchone() is None:
            raise NotFound(f"site {site!r} not found")
        if setting in PRICES:
            for t, v in points:
                _require_currency(conn, site, t, bool(v))
        for t, v in points:
            _upsert(conn, site, setting, gpu_model, t, v)
    return len(points)


def set_prices(conn: psycopg.Connection, site: str, points: list[tuple[datetime, float]]) -> int:
    """Time-of-use energy prices: points of the site's ``price_per_kwh`` series."""
    return set_series(conn, site, "price_per_kwh", points)


def set_carbon(
    conn: psycopg.Connection,
    region: str,
    points: list[tuple[datetime, float]],
    *,
    method: str | None = None,
    name: str | None = None,
    provider: str | None = None,
) -> int:
    """Upsert a carbon-intensity step series (each value holds until the next), and record what it is:
    ``method`` ``average`` (the default for a series first loaded without one) or ``marginal``, a readable
    ``name`` (country or grid region) and the ``provider`` it came from (what is not given is kept)."""
    for i, (_, g) in enumerate(points):
        why = bounds.problem("carbon_g_per_kwh", g)
        if why is not None:
            raise SiteError(
                "g_co2e_per_kwh", f"points[{i}]: {why.replace('carbon_g_per_kwh', 'g_co2e_per_kwh')}"
            )
    if method is not None and method not in ("average", "marginal"):
        raise SiteError("method", f"method must be average or marginal, not {method!r}")
    with conn.transaction():
        conn.execute(
            "INSERT INTO carbon_regions AS c (region, method, name, provider) VALUES (%s, coalesce(%s, 'average'), "
            "%s, %s) ON CONFLICT (region) DO UPDATE SET method = coalesce(%s, c.method), "
            "name = coalesce(%s, c.name), provider = coalesce(%s, c.provider), updated_at = now()",
            (region, method, name, provider, method, name, provider),
        )
        conn.execute(
            "INSERT INTO carbon_intensity (region, time, g_co2e_per_kwh) SELECT %s, t, g FROM "
            "unnest(%s::timestamptz[], %s::float8[]) AS u(t, g) ON CONFLICT (region, time) DO UPDATE "
            "SET g_co2e_per_kwh = EXCLUDED.g_co2e_per_kwh",
            (region, [p[0] for p in points], [p[1] for p in points]),
        )
    return len(points)


def carbon_region(conn: psycopg.Connection, region: str) -> dict[str, Any]:
    """What a region's series is, as recorded: ``method``, ``name``, ``provider`` (None when never recorded)."""
    row = conn.execute(
        "SELECT method, name, provider FROM carbon_regions WHERE region = %s", (region,)
    ).fetchone()
    return dict(zip(("method", "name", "provider"), row or (None, None, None), strict=True))


def get_carbon(
    conn: psycopg.Connection, region: str, since: datetime | None = None, until: datetime | None = None
) -> list[dict[str, Any]]:
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
    """A CSV file is malformed; the message names the file and every bad line and column."""


#: At most this many problems are listed; the message says how many more there were.
MAX_LISTED = 50


def parse_series_csv(
    path: Path, value_cols: tuple[str, ...], check: Callable[[float], str | None], region: str | None = None
) -> list[tuple[datetime, float]]:
    """Read ``time, <value>`` rows: every bad row (time, number, range, a time given twice) is
    reported in one :class:`CsvError`; nothing is returned unless every row parses.  An optional
    ``region`` column must match ``region`` when given (other regions' rows are skipped)."""
    text = path.read_text(encoding="utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        raise CsvError(f"{path}: empty file, expected a header 'time,{value_cols[0]}'")
    cols = [c.strip() for c in reader.fieldnames]
    value_col = next((c for c in value_cols if c in cols), None)
    if "time" not in cols or value_col is None:
        raise CsvError(f"{path}: line 1: header must have 'time' and '{value_cols[0]}' columns, has {cols}")
    out: list[tuple[datetime, float]] = []
    problems: list[str] = []
    seen: dict[datetime, int] = {}
    for lineno, row in enumerate(reader, start=2):
        row = {
            (k or "").strip(): (v or "").strip() for k, v in row.items() if isinstance(v, str) or v is None
        }
        if region is not None and row.get("region") and row["region"] != region:
            continue
        t: datetime | None = None
        try:
            t = _series_time(row.get("time", ""))
        except TimeParseError as e:
            problems.append(f"line {lineno}, column 'time': {e}")
        raw = row.get(value_col, "")
        try:
            v = float(raw)
        except ValueError:
            problems.append(f"line {lineno}, column '{value_col}': not a number: {raw!r}")
            continue
        bad = check(v)
        if bad:
            problems.append(f"line {lineno}, column '{value_col}': {bad}")
            continue
        if t is None:
            continue
        if t in seen:
            problems.append(
                f"line {lineno}, column 'time': {row['time']} is also on line {seen[t]} (one value per time)"
            )
            continue
        seen[t] = lineno
        out.append((t, v))
    if problems:
        listed = problems[:MAX_LISTED]
        more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise CsvError(
            f"{path}: {len(problems)} bad row{'s' if len(problems) != 1 else ''}, nothing loaded: "
            + "; ".join(listed)
            + more
        )
    if not out:
        raise CsvError(f"{path}: no data rows" + (f" for region {region!r}" if region else ""))
    return out


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _series_time(text: str) -> datetime:
    """RFC 3339 with an offset, epoch seconds, or a bare date read as 00:00 UTC (monthly PUE, daily prices)."""
    if _DATE.fullmatch(text.strip()):
        try:
            return datetime.fromisoformat(text.strip()).replace(tzinfo=UTC)
        except ValueError:
            raise TimeParseError(f"{text!r} is not a date") from None
    return parse_time(text)


def _carbon_check(g: float) -> str | None:
    return None if 0 <= g <= 5000 else f"{g} is outside 0..5000 g/kWh"


def _pue_check(p: float) -> str | None:
    return None if 1.0 <= p <= 5.0 else f"{p} is outside 1..5 (a PUE is at least 1)"


def parse_carbon_csv(path: Path, region: str | None = None) -> list[tuple[datetime, float]]:
    """``time, g_co2e_per_kwh`` rows (also ``carbon_intensity`` or ``g_per_kwh``)."""
    return parse_series_csv(path, ("g_co2e_per_kwh", "carbon_intensity", "g_per_kwh"), _carbon_check, region)


def parse_pue_csv(path: Path) -> list[tuple[datetime, float]]:
    """``time, pue`` rows: measured or monthly PUE, each value holding until the next."""
    return parse_series_csv(path, ("pue",), _pue_check)
