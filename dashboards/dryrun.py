"""Run every query of a dashboard against a database, the way Grafana would.

Variables are resolved in order (each query variable's own SQL is expanded
and run, "All" picked for multi-value ones unless told otherwise), every
panel target and annotation is expanded with :mod:`gpufleet.dashboards.macros` at the
interval Grafana would choose, and the rows are checked against what the
panel type needs to draw (a ``time`` column and numbers for a time series,
a category and numbers for a bar chart, the columns field overrides name...).

Used by the tests, and by operators (``python -m gpufleet.dashboards.dryrun URL``) to
check the dashboards against their own database without a Grafana.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from gpufleet.dashboards.macros import ALL, TimeRange, Variable, expand, query_interval_ms

#: Panel width Grafana uses as maxDataPoints when a panel sets none (a wide panel, in px).
DEFAULT_MAX_DATA_POINTS = 1000
#: PostgreSQL type OIDs Grafana reads as time, number, text.
TIME_OIDS = frozenset({1082, 1114, 1184})
NUMERIC_OIDS = frozenset({20, 21, 23, 26, 700, 701, 1700})
TEXT_OIDS = frozenset({25, 1043, 18, 19, 1042})


@dataclass
class QueryResult:
    dashboard: str
    panel_id: int | None
    title: str
    kind: str  # panel type, or "annotation" / "variable"
    fmt: str
    sql: str
    interval_ms: int
    columns: list[tuple[str, int]] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    overrides: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.dashboard} / {self.title} (panel {self.panel_id})"

    def names(self) -> list[str]:
        return [c for c, _ in self.columns]


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def _run(conn: psycopg.Connection, sql: str) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SET LOCAL statement_timeout = '60s'")
        cur.execute(sql.encode())
        cols = [(d.name, d.type_code) for d in (cur.description or [])]
        return cols, cur.fetchall()


def _variable_values(cols: list[tuple[str, int]], rows: list[tuple[Any, ...]]) -> list[str]:
    """Grafana's rule: a ``__value`` column if there is one, else the first column."""
    names = [c for c, _ in cols]
    i = names.index("__value") if "__value" in names else 0
    seen: dict[str, None] = {}
    for r in rows:
        if r[i] is not None:
            seen.setdefault(str(r[i]), None)
    return list(seen)


def resolve_variables(
    conn: psycopg.Connection,
    dashboard: Mapping[str, Any],
    rng: TimeRange,
    picks: Mapping[str, str | Sequence[str]] | None = None,
    results: list[QueryResult] | None = None,
) -> dict[str, Variable]:
    """Current values of the dashboard's query variables, resolved in declaration order."""
    picks = picks or {}
    out: dict[str, Variable] = {}
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        sql = expand(v["query"], rng, out)
        t0 = time.perf_counter()
        qr = QueryResult(
            dashboard.get("uid", "?"), None, f"variable {v['name']}", "variable", "table", sql, 0
        )
        try:
            qr.columns, qr.rows = _run(conn, sql)
        except psycopg.Error as e:
            qr.error = str(e).strip()
        qr.seconds = time.perf_counter() - t0
        if results is not None:
            results.append(qr)
        options = _variable_values(qr.columns, qr.rows) if qr.error is None else []
        multi, include_all = bool(v.get("multi")), bool(v.get("includeAll"))
        value: str | Sequence[str]
        if v["name"] in picks:
            value = picks[v["name"]]
        elif include_all:
            value = [ALL]
        else:
            value = options[0] if options else ""
        out[v["name"]] = Variable(
            v["name"],
            value,
            multi=multi,
            include_all=include_all,
            all_value=v.get("allValue") or None,
            options=tuple(options),
        )
    return out


def run_dashboard(
    conn: psycopg.Connection,
    dashboard: Mapping[str, Any],
    rng: TimeRange,
    picks: Mapping[str, str | Sequence[str]] | None = None,
    *,
    interval_ms: int | None = None,
    timescaledb: bool = False,
    min_interval: str | None = None,
) -> list[QueryResult]:
    """Variables, then every panel target and annotation query, expanded and run.

    ``interval_ms`` forces the query interval (as a narrow panel or a long range
    would); otherwise each panel gets Grafana's for its ``maxDataPoints``.
    """
    results: list[QueryResult] = []
    variables = resolve_variables(conn, dashboard, rng, picks, results)
    uid = dashboard.get("uid", "?")
    jobs: list[tuple[int | None, str, str, dict[str, Any], int, tuple[str, ...]]] = []
    for p in panels(dashboard):
        if p.get("type") in ("row", "text"):
            continue
        mdp = int(p.get("maxDataPoints") or DEFAULT_MAX_DATA_POINTS)
        iv = interval_ms or query_interval_ms(rng, mdp, p.get("interval") or min_interval)
        overrides = tuple(
            o["matcher"]["options"]
            for o in p.get("fieldConfig", {}).get("overrides", [])
            if o.get("matcher", {}).get("id") == "byName"
        )
        for t in p.get("targets", []):
            jobs.append((p.get("id"), p.get("title", ""), p.get("type", ""), t, iv, overrides))
    for a in dashboard.get("annotations", {}).get("list", []):
        if "target" in a:
            iv = interval_ms or query_interval_ms(rng, DEFAULT_MAX_DATA_POINTS, min_interval)
            jobs.append((None, f"annotation {a['name']}", "annotation", a["target"], iv, ()))
    for pid, title, kind, t, iv, overrides in jobs:
        sql = expand(t.get("rawSql", ""), rng, variables, interval_ms=iv, timescaledb=timescaledb)
        qr = QueryResult(uid, pid, title, kind, t.get("format", "time_series"), sql, iv, overrides=overrides)
        t0 = time.perf_counter()
        try:
            qr.columns, qr.rows = _run(conn, sql)
        except psycopg.Error as e:
            qr.error = str(e).strip()
        qr.seconds = time.perf_counter() - t0
        results.append(qr)
    return results


def _is_time(oid: int) -> bool:
    return oid in TIME_OIDS


def shape_problems(r: QueryResult) -> list[str]:
    """What would keep Grafana from drawing this result (empty results are not judged here)."""
    if r.error:
        return [f"{r.where}: query failed: {r.error}"]
    out: list[str] = []
    names = r.names()
    if len(set(names)) != len(names):
        out.append(f"{r.where}: duplicate column names {names}")
    for o in r.overrides:
        if o not in names:
            out.append(f"{r.where}: field override names {o!r}, which the query does not return ({names})")
    numeric = [c for c, oid in r.columns if oid in NUMERIC_OIDS]
    strings = [c for c, oid in r.columns if oid in TEXT_OIDS]
    if r.kind == "variable":
        if not r.columns:
            out.append(f"{r.where}: returns no columns")
        return out
    if r.kind == "annotation":
        for need in ("time", "text"):
            if need not in names:
                out.append(f"{r.where}: annotation needs a {need!r} column, has {names}")
        return out
    if r.fmt == "time_series":
        if "time" not in names:
            return [*out, f"{r.where}: time series needs a 'time' column, has {names}"]
        ti = names.index("time")
        oid = r.columns[ti][1]
        if not (_is_time(oid) or oid in NUMERIC_OIDS):
            out.append(f"{r.where}: 'time' column has type oid {oid}, neither a timestamp nor a number")
        values = [c for c in numeric if c != "time"]
        if not values:
            out.append(f"{r.where}: time series has no numeric value column ({r.columns})")
        if len(strings) > 1:
            out.append(f"{r.where}: long format takes one string (metric) column, has {strings}")
        times = [row[ti] for row in r.rows]
        if any(a is None for a in times):
            out.append(f"{r.where}: NULL time values")
        elif any(a > b for a, b in itertools.pairwise(times)):
            out.append(f"{r.where}: rows are not ordered by time (Grafana needs ORDER BY time)")
    elif r.kind in ("stat", "bargauge", "gauge"):
        if not numeric:
            out.append(f"{r.where}: {r.kind} needs a numeric column, has {r.columns}")
    elif r.kind == "barchart" and (
        not numeric or not (strings or any(_is_time(oid) for _, oid in r.columns))
    ):
        out.append(f"{r.where}: bar chart needs a category (text) column and numbers, has {r.columns}")
    return out


def main(argv: list[str] | None = None) -> int:
    from gpufleet.dashboards.loader import load_all

    ap = argparse.ArgumentParser(description="Run every dashboard query against a gpufleet database.")
    ap.add_argument("url", help="PostgreSQL URL of the gpufleet database")
    ap.add_argument("--hours", type=float, default=6.0, help="range length, ending now")
    args = ap.parse_args(argv)
    end = datetime.now(UTC)
    rng = TimeRange(end - timedelta(hours=args.hours), end)
    bad = 0
    with psycopg.connect(args.url, autocommit=True) as conn:
        for d in load_all().values():
            for r in run_dashboard(conn, d, rng):
                problems = shape_problems(r)
                bad += bool(problems)
                status = "FAIL" if problems else ("empty" if not r.rows else "ok")
                print(f"{status:5} {r.seconds * 1000:7.0f} ms  {r.where}: {len(r.rows)} rows")
                for p in problems:
                    print("      " + p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
