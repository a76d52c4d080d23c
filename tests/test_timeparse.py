"""Times as the contracts allow them; every refusal is one error type with the value in it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.timeparse import TimeParseError, parse_time


@pytest.mark.parametrize("value,expected", [
    ("2026-12-01T10:00:00Z", datetime(2026, 12, 1, 10, tzinfo=UTC)),
    ("2026-12-01T10:00:00-23:25", datetime(2026, 12, 2, 9, 25, tzinfo=UTC)),  # PostgreSQL alone would refuse it
    ("1764583200", datetime(2025, 12, 1, 10, tzinfo=UTC)),
    (1764583200.5, datetime(2025, 12, 1, 10, 0, 0, 500000, tzinfo=UTC)),
])
def test_accepted_times_come_back_in_utc(value: str | float, expected: datetime) -> None:
    got = parse_time(value)
    assert got == expected and got.utcoffset() is not None and got.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("value,says", [
    ("", "empty"), ("nan", "not a time"), (float("inf"), "not a time"), ("yesterday", "neither RFC 3339"),
    ("2026-12-01T10:00:00", "no UTC offset"), ("0001-01-01T00:00:00+05:00", "outside the years"),
    ("1e20", "outside the years"), (-1e15, "outside the years"),
])
def test_refusals_name_the_value(value: str | float, says: str) -> None:
    with pytest.raises(TimeParseError, match=says):
        parse_time(value)
