"""Money and measured quantities as exact decimals, and how they are written out.

The database rounds each line's money to its currency's minor units
(``gpufleet_minor_units``: 2 for EUR/USD, 0 for JPY, 3 for KWD, ...) and
energies to 1e-9 kWh; sums of lines are made in :class:`~decimal.Decimal`
so they stay exact.  JSON carries them as numbers (the contract's fields
are numbers) whose shortest form is the rounded decimal (``324.8``, never
``324.79999999999995``); CSV writes money with all its minor digits
(``324.80``).
"""

from __future__ import annotations

from decimal import Decimal

#: Decimal places of energies (kWh) and CO2e (kg) as the database rounds them.
ENERGY_PLACES = 9


def number(value: Decimal | None) -> float | None:
    """A JSON number: the float nearest the decimal, whose repr is the decimal itself."""
    return None if value is None else float(value)


def rounded(value: float | None, places: int) -> float | None:
    if value is None:
        return None
    return float(round(Decimal(repr(value)), places))


def money_text(value: Decimal | float | None, minor_units: int) -> str:
    """Money for CSV: every minor digit (``12.30``), empty when unknown."""
    if value is None:
        return ""
    d = value if isinstance(value, Decimal) else Decimal(repr(value))
    return format(d.quantize(Decimal(1).scaleb(-minor_units)), "f")
