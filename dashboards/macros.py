"""Grafana's query-time expansion of a PostgreSQL panel's ``rawSql``, reimplemented.

Grafana cannot run here, so the tests prove the dashboards by expanding every
query exactly as Grafana would and running the result on a real database.
The rules below are taken from Grafana's sources (frontend ``TemplateSrv`` and
``SqlDatasource.interpolateVariable``, backend ``sqleng.Interpolate`` and the
postgres ``macros.go``); anything this module does not know raises, so a
dashboard cannot silently depend on a rule that was not checked.

Step 1, template variables (frontend).  Occurrences of ``$var``, ``${var}``,
``${var:format}`` and ``[[var]]`` / ``[[var:format]]`` whose name is a
dashboard variable are replaced; other ``$name`` text (``$__timeFilter``...)
is left alone.

- ``All`` selected with a custom ``allValue``: the custom value is inserted
  as it is, *unformatted* (Grafana skips formatting for it, except the
  ``text``/``percentencode`` formats).  ``All`` without one: the list of every
  option's value, formatted as below.
- ``${var:sqlstring}``: each value with ``'`` doubled, in single quotes,
  joined by ``,`` (``'a','b'``).  ``${var:csv}``: values joined by ``,``
  without quoting.  ``raw``: the value as is.  ``singlequote`` /
  ``doublequote``: quoted with ``\\'`` / ``\\"`` escapes.  ``pipe``: joined by
  ``|``.  ``json``: a JSON array or string.
- No format (the SQL data source's own rule): a single string of a variable
  that is neither multi-value nor include-All has its ``'`` doubled but is not
  quoted; a string of a multi/include-All variable and each element of a list
  are quoted literals, joined by ``,``.
- ``$__from`` / ``$__to``: the range in epoch milliseconds.

Step 2, global substitutions (backend ``sqleng.Interpolate``), plain text
replacement in this order: ``$__interval_ms`` (milliseconds), ``$__interval``
(Go ``gtime.FormatInterval``: whole ``y``/``d``/``h``/``m``/``s``/``ms``,
truncated), ``$__unixEpochFrom()``, ``$__unixEpochTo()`` (epoch seconds).

Step 3, macros (backend postgres macro engine): every match of
``\\$(\\w+)\\(([^)]*)\\)`` (so a macro argument cannot contain ``)``), its
arguments split on ``,`` and trimmed:

- ``$__time(c)`` -> ``c AS "time"``; ``$__timeEpoch(c)`` ->
  ``extract(epoch from c) as "time"``.
- ``$__timeFilter(c)`` -> ``c BETWEEN 'FROM' AND 'TO'`` with both ends in UTC
  RFC 3339 with nanoseconds, trailing zeros dropped (Go ``RFC3339Nano``).
- ``$__timeFrom()`` / ``$__timeTo()`` -> ``'FROM'`` / ``'TO'`` (quoted, same
  format; an untyped literal, so arithmetic on it needs a cast).
- ``$__timeGroup(c, interval[, fill])`` -> ``floor(extract(epoch from c)/S)*S``
  with ``S`` the interval in seconds printed as Go's ``%v`` of a float64
  (``60``, ``0.5``, ``2.592e+06``), or ``time_bucket('S.SSSs',c)`` when the
  data source has the TimescaleDB option.  When the macro text is followed
  directly by ``,`` (its first occurrence in the query), Grafana treats it as
  ``$__timeGroupAlias`` for pre-5.3 dashboards.
- ``$__timeGroupAlias(...)`` -> the above plus `` AS "time"``.
- ``$__unixEpochFilter(c)`` -> ``c >= F AND c <= T`` (epoch seconds);
  ``$__unixEpochGroup(c, i)`` / ``$__unixEpochGroupAlias``; the nanosecond
  forms ``$__unixEpochNanoFilter/From/To``.
- Any other ``$name(...)`` is an error ("unknown macro").

Intervals (``1s``, ``5m``, ``1h``, ``1d``, ``1w``, ``1M``, ``1y``) parse as Grafana's
``gtime.ParseInterval``.  The query interval a panel gets is Grafana's
``rangeutil.calculateInterval``: ``roundInterval(range / maxDataPoints)``, raised
to the panel's (or the data source's) minimum interval.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

ALL = "$__all"


class ExpansionError(ValueError):
    """A query uses a macro, format or variable the expansion does not know."""


@dataclass(frozen=True)
class Variable:
    """A dashboard variable's current selection, as Grafana holds it."""

    name: str
    #: One value, a list of values, or ``ALL``.
    value: str | Sequence[str]
    multi: bool = False
    include_all: bool = False
    #: The variable's custom "All" value, inserted unformatted when All is selected.
    all_value: str | None = None
    #: Every option's value (what "All" stands for without a custom value).
    options: Sequence[str] = field(default_factory=tuple)


@dataclass(frozen=True)
class TimeRange:
    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("time range ends need a time zone")


# ---------------------------------------------------------------- intervals

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
    "M": 30 * 86_400_000,
    "y": 365 * 86_400_000,
}


def parse_interval_ms(text: str) -> int:
    """Grafana's ``gtime.ParseInterval`` for the simple ``<n><unit>`` forms dashboards use."""
    m = re.fullmatch(r"\s*(\d+)(ms|s|m|h|d|w|M|y)\s*", text.strip("'"))
    if not m:
        raise ExpansionError(f"cannot parse interval {text!r}")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def format_interval(ms: int) -> str:
    """Go ``gtime.FormatInterval``: the largest whole unit, truncated."""
    for unit, size in (
        ("y", _UNITS_MS["y"]),
        ("d", _UNITS_MS["d"]),
        ("h", _UNITS_MS["h"]),
        ("m", _UNITS_MS["m"]),
        ("s", 1000),
        ("ms", 1),
    ):
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


#: Grafana's ``rangeutil.roundInterval``: (upper bound exclusive, result), ms.
_ROUND = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (750000, 600000),
    (1050000, 900000),
    (1500000, 1200000),
    (2700000, 1800000),
    (5400000, 3600000),
    (9000000, 7200000),
    (16200000, 10800000),
    (32400000, 21600000),
    (86400000, 43200000),
    (604800000, 86400000),
    (1814400000, 604800000),
    (3628800000, 2592000000),
)


def round_interval(ms: float) -> int:
    for bound, result in _ROUND:
        if ms < bound:
            return result
    return 31536000000


def query_interval_ms(rng: TimeRange, max_data_points: int, min_interval: str | None = None) -> int:
    """Grafana's ``calculateInterval``: the ``$__interval`` a panel's query gets."""
    span_ms = (rng.end - rng.start).total_seconds() * 1000.0
    interval = round_interval(span_ms / max(max_data_points, 1))
    low = parse_interval_ms(min_interval) if min_interval else 1
    return max(interval, low)


# ---------------------------------------------------------------- formatting helpers


def rfc3339_nano(t: datetime) -> str:
    """Go ``time.RFC3339Nano`` of a UTC time: fractional seconds without trailing zeros, ``Z``."""
    t = t.astimezone(UTC)
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        base += "." + f"{t.microsecond:06d}".rstrip("0")
    return base + "Z"


def go_float(x: float) -> str:
    """Go's ``%v`` of a float64, as ``fmt.Sprintf("%v", seconds)`` prints a bucket size.

    The shortest digits that round-trip; the exponent form when the decimal
    exponent is below -4 or at least 6 (the precision ``strconv`` decides with
    for the shortest format), so ``2592000`` prints ``2.592e+06`` while
    ``86400`` prints ``86400``.
    """
    if x == 0:
        return "0"
    if not math.isfinite(x):
        raise ExpansionError(f"interval {x} is not finite")
    d = Decimal(repr(x)).normalize()
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    nd = len(digits)
    exp10 = nd + exponent - 1
    s = "-" if sign else ""
    ds = "".join(map(str, digits))
    if exp10 < -4 or exp10 >= 6:
        mant = ds[0] + ("." + ds[1:] if nd > 1 else "")
        return f"{s}{mant}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return s + format(d.copy_abs(), "f")


def _quote_literal(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def _format(value: str | Sequence[str], fmt: str | None, var: Variable) -> str:
    values = [value] if isinstance(value, str) else list(value)
    if fmt is None:  # SqlDatasource.interpolateVariable
        if isinstance(value, str):
            return _quote_literal(value) if (var.multi or var.include_all) else value.replace("'", "''")
        return ",".join(_quote_literal(v) for v in values)
    if fmt == "sqlstring":
        return ",".join(_quote_literal(v) for v in values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "raw":
        return value if isinstance(value, str) else ",".join(values)
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "json":
        return json.dumps(value if isinstance(value, str) else values, separators=(",", ":"))
    raise ExpansionError(f"variable format {fmt!r} (of ${{{var.name}}}) is not supported here")


# ---------------------------------------------------------------- step 1: template variables

_VARIABLE_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def replace_variables(sql: str, variables: Mapping[str, Variable], rng: TimeRange) -> str:
    """Grafana's ``TemplateSrv.replace`` with the SQL data source's formatter."""
    builtins = {
        "__from": str(int(rng.start.timestamp() * 1000)),
        "__to": str(int(rng.end.timestamp() * 1000)),
    }

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if m.group(5):
            raise ExpansionError(f"field paths (${{{name}.{m.group(5)}}}) are not supported here")
        if name in builtins and name not in variables:
            return builtins[name]
        var = variables.get(name)
        if var is None:
            return m.group(0)
        value = var.value
        if value == ALL or (not isinstance(value, str) and list(value)[:1] == [ALL]):
            if var.all_value is not None and fmt not in ("text", "percentencode"):
                return replace_variables(var.all_value, variables, rng)
            value = list(var.options)
        return _format(value, fmt, var)

    return _VARIABLE_RE.sub(repl, sql)


# ---------------------------------------------------------------- step 2: global substitutions


def replace_globals(sql: str, rng: TimeRange, interval_ms: int) -> str:
    """``sqleng.Interpolate``: interval and epoch bounds, plain text replacement."""
    sql = sql.replace("$__interval_ms", str(interval_ms))
    sql = sql.replace("$__interval", format_interval(interval_ms))
    sql = sql.replace("$__unixEpochFrom()", str(int(rng.start.timestamp())))
    return sql.replace("$__unixEpochTo()", str(int(rng.end.timestamp())))


# ---------------------------------------------------------------- step 3: macros

_MACRO_RE = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")


def _evaluate(name: str, args: list[str], rng: TimeRange, timescaledb: bool) -> str:
    frm, to = rfc3339_nano(rng.start), rfc3339_nano(rng.end)
    col = args[0] if args and args[0] else None
    if (
        name in ("__time", "__timeEpoch", "__timeFilter", "__unixEpochFilter", "__unixEpochNanoFilter")
        and col is None
    ):
        raise ExpansionError(f"missing time column argument for macro {name}")
    if name == "__time":
        return f'{col} AS "time"'
    if name == "__timeEpoch":
        return f'extract(epoch from {col}) as "time"'
    if name == "__timeFilter":
        return f"{col} BETWEEN '{frm}' AND '{to}'"
    if name == "__timeFrom":
        return f"'{frm}'"
    if name == "__timeTo":
        return f"'{to}'"
    if name in ("__timeGroup", "__unixEpochGroup"):
        if len(args) < 2:
            raise ExpansionError(f"macro {name} needs time column and interval and optional fill value")
        if len(args) == 3:
            raise ExpansionError(f"macro {name}: fill modes are not used by these dashboards")
        seconds = parse_interval_ms(args[1]) / 1000.0
        if name == "__unixEpochGroup":
            return f"floor(({args[0]})/{go_float(seconds)})*{go_float(seconds)}"
        if timescaledb:
            return f"time_bucket('{seconds:.3f}s',{args[0]})"
        return f"floor(extract(epoch from {args[0]})/{go_float(seconds)})*{go_float(seconds)}"
    if name in ("__timeGroupAlias", "__unixEpochGroupAlias"):
        return _evaluate(name.removesuffix("Alias"), args, rng, timescaledb) + ' AS "time"'
    if name == "__unixEpochFilter":
        return f"{col} >= {int(rng.start.timestamp())} AND {col} <= {int(rng.end.timestamp())}"
    if name == "__unixEpochNanoFilter":
        return f"{col} >= {_nanos(rng.start)} AND {col} <= {_nanos(rng.end)}"
    if name == "__unixEpochNanoFrom":
        return str(_nanos(rng.start))
    if name == "__unixEpochNanoTo":
        return str(_nanos(rng.end))
    raise ExpansionError(f"unknown macro {name!r}")


def _nanos(t: datetime) -> int:
    return int(Decimal(str(t.timestamp())) * 1_000_000_000)


def replace_macros(sql: str, rng: TimeRange, timescaledb: bool = False) -> str:
    """The postgres macro engine's ``Interpolate``."""
    original = sql

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "__timeGroup":
            at = original.find(m.group(0))
            if at >= 0 and original[at + len(m.group(0)) : at + len(m.group(0)) + 1] == ",":
                name = "__timeGroupAlias"
        args = [a.strip(" ") for a in m.group(2).split(",")]
        return _evaluate(name, args, rng, timescaledb)

    return _MACRO_RE.sub(repl, sql)


# ---------------------------------------------------------------- all steps


def expand(
    sql: str,
    rng: TimeRange,
    variables: Mapping[str, Variable] | None = None,
    *,
    interval_ms: int = 60_000,
    timescaledb: bool = False,
) -> str:
    """The SQL Grafana would send to PostgreSQL for this ``rawSql``."""
    sql = replace_variables(sql, variables or {}, rng)
    sql = replace_globals(sql, rng, interval_ms)
    return replace_macros(sql, rng, timescaledb)
