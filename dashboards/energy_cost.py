"""Energy and cost: kWh, money and CO2e by site, team and run; tokens per joule.

Fleet-wide energy comes from the exact per-GPU energy rollups (every GPU,
allocated or not); per-run figures from :func:`gpufleet.dashboards.sql.run_energy_ctes`
(GPU energy of the run's allocation plus its share of host energy, times PUE,
priced and carbon-weighted per bucket).
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.fleet_overview import SITE_VAR
from gpufleet.dashboards.model import Board, bars, query_variable, stat, table, timeseries
from gpufleet.dashboards.sql import (
    RANGE_FROM,
    RANGE_TO,
    all_or,
    node_in_site,
    run_energy_ctes,
    tokens_in_window,
)
from gpufleet.dashboards.starvation import TEAM_VAR

UID = "gpufleet-energy"
#: Energy per time bucket switches from per-minute to hourly rollups at this interval.
HOURLY_FROM_MS = 3_600_000

RUN_VAR = query_variable(
    "run", "Run",
    f"""SELECT r.run_id FROM runs r
WHERE r.start < {RANGE_TO} AND coalesce(r."end", 'infinity') > {RANGE_FROM}
  AND {all_or("site", "r.site")} AND {all_or("team", "r.team")}
ORDER BY r.start DESC, 1""", description="Runs active in the range at the selected sites and teams.")

RUNS_WHERE = f'{all_or("site", "r.site")} AND {all_or("team", "r.team")} AND {all_or("run", "r.run_id")}'
CTES = run_energy_ctes(RUNS_WHERE)

TOTALS = f"""
WITH {CTES}
SELECT coalesce(sum(it_kwh), 0) AS "IT energy", coalesce(sum(facility_kwh), 0) AS "Facility energy",
       coalesce(sum(co2e_kg), 0) AS "CO2e"
FROM priced
"""

PER_RUN = f"""
WITH {CTES},
per_run AS (
  SELECT run_id, sum(gpu_j) AS gpu_j, sum(host_j) AS host_j, sum(it_kwh) AS it_kwh,
         sum(facility_kwh) AS facility_kwh, sum(energy_cost) AS energy_cost, sum(co2e_kg) AS co2e_kg
  FROM priced GROUP BY 1
)
SELECT w.run_id AS "Run", coalesce(w.name, '') AS "Name", coalesce(w.team, '') AS "Team",
       coalesce(w.site, '') AS "Site", w.gpus AS "GPUs",
       w.gpus * extract(epoch FROM w.t1 - w.t0) / 3600.0 AS "GPU-hours",
       coalesce(p.gpu_j, 0) / 3.6e6 AS "GPU kWh", coalesce(p.host_j, 0) / 3.6e6 AS "Host kWh",
       coalesce(p.facility_kwh, 0) AS "Facility kWh",
       coalesce(p.energy_cost, 0) AS "Energy cost",
       w.gpus * extract(epoch FROM w.t1 - w.t0) / 3600.0 * coalesce(s.gpu_hour_price, 0) AS "Compute cost",
       coalesce(p.energy_cost, 0)
         + w.gpus * extract(epoch FROM w.t1 - w.t0) / 3600.0 * coalesce(s.gpu_hour_price, 0) AS "Total cost",
       coalesce(s.currency, '') AS "Currency",
       coalesce(p.co2e_kg, 0) AS "CO2e kg",
       {tokens_in_window("w.run_id", "w.t0", "w.t1")} AS "Tokens",
       {tokens_in_window("w.run_id", "w.t0", "w.t1")} / nullif(p.gpu_j + p.host_j, 0) AS "Tokens per joule"
FROM run_win w LEFT JOIN per_run p ON p.run_id = w.run_id LEFT JOIN sites s ON s.site = w.site
ORDER BY "Total cost" DESC, 1
"""

COST_BY_CURRENCY = f"""
WITH {CTES},
per_run AS (SELECT run_id, sum(energy_cost) AS energy_cost FROM priced GROUP BY 1)
SELECT coalesce(s.currency, '?') AS "Currency",
       sum(coalesce(p.energy_cost, 0)) AS "Energy cost",
       sum(w.gpus * extract(epoch FROM w.t1 - w.t0) / 3600.0 * coalesce(s.gpu_hour_price, 0)) AS "Compute cost",
       sum(coalesce(p.energy_cost, 0)
           + w.gpus * extract(epoch FROM w.t1 - w.t0) / 3600.0 * coalesce(s.gpu_hour_price, 0)) AS "Total cost"
FROM run_win w LEFT JOIN per_run p ON p.run_id = w.run_id LEFT JOIN sites s ON s.site = w.site
GROUP BY 1
ORDER BY 1
"""

BY_TEAM = f"""
WITH {CTES}
SELECT coalesce(w.team, 'no team') AS "Team", sum(p.facility_kwh) AS "Facility kWh", sum(p.co2e_kg) AS "CO2e kg"
FROM priced p JOIN run_win w ON w.run_id = p.run_id
GROUP BY 1
ORDER BY 2 DESC
"""

_FLEET_ENERGY_WHERE = node_in_site("e.node")

FLEET_ENERGY_BY_SITE = f"""
SELECT * FROM (
  SELECT $__timeGroupAlias(e.bucket, $__interval), coalesce(n.site, 'no site') AS metric,
         sum(e.energy_j * coalesce(st.pue, 1)) / 3.6e6 AS value
  FROM gpu_energy_1m e LEFT JOIN nodes n ON n.node = e.node LEFT JOIN sites st ON st.site = n.site
  WHERE $__timeFilter(e.bucket) AND {_FLEET_ENERGY_WHERE}
  GROUP BY 1, 2
) AS per_minute WHERE $__interval_ms < {HOURLY_FROM_MS}
UNION ALL
SELECT * FROM (
  SELECT $__timeGroupAlias(e.bucket, $__interval), coalesce(n.site, 'no site') AS metric,
         sum(e.energy_j * coalesce(st.pue, 1)) / 3.6e6 AS value
  FROM gpu_energy_1h e LEFT JOIN nodes n ON n.node = e.node LEFT JOIN sites st ON st.site = n.site
  WHERE $__timeFilter(e.bucket) AND {_FLEET_ENERGY_WHERE}
  GROUP BY 1, 2
) AS per_hour WHERE $__interval_ms >= {HOURLY_FROM_MS}
ORDER BY 1, 2
"""

FLEET_KWH = f"""
SELECT coalesce(sum(e.energy_j), 0) / 3.6e6 AS "GPU energy, all GPUs",
       coalesce(sum(e.energy_j * coalesce(st.pue, 1)), 0) / 3.6e6 AS "x PUE"
FROM gpu_energy_1m e LEFT JOIN nodes n ON n.node = e.node LEFT JOIN sites st ON st.site = n.site
WHERE $__timeFilter(e.bucket) AND {_FLEET_ENERGY_WHERE}
"""

CARBON = f"""
SELECT c.time AS "time", c.region AS metric, c.g_co2e_per_kwh AS value
FROM carbon_intensity c
WHERE c.time BETWEEN {RANGE_FROM} - interval '1 day' AND {RANGE_TO}
  AND c.region IN (SELECT carbon_region FROM sites WHERE {all_or("site", "site")})
ORDER BY 1, 2
"""

TOKENS_PER_JOULE = f"""
WITH {CTES},
minute_tokens AS (
  SELECT p.run_id, date_trunc('minute', p.time) AS bucket,
         sum(greatest(p.tokens - p.prev, 0)) AS tokens
  FROM (SELECT q.run_id, q.time, q.tokens, lag(q.tokens) OVER (PARTITION BY q.run_id ORDER BY q.time) AS prev
        FROM run_progress q JOIN run_win w ON w.run_id = q.run_id
        WHERE q.time BETWEEN {RANGE_FROM} - interval '10 minutes' AND {RANGE_TO}) AS p
  WHERE p.prev IS NOT NULL
  GROUP BY 1, 2
)
SELECT $__timeGroupAlias(pr.bucket, $__interval), pr.run_id AS metric,
       sum(coalesce(mt.tokens, 0)) / nullif(sum(pr.gpu_j + pr.host_j), 0) AS value
FROM priced pr LEFT JOIN minute_tokens mt ON mt.run_id = pr.run_id AND mt.bucket = pr.bucket
WHERE pr.run_id IN (SELECT run_id FROM run_progress)
GROUP BY 1, 2
ORDER BY 1, 2
"""


#: The power-cap advisor's view (gpufleet.advisor.power_cap) at minute resolution: per model, GPU model
#: and power limit, tokens per joule and per second per GPU, over minutes where every GPU of a run ran
#: at one limit.  Tokens count in the minute of the report that brought them; the API's
#: /v1/advisor/power-cap interpolates and names its advice.
POWER_CAP = """
WITH m AS (
  SELECT a.run_id, st.bucket, min(st.power_limit_w) AS lo, max(st.power_limit_w) AS hi, count(*) AS gpus,
         sum(e.energy_j) AS joules, min(coalesce(n.facts->>'gpu_model', n.facts->'gpus'->0->>'name', '')) AS gpu_model
  FROM run_allocations a
  JOIN gpu_stats_1m st ON st.node = a.node AND st.gpu = a.gpu
  JOIN gpu_energy_1m e ON e.node = st.node AND e.gpu = st.gpu AND e.bucket = st.bucket
  LEFT JOIN nodes n ON n.node = a.node
  WHERE $__timeFilter(st.bucket) AND a.run_id IN (SELECT DISTINCT run_id FROM run_progress WHERE tokens IS NOT NULL)
  GROUP BY 1, 2
), p AS (
  SELECT q.run_id, date_trunc('minute', q.time) AS bucket, sum(greatest(q.tokens - q.prev, 0)) AS tokens
  FROM (SELECT run_id, time, tokens, lag(tokens) OVER (PARTITION BY run_id ORDER BY time) AS prev
        FROM run_progress
        WHERE tokens IS NOT NULL AND time BETWEEN $__timeFrom()::timestamptz - interval '10 minutes'
                                               AND $__timeTo()::timestamptz) q
  WHERE q.prev IS NOT NULL
  GROUP BY 1, 2
)
SELECT coalesce(r.labels->>'model', r.name, r.run_id) AS "Model", m.gpu_model AS "GPU model",
       round(m.lo::numeric) AS "Power limit", count(DISTINCT m.run_id) AS "Runs", count(*) AS "Minutes",
       sum(coalesce(p.tokens, 0)) / nullif(sum(m.joules), 0) AS "Tokens per joule",
       sum(coalesce(p.tokens, 0)) / nullif(sum(m.gpus) * 60.0, 0) AS "Tokens/s per GPU",
       sum(m.joules) / nullif(sum(m.gpus) * 60.0, 0) AS "Power per GPU"
FROM m JOIN runs r ON r.run_id = m.run_id
LEFT JOIN p ON p.run_id = m.run_id AND p.bucket = m.bucket
WHERE m.hi - m.lo <= 0.5
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3 DESC
"""


def build() -> dict[str, Any]:
    b = Board(UID, "gpufleet / Energy and cost",
              "kWh, cost and CO2e by site, team and run over the range; carbon intensity; tokens per joule.",
              time_from="now-24h", refresh="5m")
    b.variables += [SITE_VAR, TEAM_VAR, RUN_VAR]
    b.add(stat("Runs in range", TOTALS,
               "Energy of the selected runs inside the range: GPU + host share (IT), times PUE (facility); "
               "CO2e with the carbon intensity in force each minute.", w=12, decimals=2),
          stat("Fleet", FLEET_KWH, "Energy of every GPU at the selected sites, allocated or not.", "kwatth",
               w=12, decimals=2))
    for name, unit in (("IT energy", "kwatth"), ("Facility energy", "kwatth"), ("CO2e", "masskg")):
        b.panels[0]["fieldConfig"]["overrides"].append(
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]})
    b.add(table("Runs", PER_RUN,
                "Per run, inside the range: GPU-hours, energy, cost (energy at the time-of-use price, compute at "
                "the site's GPU-hour price), CO2e and tokens per joule (GPU + host energy). Minute resolution; "
                "the API's /v1/runs/<run>/accounting is exact.", h=10, sort_by="Total cost",
                units={"GPU kWh": "kwatth", "Host kWh": "kwatth", "Facility kWh": "kwatth", "CO2e kg": "masskg",
                       "GPU-hours": "none", "Tokens": "short"}))
    b.add(table("Cost by currency", COST_BY_CURRENCY, "Costs of the selected runs, per site currency.", w=8,
                h=8),
          bars("Energy and CO2e by team", BY_TEAM, "Facility kWh and kg CO2e of the selected runs by team.",
               None, w=16, h=8))
    b.add(timeseries("Facility energy by site", FLEET_ENERGY_BY_SITE,
                     "All GPUs' energy x PUE per interval (hourly rollups for intervals of an hour or more).",
                     "kwatth", stack=True, w=12, draw="bars", fill=70),
          timeseries("Carbon intensity", CARBON, "The step series of each selected site's grid region.",
                     "none", w=12, fill=0),
          timeseries("Tokens per joule", TOKENS_PER_JOULE,
                     "Tokens processed per joule (GPU + host share) of each run that reports progress.",
                     "short", w=24, fill=0))
    b.panels[-2]["fieldConfig"]["defaults"]["custom"]["lineInterpolation"] = "stepAfter"
    b.add(table("Power limit vs tokens per joule", POWER_CAP,
                "Per model, GPU model and enforced power limit: tokens per joule of GPU energy and tokens per "
                "second per GPU, over the minutes every GPU of a run ran at that limit. A lower limit that keeps "
                "most of the throughput and raises tokens per joule is energy saved; GET /v1/advisor/power-cap "
                "names the limit within a throughput budget, with the points used (or says the data is too thin).",
                h=8, units={"Power limit": "watt", "Power per GPU": "watt", "Tokens per joule": "short",
                            "Tokens/s per GPU": "short"}))
    return b.to_json()
