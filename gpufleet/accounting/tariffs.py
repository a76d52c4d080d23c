"""What a kWh costs and emits at a site, over time.

A site has a PUE, a currency, a GPU-hour price, an energy price (flat, or a
time-of-use step series in ``site_prices``) and a carbon intensity (the
region's step series in ``carbon_intensity``, else the site's constant
``carbon_g_per_kwh``).  Each step value holds until the next step.

Before the first point of a series:
- price: the site's flat ``price_per_kwh`` applies (it is the base tariff);
- carbon: the site's constant ``carbon_g_per_kwh`` when set, else the first
  point of the series is carried back (the earliest known value; reporting
  zero emissions for the hours before a series was loaded would understate).

A run without a site is accounted at PUE 1, price 0 and GPU-hour price 0, with
currency and carbon intensity unknown (``None``): no energy is made to look
free of emissions by default.  The same holds for a site with neither a carbon
series nor a constant.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import psycopg

CarbonSource = Literal["series", "site_constant", "none"]
PriceSource = Literal["time_of_use", "flat", "none"]


@dataclass(frozen=True)
class StepSeries:
    """A step function: ``values[i]`` holds from ``times[i]`` until ``times[i + 1]``.

    ``before`` applies before the first point (``None``: unknown).
    """

    times: tuple[datetime, ...] = ()
    values: tuple[float, ...] = ()
    before: float | None = None

    def at(self, t: datetime) -> float | None:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[i] if i >= 0 else self.before

    def steps_inside(self, lo: datetime, hi: datetime) -> list[datetime]:
        """Step times strictly inside (lo, hi)."""
        return [t for t in self.times if lo < t < hi]


@dataclass(frozen=True)
class Tariff:
    """Everything accounting needs to know about one site (or about no site)."""

    site: str | None
    pue: float = 1.0
    currency: str | None = None
    gpu_hour_price: float = 0.0
    price_per_kwh: StepSeries = field(default_factory=lambda: StepSeries(before=0.0))
    carbon_g_per_kwh: StepSeries = field(default_factory=StepSeries)
    price_source: PriceSource = "none"
    carbon_source: CarbonSource = "none"

    def edges(self, lo: datetime, hi: datetime) -> list[datetime]:
        """[lo, every price or carbon step inside, hi]: segments with one price and one intensity."""
        inner = set(self.price_per_kwh.steps_inside(lo, hi)) | set(self.carbon_g_per_kwh.steps_inside(lo, hi))
        return [lo, *sorted(inner), hi]


NO_SITE = Tariff(site=None)


def _series(conn: psycopg.Connection, sql: str, key: str, lo: datetime, hi: datetime) -> list[tuple[datetime, float]]:
    """Points in force during [lo, hi): the last at or before lo, then those inside."""
    return conn.execute(sql, {"key": key, "lo": lo, "hi": hi}).fetchall()


PRICE_SQL = """
(SELECT time, price_per_kwh FROM site_prices WHERE site = %(key)s AND time <= %(lo)s ORDER BY time DESC LIMIT 1)
UNION ALL
(SELECT time, price_per_kwh FROM site_prices WHERE site = %(key)s AND time > %(lo)s AND time < %(hi)s)
ORDER BY 1"""

CARBON_SQL = """
(SELECT time, g_co2e_per_kwh FROM carbon_intensity WHERE region = %(key)s AND time <= %(lo)s
 ORDER BY time DESC LIMIT 1)
UNION ALL
(SELECT time, g_co2e_per_kwh FROM carbon_intensity WHERE region = %(key)s AND time > %(lo)s AND time < %(hi)s)
UNION ALL
(SELECT time, g_co2e_per_kwh FROM carbon_intensity WHERE region = %(key)s ORDER BY time LIMIT 1)
ORDER BY 1"""


def _dedup(points: Sequence[tuple[datetime, float]]) -> tuple[tuple[datetime, ...], tuple[float, ...]]:
    seen: dict[datetime, float] = {}
    for t, v in points:
        seen[t] = float(v)
    times = tuple(sorted(seen))
    return times, tuple(seen[t] for t in times)


def load_tariff(conn: psycopg.Connection, site: str | None, lo: datetime, hi: datetime) -> Tariff:
    """The tariff of ``site`` with its series cut to what matters for [lo, hi)."""
    if site is None:
        return NO_SITE
    row = conn.execute("SELECT pue, price_per_kwh, gpu_hour_price, currency, carbon_region, carbon_g_per_kwh "
                       "FROM sites WHERE site = %s", (site,)).fetchone()
    if row is None:
        # runs.site references sites, so this only happens for a site deleted under us
        return Tariff(site=site)
    pue, flat_price, gpu_hour_price, currency, region, constant = row
    p_times, p_values = _dedup(_series(conn, PRICE_SQL, site, lo, hi))
    price = StepSeries(p_times, p_values, before=float(flat_price))
    carbon = StepSeries(before=None if constant is None else float(constant))
    carbon_source: CarbonSource = "site_constant" if constant is not None else "none"
    if region is not None:
        c_times, c_values = _dedup(_series(conn, CARBON_SQL, region, lo, hi))
        if c_times:
            before = float(constant) if constant is not None else c_values[0]
            carbon = StepSeries(c_times, c_values, before=before)
            carbon_source = "series"
    return Tariff(site=site, pue=float(pue), currency=currency, gpu_hour_price=float(gpu_hour_price),
                  price_per_kwh=price, carbon_g_per_kwh=carbon,
                  price_source="time_of_use" if p_times else "flat", carbon_source=carbon_source)
