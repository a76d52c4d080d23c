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
#: Ranges longer than this read hourly energy instead of per-minute energy.
HOURLY_ENERGY_AFTER = "interval '2 days'"

RANGE_FROM = "$__timeFrom()::timestamptz"
RANGE_TO = "$__timeTo()::timestamptz"
RANGE_IS_LONG = f"({RANGE_TO} - {RANGE_FROM} > {HOURLY_ENERGY_AFTER})"
RANGE_IS_SHORT = f"({RANGE_TO} - {RANGE_FROM} <= {HOURLY_ENERGY_AFTER})"


def all_or(var: str, expr: str) -> str:
    """``expr IN (selection)``, or true when the multi-value variable is at All."""
    return f"('__all' IN (${{{var}:sqlstring}}) OR {expr} IN (${{{var}:sqlstring}}))"


def node_in_site(node_col: str) -> str:
    return f"('__all' IN (${{site:sqlstring}}) OR {node_col} IN (SELECT node FROM nodes WHERE site IN (${{site:sqlstring}})))"


def incident_in_site(alias: str = "i") -> str:
    """Node-scoped incidents by their node's site, run-scoped ones by their run's site."""
    return (f"('__all' IN (${{site:sqlstring}}) OR coalesce((SELECT site FROM nodes WHERE node = {alias}.node), "
            f"(SELECT site FROM runs WHERE run_id = {alias}.run_id)) IN (${{site:sqlstring}}))")


def ev_num(key: str, alias: str = "i") -> str:
    """A numeric evidence field, NULL when absent or not a number."""
    return (f"(CASE WHEN jsonb_typeof({alias}.evidence -> '{key}') = 'number' "
            f"THEN ({alias}.evidence ->> '{key}')::float8 END)")


def open_at(t: str, alias: str = "i") -> str:
    return f"({alias}.start <= {t} AND coalesce({alias}.\"end\", 'infinity') > {t})"


def overlaps_range(alias: str = "i", start: str = "start", end: str = '"end"') -> str:
    return f"({alias}.{start} < {RANGE_TO} AND coalesce({alias}.{end}, 'infinity') > {RANGE_FROM})"


def raw_or_rollup(raw: str, rollup: str) -> str:
    """Both branches, of which PostgreSQL runs exactly one (a constant, one-time filter).

    Both must return the same columns in the same order.
    """
    return (f"SELECT * FROM (\n{raw.strip()}\n) AS raw_rows WHERE $__interval_ms < {ROLLUP_FROM_MS}\n"
            f"UNION ALL\n"
            f"SELECT * FROM (\n{rollup.strip()}\n) AS rollup_rows WHERE $__interval_ms >= {ROLLUP_FROM_MS}")


def per_gpu_series(raw_expr: str, rollup_expr: str, where: str, alias: str = "value") -> str:
    """Long-format ``time, metric (node/gpu), value`` of one GPU metric, raw or from ``gpu_stats_1m``.

    ``rollup_expr`` aggregates ``gpu_stats_1m`` columns (``r.``), ``raw_expr``
    aggregates ``gpu_samples`` columns (``s.``); ``where`` filters with ``@`` standing for the
    table alias (``@.node``).
    """
    raw = (f"SELECT $__timeGroupAlias(s.time, $__interval), s.node || '/' || s.gpu AS metric, {raw_expr} AS {alias}\n"
           f"FROM gpu_samples s WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {where.replace('@', 's')}\n"
           f"GROUP BY 1, 2")
    rollup = (f"SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || '/' || r.gpu AS metric, "
              f"{rollup_expr} AS {alias}\n"
              f"FROM gpu_stats_1m r WHERE $__timeFilter(r.bucket) AND {where.replace('@', 'r')}\nGROUP BY 1, 2")
    return raw_or_rollup(raw, rollup) + "\nORDER BY 1, 2"


def per_node_series(metrics: dict[str, tuple[str, str]], where: str) -> str:
    """Long-format host series: ``node label`` per metric, raw ``host_samples`` or ``host_stats_1m``.

    ``metrics``: label -> (raw aggregate over ``s.``, rollup aggregate over ``r.``).
    """
    raws, rolls = [], []
    for label, (raw_expr, roll_expr) in metrics.items():
        raws.append(f"SELECT $__timeGroupAlias(s.time, $__interval), s.node || ' {label}' AS metric, "
                    f"{raw_expr} AS value\nFROM host_samples s WHERE $__timeFilter(s.time) AND "
                    f"{where.replace('@', 's')}\nGROUP BY 1, 2")
        rolls.append(f"SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || ' {label}' AS metric, "
                     f"{roll_expr} AS value\nFROM host_stats_1m r WHERE $__timeFilter(r.bucket) AND "
                     f"{where.replace('@', 'r')}\nGROUP BY 1, 2")
    return raw_or_rollup("\nUNION ALL\n".join(raws), "\nUNION ALL\n".join(rolls)) + "\nORDER BY 1, 2"


def weighted(col: str, alias: str = "r") -> str:
    """Average of a per-minute average, weighted by each minute's sample count."""
    return f"sum({alias}.{col} * {alias}.samples) / nullif(sum({alias}.samples), 0)"


def run_energy_ctes(runs_where: str, from_run_start: bool = False) -> str:
    """CTEs ``run_win``, ``energy`` and ``priced`` for the runs matching ``runs_where`` (over ``r.``).

    - ``run_win(run_id, name, team, site, gpus, t0, t1)``: each run's window
      clipped to the dashboard range (only its end, with ``from_run_start``:
      "so far" figures).
    - ``energy(run_id, site, bucket, gpu_j, host_j)``: per minute (hour for
      ranges over two days) from the exact energy rollups; host energy is the
      run's share of each node (GPUs held / GPUs the node reports).
    - ``priced``: IT and facility kWh, energy cost and kg CO2e per bucket, with
      the time-of-use price and carbon intensity in force at the bucket's start
      (the site's constants where no series covers it).

    Buckets are whole minutes (hours), so edge buckets count fully; the API's
    ``/v1/runs/{id}/accounting`` spreads each sample interval exactly.
    """
    def energy(table: str, unit: str, cond: str) -> str:
        return f"""
  SELECT w.run_id, w.site, e.bucket, sum(e.energy_j) AS gpu_j, 0::float8 AS host_j
  FROM run_win w JOIN run_allocations a ON a.run_id = w.run_id
  JOIN gpu_{table} e ON e.node = a.node AND e.gpu = a.gpu
   AND e.bucket >= date_trunc('{unit}', w.t0) AND e.bucket < w.t1
  WHERE {cond}
  GROUP BY 1, 2, 3
  UNION ALL
  SELECT w.run_id, w.site, e.bucket, 0::float8, sum(e.energy_j * held.n / greatest(coalesce(nd.gpu_count, held.n), held.n))
  FROM run_win w
  JOIN (SELECT run_id, node, count(*) AS n FROM run_allocations GROUP BY 1, 2) held ON held.run_id = w.run_id
  LEFT JOIN nodes nd ON nd.node = held.node
  JOIN host_{table} e ON e.node = held.node AND e.bucket >= date_trunc('{unit}', w.t0) AND e.bucket < w.t1
  WHERE {cond}
  GROUP BY 1, 2, 3"""

    ends_after = f"coalesce(r.\"end\", 'infinity') > {RANGE_FROM}"
    return f"""run_win AS (
  SELECT r.run_id, r.name, r.team, r.site,
         (SELECT count(*) FROM run_allocations a WHERE a.run_id = r.run_id) AS gpus,
         {"r.start" if from_run_start else f"greatest(r.start, {RANGE_FROM})"} AS t0,
         least(coalesce(r."end", 'infinity'), {RANGE_TO}) AS t1
  FROM runs r
  WHERE r.start < {RANGE_TO} AND {"TRUE" if from_run_start else ends_after} AND {runs_where}
),
energy_parts AS ({energy("energy_1m", "minute", RANGE_IS_SHORT)}
  UNION ALL{energy("energy_1h", "hour", RANGE_IS_LONG)}
),
energy AS (
  SELECT run_id, site, bucket, sum(gpu_j) AS gpu_j, sum(host_j) AS host_j FROM energy_parts GROUP BY 1, 2, 3
),
priced AS (
  SELECT e.run_id, e.site, e.bucket, e.gpu_j, e.host_j,
         (e.gpu_j + e.host_j) / 3.6e6 AS it_kwh,
         (e.gpu_j + e.host_j) / 3.6e6 * coalesce(s.pue, 1) AS facility_kwh,
         (e.gpu_j + e.host_j) / 3.6e6 * coalesce(s.pue, 1) * coalesce(p.price, s.price_per_kwh, 0) AS energy_cost,
         (e.gpu_j + e.host_j) / 3.6e6 * coalesce(s.pue, 1) * coalesce(c.g, s.carbon_g_per_kwh, 0) / 1000.0 AS co2e_kg
  FROM energy e
  LEFT JOIN sites s ON s.site = e.site
  LEFT JOIN LATERAL (SELECT sp.price_per_kwh AS price FROM site_prices sp
                     WHERE sp.site = e.site AND sp.time <= e.bucket ORDER BY sp.time DESC LIMIT 1) p ON true
  LEFT JOIN LATERAL (SELECT ci.g_co2e_per_kwh AS g FROM carbon_intensity ci
                     WHERE ci.region = s.carbon_region AND ci.time <= e.bucket ORDER BY ci.time DESC LIMIT 1) c ON true
)"""


def tokens_in_window(run_col: str, t0: str, t1: str) -> str:
    """Tokens a run processed in ``[t0, t1]`` from its cumulative progress reports."""
    return (f"(coalesce((SELECT p.tokens FROM run_progress p WHERE p.run_id = {run_col} AND p.time <= {t1} "
            f"ORDER BY p.time DESC LIMIT 1), 0) - coalesce((SELECT p.tokens FROM run_progress p "
            f"WHERE p.run_id = {run_col} AND p.time <= {t0} ORDER BY p.time DESC LIMIT 1), 0))")
