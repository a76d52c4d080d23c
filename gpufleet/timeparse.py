"""Time values as the contracts allow them: RFC 3339 with offset, or epoch seconds."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import overload

#: The span a period bound (``from``, ``to``, ``at``) is held to: a year inside what a datetime holds
#: at either end.  Nothing is measured that early or late, so a bound beyond it selects what the
#: span's edge selects; inside it, every window the product derives from a bound (a lookback of
#: months, a grace of days) stays a representable time, where ``to=0001-01-20`` minus a 30-day
#: lookback was year 0 and an overflow.
PERIOD_EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
PERIOD_LATEST = datetime(9998, 1, 1, tzinfo=UTC)


class TimeParseError(ValueError):
    pass


def parse_time(value: str | float | int) -> datetime:
    """Parse RFC 3339 (offset required) or epoch seconds into an aware UTC datetime.

    Every refusal is a :class:`TimeParseError`, including times that leave
    the years 1..9999 once in UTC, so callers report one kind of error.
    """
    try:
        return _parse(value)
    except (OverflowError, OSError, ValueError) as e:
        if isinstance(e, TimeParseError):
            raise
        raise TimeParseError(f"{value!r} falls outside the years 1..9999 (UTC)") from None


def _parse(value: str | float | int) -> datetime:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise TimeParseError(f"{value!r} is not a time")
        return datetime.fromtimestamp(float(value), UTC)
    s = str(value).strip()
    if not s:
        raise TimeParseError("empty time")
    try:
        f = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(f):
            raise TimeParseError(f"{s!r} is not a time")
        return datetime.fromtimestamp(f, UTC)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeParseError(f"{s!r} is neither RFC 3339 nor epoch seconds") from None
    if dt.tzinfo is None:
        raise TimeParseError(f"{s!r} has no UTC offset (write e.g. 2026-12-01T10:00:00Z)")
    return dt.astimezone(UTC)


def period_bound(dt: datetime) -> datetime:
    """A period bound held to [:data:`PERIOD_EARLIEST`, :data:`PERIOD_LATEST`] (an aware datetime in, the
    same or the span's edge in UTC out); the comparison itself cannot overflow, whatever the offset."""
    if dt < PERIOD_EARLIEST:
        return PERIOD_EARLIEST
    if dt > PERIOD_LATEST:
        return PERIOD_LATEST
    return dt


def epoch(dt: datetime) -> float:
    return dt.timestamp()


@overload
def at(t: float) -> datetime: ...
@overload
def at(t: None) -> None: ...
def at(t: float | None) -> datetime | None:
    """Epoch seconds as an aware UTC datetime (what the database columns take)."""
    return None if t is None else datetime.fromtimestamp(t, UTC)


@overload
def iso(dt: datetime, timespec: str = ..., *, zulu: bool = ...) -> str: ...
@overload
def iso(dt: None, timespec: str = ..., *, zulu: bool = ...) -> None: ...
@overload
def iso(dt: datetime | None, timespec: str = ..., *, zulu: bool = ...) -> str | None: ...
def iso(dt: datetime | None, timespec: str = "auto", *, zulu: bool = True) -> str | None:
    """RFC 3339 UTC, as findings and reports print times: with a ``Z`` (``zulu``) or the ``+00:00`` some
    outside APIs ask for; ``timespec`` as :meth:`datetime.isoformat` takes it (``"seconds"`` for APIs that
    take no fraction)."""
    if dt is None:
        return None
    s = dt.astimezone(UTC).isoformat(timespec=timespec)
    return s.replace("+00:00", "Z") if zulu else s


def iso_at(t: float) -> str:
    """Epoch seconds as :func:`iso` prints a time (microseconds when the time has them)."""
    return iso(datetime.fromtimestamp(t, UTC))


@overload
def rfc3339(t: float) -> str: ...
@overload
def rfc3339(t: None) -> None: ...
@overload
def rfc3339(t: float | None) -> str | None: ...
def rfc3339(t: float | None) -> str | None:
    """Epoch seconds as RFC 3339 UTC to the millisecond (``2026-12-01T10:00:00Z``), as findings print times."""
    if t is None:
        return None
    s = datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")
    return s.replace("+00:00", "Z").replace(".000Z", "Z")


def rfc3339_rounded(t: float, *, always_ms: bool = False) -> str:
    """Epoch seconds rounded to the millisecond, as bundle labels and recordings print them: milliseconds
    when the rounded time has a fraction (always with ``always_ms``).  Rounding, not truncating, keeps a
    label written from a float sample time equal to the sample row's own time."""
    dt = datetime.fromtimestamp(round(t, 3), tz=UTC)
    if dt.microsecond or always_ms:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
