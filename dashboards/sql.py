"""SQL fragments the dashboards share: filters, the raw/rollup switch, run energy.

All text here is Grafana query text (macros and variables unexpanded).  Two
rules Grafana imposes shape it: a macro argument cannot contain ``)``, and a
``$__timeGroup(...)`` directly followed by ``,`` silently becomes
``$__timeGroupAlias`` -- so groups are referenced by position (``GROUP BY 1``).
"""

from __future__ import annotations

#: Up to this query interval panels read raw samples; from it on, the 1-minute
#: rollups (a bucket of a minute or more gains nothing from raw rows).
ROLLUP_FROM_MS = 60_000

RANGE_FROM = "$__timeFrom()::timestamptz"
RANGE_TO = "$__timeTo()::timestamptz"


def all_or(var: str, expr: str) -> str:
    """``expr IN (selection)``, or true when the multi-value variable is at All."""
    return f"('__all' IN (${{{var}:sqlstring}}) OR {expr} IN (${{{var}:sqlstring}}))"


def node_in_site(node_col: str) -> str:
    return f"('__all' IN (${{site:sqlstring}}) OR {node_col} IN (SELECT node FROM nodes WHERE site IN (${{site:sqlstring}})))"


def incident_in_site(alias: str = "i") -> str:
    """Node-scoped incidents by their node's site, run-scoped ones by their run's site."""
    return (
        f"('__all' IN (${{site:sqlstring}}) OR coalesce((SELECT site FROM nodes WHERE node = {alias}.node), "
        f"(SELECT site FROM runs WHERE run_id = {alias}.run_id)) IN (${{site:sqlstring}}))"
    )


def ev_num(key: str, alias: str = "i") -> str:
    """A numeric evidence field, NULL when absent or not a number."""
    return (
        f"(CASE WHEN jsonb_typeof({alias}.evidence -> '{key}') = 'number' "
        f"THEN ({alias}.evidence ->> '{key}')::float8 END)"
    )


def open_at(t: str, alias: str = "i") -> str:
    return f"({alias}.start <= {t} AND coalesce({alias}.\"end\", 'infinity') > {t})"


def overlaps_range(alias: str = "i", start: str = "start", end: str = '"end"') -> str:
    return f"({alias}.{start} < {RANGE_TO} AND coalesce({alias}.{end}, 'infinity') > {RANGE_FROM})"


def raw_or_rollup(raw: str, rollup: str) -> str:
    """Both branches, of which PostgreSQL runs exactly one (a constant, one-time filter).

    Both must return the same columns in the same order.
    """
    return (
        f"SELECT * FROM (\n{raw.strip()}\n) AS raw_rows WHERE $__interval_ms < {ROLLUP_FROM_MS}\n"
        f"UNION ALL\n"
        f"SELECT * FROM (\n{rollup.strip()}\n) AS rollup_rows WHERE $__interval_ms >= {ROLLUP_FROM_MS}"
    )


#: From this query interval on, panels of node activity read hours, not minutes (a week's range at
#: Grafana's usual 1,000 points is a 10-minute interval: hourly points, read from 168 rows a node).
HOURS_FROM_MS = 600_000


def interval_bin(col: str) -> str:
    """``col`` binned by the query interval, as Grafana's ``$__timeGroup`` bins it (from the Unix epoch),
    but as a ``date_bin`` timestamp: the macro's ``floor(extract(epoch ...))`` is numeric arithmetic, which
    slowed grouping a day of every node's minutes ("GPU-Util by node" at 24 h on 1,250 nodes: p95
    3.53 -> 2.73 s, ``bench/read_side.py --only panel --match 'gpufleet-fleet (6h|24h)'``)."""
    return f"date_bin(make_interval(secs => $__interval_ms / 1000.0), {col}, timestamptz 'epoch')"


def minutes_or_hours(select: str) -> str:
    """``select``, written against ``node_activity_1m``, and its twin over ``node_activity_1h``, of which
    PostgreSQL runs exactly one (a constant, one-time filter on the interval).

    Their columns are sums over GPU-minutes (:mod:`gpufleet.db.activity_sql`), so one query text serves
    both: an hour's row is the sum of its minutes'."""
    hours = select.replace("node_activity_1m", "node_activity_1h")
    return (
        f"SELECT * FROM (\n{select.strip()}\n) AS minute_rows WHERE $__interval_ms < {HOURS_FROM_MS}\n"
        f"UNION ALL\n"
        f"SELECT * FROM (\n{hours.strip()}\n) AS hour_rows WHERE $__interval_ms >= {HOURS_FROM_MS}"
    )


def per_gpu_series(raw_expr: str, rollup_expr: str, where: str, alias: str = "value") -> str:
    """Long-format ``time, metric (node/gpu), value`` of one GPU metric, raw or from ``gpu_stats_1m``.

    ``rollup_expr`` aggregates ``gpu_stats_1m`` columns (``r.``), ``raw_expr``
    aggregates ``gpu_samples`` columns (``s.``); ``where`` filters with ``@`` standing for the
    table alias (``@.node``).
    """
    raw = (
        f"SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu AS metric, {raw_expr} AS {alias}\n"
        f"FROM gpu_samples s WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {where.replace('@', 's')}\n"
        f"GROUP BY 1, 2"
    )
    rollup = (
        f"SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || '/' || r.gpu AS metric, "
        f"{rollup_expr} AS {alias}\n"
        f"FROM gpu_stats_1m r WHERE $__timeFilter(r.bucket) AND {where.replace('@', 'r')}\nGROUP BY 1, 2"
    )
    return raw_or_rollup(raw, rollup) + "\nORDER BY 1, 2"


def per_node_series(metrics: dict[str, tuple[str, str]], where: str) -> str:
    """Long-format host series: ``node label`` per metric, raw ``host_samples`` or ``host_stats_1m``.

    ``metrics``: label -> (raw aggregate over ``s.``, rollup aggregate over ``r.``).
    """
    raws, rolls = [], []
    for label, (raw_expr, roll_expr) in metrics.items():
        raws.append(
            f"SELECT $__timeGroupAlias(s.time, $__interval), s.node || ' {label}' AS metric, "
            f"{raw_expr} AS value\nFROM host_samples s WHERE $__timeFilter(s.time) AND "
            f"{where.replace('@', 's')}\nGROUP BY 1, 2"
        )
        rolls.append(
            f"SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || ' {label}' AS metric, "
            f"{roll_expr} AS value\nFROM host_stats_1m r WHERE $__timeFilter(r.bucket) AND "
            f"{where.replace('@', 'r')}\nGROUP BY 1, 2"
        )
    return raw_or_rollup("\nUNION ALL\n".join(raws), "\nUNION ALL\n".join(rolls)) + "\nORDER BY 1, 2"


def weighted(col: str, alias: str = "r") -> str:
    """Average of a per-minute average, weighted by each minute's sample count."""
    return f"sum({alias}.{col} * {alias}.samples) / nullif(sum({alias}.samples), 0)"


#: Hourly steps at least: a step edge on the hour grid costs the accounting no raw samples.
STEP = "greatest(make_interval(secs => $__interval_ms / 1000.0), interval '1 hour')"


def accounting(
    fleet: bool = False, runs: str = "NULL", detail: str = "line", step: str = "NULL", since: str = RANGE_FROM
) -> str:
    """The API's own accounting lines for the dashboard range (``gpufleet_accounting``, the one SQL
    definition the API, CLI and web view read): runs clipped to the range (and to now), with
    ``fleet`` the unallocated and total lines.  ``detail``: line | segment | step (``step``: an
    interval expression)."""
    return (
        f"gpufleet_accounting({since}, {RANGE_TO}, now(), {runs}, {'true' if fleet else 'false'}, 60, "
        f"'auto', '{detail}', {step})"
    )


def tokens_in_window(run_col: str, t0: str, t1: str) -> str:
    """Tokens a run processed in ``[t0, t1]`` from its cumulative progress reports."""
    return (
        f"(coalesce((SELECT p.tokens FROM run_progress p WHERE p.run_id = {run_col} AND p.time <= {t1} "
        f"ORDER BY p.time DESC LIMIT 1), 0) - coalesce((SELECT p.tokens FROM run_progress p "
        f"WHERE p.run_id = {run_col} AND p.time <= {t0} ORDER BY p.time DESC LIMIT 1), 0))"
    )
