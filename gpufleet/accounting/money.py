"""Money and measured quantities as exact decimals, and how they are written out.

The database computes each line's money in ``numeric`` and returns it to
1e-9 of its currency (``MONEY_PLACES``), energies to 1e-9 kWh; sums of lines
are made in :class:`~decimal.Decimal` so they stay exact.  The API and the
JSON bodies carry money as the accounting computes it (a run whose energy
costs 0.0274 EUR says 0.0274, not 0.03): cloud providers' cost exports carry
6-10 decimals too, and a reader that sums many small runs must not sum their
rounding.

Rounding to the currency's minor units (``minor_units``: 2 for EUR/USD, 0 for
JPY, 3 for KWD, ...) is presentation: CSV cells, the web view, the finance
report.  Where rounded figures are shown with their total, :func:`allocate`
rounds them by largest remainder, so the rounded rows add up to the rounded
total exactly, as a person checking the sheet expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Context, Decimal

#: Decimal places of energies (kWh) and CO2e (kg) as the database rounds them.
ENERGY_PLACES = 9
#: Decimal places of money as the database returns it (``gpufleet.db.accounting_sql.MONEY_PLACES``).
MONEY_PLACES = 9


def number(value: Decimal | None) -> float | None:
    """A JSON number: the float nearest the decimal, whose repr is the decimal itself where it can be."""
    return None if value is None else float(value)


def _context(value: Decimal, places: int) -> Context:
    """A context wide enough to quantize ``value`` to ``places`` without InvalidOperation, however large."""
    digits = max(value.adjusted() + 1, 1) + max(places, 0) + 2
    return Context(prec=max(28, digits))


def quantized(value: Decimal, places: int, rounding: str = ROUND_HALF_UP) -> Decimal:
    """``value`` to ``places`` decimals (half away from zero by default), at any magnitude."""
    return value.quantize(Decimal(1).scaleb(-places), rounding=rounding, context=_context(value, places))


def rounded(value: float | None, places: int) -> float | None:
    if value is None:
        return None
    return float(quantized(Decimal(repr(value)), places))


def as_decimal(value: Decimal | float) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(repr(value))


def money_text(value: Decimal | float | None, minor_units: int) -> str:
    """Money for CSV: every minor digit (``12.30``), empty when unknown."""
    if value is None:
        return ""
    return format(quantized(as_decimal(value), minor_units), "f")


def allocate(values: Sequence[Decimal], minor_units: int) -> list[Decimal]:
    """``values`` rounded to minor units so that they add up to their sum rounded (largest remainder).

    Each value is first rounded down; the minor units still missing to reach the rounded sum go, one
    each, to the values whose remainders were largest (earlier ones first on a tie).  Every result is
    within one minor unit of its value, and their sum is the rounded sum exactly.
    """
    if not values:
        return []
    unit = Decimal(1).scaleb(-minor_units)
    floors = [quantized(v, minor_units, ROUND_FLOOR) for v in values]
    target = quantized(sum(values, Decimal(0)), minor_units)
    missing = int(((target - sum(floors, Decimal(0))) / unit).to_integral_value())
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    out = list(floors)
    for i in order[: max(missing, 0)]:
        out[i] += unit
    return out
