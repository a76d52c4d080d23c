"""What a site setting may be: one set of bounds for every way in, and for what the accounting trusts.

A price of 1e300 per GPU-hour, a PUE of 50 or 50,000 g CO2e per kWh is a typo or
a unit mistake, not a tariff.  Stored, it turns every report that sums it into
nonsense (or, before numeric money, into an overflow that failed them all), so
the API (``PUT``/``PATCH /v1/sites``, the price, PUE and carbon series), the CLI
(``gpufleet site set``, ``site pue-load``, ``carbon load``), replay's
``sites.csv`` and the store itself refuse it with the bound in the message, and
migration 0014 makes the database refuse it for new rows too.

The price bounds are in the site's own currency, so they must hold for every
currency a site may price in: an energy price of 1,000,000 per kWh and a
GPU-hour price of 100,000,000 are far above any tariff even in the currencies
with the most units to the US dollar (about a million rials), and still small
enough that no sum of a fleet's lines loses a cent in a float.

A value stored before the bounds existed stays readable: the accounting
computes with it and reports the line it makes wrong (:func:`line_problems`)
instead of failing the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Bound:
    """The range [lo, hi] of one setting, and what its unit is (for the message)."""

    setting: str
    lo: float
    hi: float
    unit: str

    @property
    def text(self) -> str:
        """The range as a person reads it, with its unit."""
        return f"{_text(self.lo)}..{_text(self.hi)} {self.unit}"

    def problem(self, value: float) -> str | None:
        """Why ``value`` is refused, naming the bound; None when it is within it."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{self.setting} must be a number, not {value!r}"
        if not math.isfinite(value):
            return f"{self.setting} must be a finite number, not {value!r}"
        if value < self.lo or value > self.hi:
            return f"{self.setting} {value:g} is outside {self.text}"
        return None


def _text(x: float) -> str:
    """A bound as a person reads it: 100,000,000 rather than 1e+08."""
    return f"{int(x):,}" if x == int(x) and abs(x) < 1e16 else f"{x:g}"


PUE = Bound("pue", 1.0, 5.0, "(facility energy / IT energy; a PUE is at least 1)")
PRICE_PER_KWH = Bound("price_per_kwh", 0.0, 1e6, "per kWh, in the site's currency")
GPU_HOUR_PRICE = Bound("gpu_hour_price", 0.0, 1e8, "per GPU-hour, in the site's currency")
CARBON_G_PER_KWH = Bound("carbon_g_per_kwh", 0.0, 5000.0, "g CO2e per kWh (coal-fired power is about 1000)")

#: The bound of each numeric site setting (and of a carbon series' points, ``carbon_g_per_kwh``).
BOUNDS: dict[str, Bound] = {b.setting: b for b in (PUE, PRICE_PER_KWH, GPU_HOUR_PRICE, CARBON_G_PER_KWH)}


def problem(setting: str, value: float | None) -> str | None:
    """Why ``value`` cannot be ``setting`` (None: it can, or the setting has no bound, or it is unset)."""
    bound = BOUNDS.get(setting)
    if bound is None or value is None:
        return None
    return bound.problem(value)


def check(setting: str, value: float | None) -> float | None:
    """``value`` when within the bound of ``setting``; else :class:`ValueError` naming the bound."""
    why = problem(setting, value)
    if why is not None:
        raise ValueError(why)
    return value


def line_problems(
    facility_kwh: Decimal,
    energy_cost: Decimal,
    gpu_hours: Decimal,
    compute_cost: Decimal | None,
    co2e_kg: Decimal,
    known_kwh: Decimal,
) -> dict[str, str]:
    """What an accounting line's own figures show was priced outside the bounds, by field.

    A line's energy cost is its facility energy times the prices in force, so an average price above
    the bound means a stored price above it somewhere in the line (likewise the GPU-hour price and
    the carbon intensity).  Keys: ``energy_cost``, ``compute_cost``, ``co2e_kg``.
    """
    out: dict[str, str] = {}
    slack = Decimal("1.000001")
    if facility_kwh > 0 and energy_cost > facility_kwh * Decimal(PRICE_PER_KWH.hi) * slack:
        out["energy_cost"] = (
            f"price_per_kwh above {_text(PRICE_PER_KWH.hi)} {PRICE_PER_KWH.unit} "
            f"(on average {float(energy_cost / facility_kwh):g})"
        )
    if (
        compute_cost is not None
        and gpu_hours > 0
        and compute_cost > gpu_hours * Decimal(GPU_HOUR_PRICE.hi) * slack
    ):
        out["compute_cost"] = (
            f"gpu_hour_price above {_text(GPU_HOUR_PRICE.hi)} {GPU_HOUR_PRICE.unit} "
            f"(on average {float(compute_cost / gpu_hours):g})"
        )
    if known_kwh > 0 and co2e_kg * 1000 > known_kwh * Decimal(CARBON_G_PER_KWH.hi) * slack:
        out["co2e_kg"] = (
            f"carbon intensity above {_text(CARBON_G_PER_KWH.hi)} g CO2e per kWh "
            f"(on average {float(co2e_kg * 1000 / known_kwh):g})"
        )
    return out
