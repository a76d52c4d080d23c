"""Times as the contracts allow them; every refusal is one error type with the value in it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpufleet.timeparse import TimeParseError, at, iso, iso_at, parse_time, rfc3339, rfc3339_rounded


@pytest.mark.parametrize(
    "value,expected",
    [
        ("2026-12-01T10:00:00Z", datetime(2026, 12, 1, 10, tzinfo=UTC)),
        (
            "2026-12-01T10:00:00-23:25",
            datetime(2026, 12, 2, 9, 25, tzinfo=UTC),
        ),  # PostgreSQL alone would refuse it
        ("1764583200", datetime(2025, 12, 1, 10, tzinfo=UTC)),
        (1764583200.5, datetime(2025, 12, 1, 10, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_accepted_times_come_back_in_utc(value: str | float, expected: datetime) -> None:
    got = parse_time(value)
    assert got == expected and got.utcoffset() is not None and got.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "value,says",
    [
        ("", "empty"),
        ("nan", "not a time"),
        (float("inf"), "not a time"),
        ("yesterday", "neither RFC 3339"),
        ("2026-12-01T10:00:00", "no UTC offset"),
        ("0001-01-01T00:00:00+05:00", "outside the years"),
        ("1e20", "outside the years"),
        (-1e15, "outside the years"),
    ],
)
def test_refusals_name_the_value(value: str | float, says: str) -> None:
    with pytest.raises(TimeParseError, match=says):
        parse_time(value)


def test_the_formatters_print_what_the_formats_they_serve_need() -> None:
    dt = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert iso(dt) == "2026-01-02T03:04:05.678901Z"
    assert iso(dt.astimezone(timezone(timedelta(hours=2)))) == "2026-01-02T03:04:05.678901Z"  # always in UTC
    assert iso(dt, "seconds") == "2026-01-02T03:04:05Z"  # Electricity Maps
    assert iso(dt, "seconds", zulu=False) == "2026-01-02T03:04:05+00:00"  # WattTime
    assert iso(None) is None
    assert iso_at(1.5) == "1970-01-01T00:00:01.500000Z" and at(1.5) == datetime(
        1970, 1, 1, 0, 0, 1, 500000, UTC
    )
    assert at(None) is None
    # findings truncate to the millisecond; labels and recordings round, so a label meets its sample's row
    assert rfc3339(1.9996) == "1970-01-01T00:00:01.999Z"
    assert rfc3339_rounded(1.9996) == "1970-01-01T00:00:02Z"
    assert rfc3339_rounded(1.25) == "1970-01-01T00:00:01.250Z"
    assert rfc3339_rounded(2.0, always_ms=True) == "1970-01-01T00:00:02.000Z"
