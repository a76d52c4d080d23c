"""The Grafana expansion rules, each against the text Grafana itself produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.dashboards.macros import (
    ALL,
    ExpansionError,
    TimeRange,
    Variable,
    expand,
    format_interval,
    go_float,
    query_interval_ms,
    replace_macros,
    replace_variables,
    rfc3339_nano,
)

T0 = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
RNG = TimeRange(T0, T0 + timedelta(minutes=15, milliseconds=500))


def test_time_filter_and_bounds_are_rfc3339_nano_utc() -> None:
    assert (
        replace_macros("WHERE $__timeFilter(s.time)", RNG)
        == "WHERE s.time BETWEEN '2026-12-01T09:30:00Z' AND '2026-12-01T09:45:00.5Z'"
    )
    assert (
        replace_macros("$__timeFrom() $__timeTo()", RNG) == "'2026-12-01T09:30:00Z' '2026-12-01T09:45:00.5Z'"
    )
    assert rfc3339_nano(datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC)) == "2026-01-02T03:04:05.12Z"


def test_time_group_forms() -> None:
    assert (
        replace_macros("SELECT $__timeGroupAlias(time, 1m)", RNG)
        == 'SELECT floor(extract(epoch from time)/60)*60 AS "time"'
    )
    assert replace_macros("$__timeGroup(time, '5s')", RNG) == "floor(extract(epoch from time)/5)*5"
    assert (
        replace_macros("$__timeGroupAlias(t, 30d)", RNG)
        == 'floor(extract(epoch from t)/2.592e+06)*2.592e+06 AS "time"'
    )
    assert replace_macros("$__timeGroup(t, 1m) x", RNG, timescaledb=True) == "time_bucket('60.000s',t) x"
    # Grafana's pre-5.3 compatibility: a $__timeGroup directly followed by ',' gets the alias.
    assert (
        replace_macros("GROUP BY $__timeGroup(t, 1m), node", RNG)
        == 'GROUP BY floor(extract(epoch from t)/60)*60 AS "time", node'
    )


def test_epoch_macros_and_unknown_macros() -> None:
    assert replace_macros("$__unixEpochFilter(ts)", RNG) == "ts >= 1796117400 AND ts <= 1796118300"
    assert (
        replace_macros("$__time(c), $__timeEpoch(c)", RNG) == 'c AS "time", extract(epoch from c) as "time"'
    )
    with pytest.raises(ExpansionError, match="unknown macro"):
        replace_macros("SELECT $__bogus(x)", RNG)
    with pytest.raises(ExpansionError, match="missing time column"):
        replace_macros("$__timeFilter()", RNG)


def test_go_float_matches_fmt_v() -> None:
    assert [go_float(x) for x in (60.0, 0.5, 86400.0, 604800.0, 2592000.0, 1e6, 0.0001, 1e-5)] == [
        "60",
        "0.5",
        "86400",
        "604800",
        "2.592e+06",
        "1e+06",
        "0.0001",
        "1e-05",
    ]


def test_interval_is_grafanas_calculate_interval() -> None:
    six_h = TimeRange(T0, T0 + timedelta(hours=6))
    assert query_interval_ms(six_h, 1000) == 20_000  # 21.6 s rounds to 20 s
    assert query_interval_ms(TimeRange(T0, T0 + timedelta(hours=24)), 500) == 120_000
    assert query_interval_ms(TimeRange(T0, T0 + timedelta(minutes=15)), 1000) == 1000
    assert query_interval_ms(TimeRange(T0, T0 + timedelta(minutes=15)), 1000, "1m") == 60_000
    assert [format_interval(ms) for ms in (500, 1000, 90_000, 7_200_000, 86_400_000 * 8)] == [
        "500ms",
        "1s",
        "1m",
        "2h",
        "8d",
    ]


def test_globals_replace_interval_ms_before_interval() -> None:
    out = expand("$__interval_ms|$__interval|$__unixEpochFrom()|$__unixEpochTo()", RNG, interval_ms=120_000)
    assert out == "120000|2m|1796117400|1796118300"


def test_variable_formats() -> None:
    multi = Variable("node", ["a", "o'b"], multi=True, include_all=True, all_value="'__all'", options=("a",))
    single = Variable("run", "r'1")
    v = {"node": multi, "run": single}
    assert replace_variables("${node:sqlstring}", v, RNG) == "'a','o''b'"
    assert replace_variables("${node:csv}|${node:pipe}|${node:raw}", v, RNG) == "a,o'b|a|o'b|a,o'b"
    assert replace_variables("$node", v, RNG) == "'a','o''b'"  # the SQL data source's own quoting
    assert replace_variables("'$run' [[run]]", v, RNG) == "'r''1' r''1"  # single: escaped, not quoted
    assert replace_variables("${run:sqlstring}", v, RNG) == "'r''1'"
    assert replace_variables("${node:json}", v, RNG) == '["a","o\'b"]'
    assert (
        replace_variables("$__from-$__to $unknown $__timeFilter(x)", v, RNG)
        == "1796117400000-1796118300500 $unknown $__timeFilter(x)"
    )
    with pytest.raises(ExpansionError, match="not supported"):
        replace_variables("${node:glob}", v, RNG)


def test_all_with_custom_value_is_inserted_unformatted() -> None:
    custom = Variable("site", [ALL], multi=True, include_all=True, all_value="'__all'", options=("x", "y"))
    plain = Variable("team", ALL, multi=True, include_all=True, options=("x", "y'z"))
    v = {"site": custom, "team": plain}
    assert replace_variables("${site:sqlstring}", v, RNG) == "'__all'"
    assert replace_variables("${team:sqlstring}", v, RNG) == "'x','y''z'"
    assert replace_variables("${team:csv}", v, RNG) == "x,y'z"
