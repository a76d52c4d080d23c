"""Time values as the contracts allow them: RFC 3339 with offset, or epoch seconds."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import overload


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


def epoch(dt: datetime) -> float:
    return dt.timestamp()


def iso(dt: datetime | None) -> str | None:
    """RFC 3339 UTC with a Z, as findings and reports print times."""
    if dt is None:
        return None
    s = dt.astimezone(UTC).isoformat()
    return s.replace("+00:00", "Z")


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
