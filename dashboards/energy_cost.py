"""Energy and cost: kWh, money and CO2e by site, team and run; tokens per joule.

Every figure comes from ``gpufleet_accounting`` (:func:`gpufleet.dashboards.sql.accounting`),
the database function the API's ``/v1/accounting``, ``/v1/runs/{id}/accounting``
and the finance report read: the board shows exactly the API's numbers, per run,
per team, per currency, for GPU time no run held and for the whole fleet, and
its time series are the same accounting per step of the range.
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.fleet_overview import SITE_VAR
from gpufleet.dashboards.model import Board, bars, query_variable, stat, table, timeseries
from gpufleet.dashboards.sql import (
    RANGE_FROM,
    RANGE_TO,
    STEP,
    accounting,
    all_or,
    tokens_in_window,
)
from gpufleet.dashboards.starvation import TEAM_VAR
from gpufleet.waste import PRECEDENCE, STATES

UID = "gpufleet-energy"

RUN_VAR = query_variable(
    "run",
    "Run",
    f"""SELECT r.run_id FROM runs r
WHERE r.start < {RANGE_TO} AND coalesce(r."end", 'infinity') > {RANGE_FROM}
  AND {all_or("site", "r.site")} AND {all_or("team", "r.team")}
ORDER BY r.start DESC, 1""",
    description="Runs active in the range at the selected sites and teams.",
)

RUNS_WHERE = f"{all_or('site', 'r.site')} AND {all_or('team', 'r.team')} AND {all_or('run', 'r.run_id')}"
#: The selected runs' accounting lines, ``a``, with their run ``r``.
RUN_LINES = f"{accounting()} a JOIN runs r ON r.run_id = a.run_id WHERE a.line = 'run' AND {RUNS_WHERE}"
#: The fleet's lines at the selected sites (unallocated and total are per pricing site).
FLEET_LINES = (
    f"{accounting(fleet=True)} a WHERE a.line IN ('unallocated', 'total') AND {all_or('site', 'a.site')}"
)

TOTALS = f"""
SELECT coalesce(sum(a.it_kwh), 0) AS "IT energy", coalesce(sum(a.facility_kwh), 0) AS "Facility energy",
       coalesce(sum(a.co2e_kg), 0) AS "CO2e"
FROM {RUN_LINES}
"""

PER_RUN = f"""
SELECT a.run_id AS "Run", coalesce(r.name, '') AS "Name", coalesce(r.team, '') AS "Team",
       coalesce(r.site, '') AS "Site", a.gpu_count AS "GPUs", a.gpu_hours AS "GPU-hours",
       a.gpu_kwh AS "GPU kWh", a.host_kwh AS "Host kWh", a.pue AS "PUE", a.facility_kwh AS "Facility kWh",
       a.energy_cost AS "Energy cost", a.compute_cost AS "Compute cost", a.total_cost AS "Total cost",
       coalesce(a.currency, '') AS "Currency",
       CASE WHEN a.carbon_source = 'none' THEN NULL ELSE a.co2e_kg END AS "CO2e kg",
       a.coverage AS "Coverage",
       {tokens_in_window("a.run_id", "a.part_start", "a.part_end")} AS "Tokens",
       {tokens_in_window("a.run_id", "a.part_start", "a.part_end")} / nullif(a.it_kwh * 3.6e6, 0)
         AS "Tokens per joule"
FROM {RUN_LINES}
ORDER BY "Total cost" DESC, 1
"""

COST_BY_CURRENCY = f"""
SELECT coalesce(a.currency, '?') AS "Currency", sum(a.energy_cost) AS "Energy cost",
       sum(a.compute_cost) AS "Compute cost", sum(a.total_cost) AS "Total cost"
FROM {RUN_LINES}
GROUP BY 1
ORDER BY 1
"""

BY_TEAM = f"""
SELECT coalesce(r.team, 'no team') AS "Team", sum(a.facility_kwh) AS "Facility kWh", sum(a.co2e_kg) AS "CO2e kg"
FROM {RUN_LINES}
GROUP BY 1
ORDER BY 2 DESC
"""

#: The selected runs' ledgers (``gpufleet_ledger``, the SQL twin of the API's ``ledger``): one row per run
#: and state, clipped to the range as the runs' accounting lines are.
LEDGER = (
    f"gpufleet_ledger({RANGE_FROM}, {RANGE_TO}, now(), ARRAY(SELECT r.run_id FROM runs r "
    f"WHERE r.start < {RANGE_TO} AND coalesce(r.\"end\", 'infinity') > {RANGE_FROM} AND {RUNS_WHERE}), "
    "60, 'auto')"
)
STATE_LABELS = {
    "productive": "Productive",
    "idle": "Idle",
    "hung": "Hung",
    "starved": "Starved",
    "checkpoint": "Checkpoint",
    "straggler_wait": "Straggler wait",
    "throttled": "Throttled",
}
_WASTE = "l.state <> 'productive'"
_PER_STATE = ",\n       ".join(
    f"coalesce(sum(l.gpu_hours) FILTER (WHERE l.state = '{s}'), 0) AS \"{STATE_LABELS[s]} GPU-hours\""
    for s in PRECEDENCE
)
_ORDER = "CASE l.state " + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(STATES)) + " END"

WASTE_TOTALS = f"""
SELECT coalesce(sum(l.gpu_hours) FILTER (WHERE {_WASTE}), 0) AS "Wasted GPU-hours",
       coalesce(sum(l.gpu_hours) FILTER (WHERE {_WASTE}) / nullif(sum(l.gpu_hours), 0), 0) AS "Waste share"
FROM {LEDGER} l
"""

BY_STATE = f"""
SELECT min(CASE l.state {" ".join(f"WHEN '{s}' THEN '{STATE_LABELS[s]}'" for s in STATES)} END) AS "State",
       sum(l.gpu_hours) AS "GPU-hours", sum(l.facility_kwh) AS "Facility kWh"
FROM {LEDGER} l
GROUP BY l.state
ORDER BY min({_ORDER})
"""

WASTE_PER_RUN = f"""
SELECT l.run_id AS "Run", coalesce(r.team, '') AS "Team", coalesce(r.site, '') AS "Site",
       sum(l.gpu_hours) AS "GPU-hours", coalesce(sum(l.gpu_hours) FILTER (WHERE {_WASTE}), 0) AS "Wasted GPU-hours",
       coalesce(sum(l.gpu_hours) FILTER (WHERE {_WASTE}) / nullif(sum(l.gpu_hours), 0), 0) AS "Waste share",
       {_PER_STATE},
       coalesce(sum(l.total_cost) FILTER (WHERE {_WASTE}), 0) AS "Waste cost", coalesce(min(l.currency), '') AS "Currency"
FROM {LEDGER} l JOIN runs r ON r.run_id = l.run_id
GROUP BY 1, 2, 3
ORDER BY "Wasted GPU-hours" DESC, 1
"""

WASTE_BY_TEAM = f"""
SELECT coalesce(r.team, 'no team') AS "Team",
       {_PER_STATE}
FROM {LEDGER} l JOIN runs r ON r.run_id = l.run_id
GROUP BY 1
ORDER BY sum(l.gpu_hours) FILTER (WHERE {_WASTE}) DESC NULLS LAST, 1
"""

FLEET = f"""
SELECT coalesce(sum(a.gpu_kwh) FILTER (WHERE a.line = 'total'), 0) AS "GPU energy, all GPUs",
       coalesce(sum(a.facility_kwh) FILTER (WHERE a.line = 'total'), 0) AS "Facility energy, all GPUs",
       coalesce(sum(a.facility_kwh) FILTER (WHERE a.line = 'unallocated'), 0) AS "Facility energy, no run",
       coalesce(sum(a.covered_hours) FILTER (WHERE a.line = 'unallocated'), 0) AS "GPU-hours, no run",
       coalesce(sum(a.gpu_hours - a.covered_hours) FILTER (WHERE a.line = 'unallocated'), 0)
         AS "GPU-hours, no telemetry"
FROM {FLEET_LINES}
"""

FLEET_ENERGY_BY_SITE = f"""
SELECT a.part_start AS "time", coalesce(a.site, 'no site') AS metric, sum(a.facility_kwh) AS value
FROM {accounting(fleet=True, detail="step", step=STEP)} a
WHERE a.line = 'total' AND {all_or("site", "a.site")}
GROUP BY 1, 2
ORDER BY 1, 2
"""

CARBON = f"""
SELECT c.time AS "time", c.region AS metric, c.g_co2e_per_kwh AS value
FROM carbon_intensity c
WHERE c.time BETWEEN {RANGE_FROM} - interval '1 day' AND {RANGE_TO}
  AND c.region IN (SELECT s.txt FROM site_settings s WHERE s.setting = 'carbon_region' AND {all_or("site", "s.site")})
ORDER BY 1, 2
"""

TOKENS_PER_JOULE = f"""
SELECT a.part_start AS "time", a.run_id AS metric,
       {tokens_in_window("a.run_id", "a.part_start", "a.part_end")} / nullif(a.it_kwh * 3.6e6, 0) AS value
FROM {accounting(detail="step", step=STEP)} a JOIN runs r ON r.run_id = a.run_id
WHERE a.line = 'run' AND {RUNS_WHERE} AND a.run_id IN (SELECT run_id FROM run_progress)
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
    b = Board(
        UID,
        "gpufleet / Energy and cost",
        "kWh, cost and CO2e by site, team and run over the range, exactly as the API accounts them; GPU "
        "time no run held; carbon intensity; tokens per joule.",
        time_from="now-24h",
        refresh="5m",
    )
    b.variables += [SITE_VAR, TEAM_VAR, RUN_VAR]
    b.add(
        stat(
            "Runs in range",
            TOTALS,
            "Energy of the selected runs inside the range: GPU + host share (IT), times the PUE in force "
            "(facility); CO2e with the carbon intensity in force. The API's /v1/accounting figures.",
            w=12,
            decimals=2,
        ),
        stat(
            "Fleet",
            FLEET,
            "Every GPU at the selected sites, allocated or not; GPU time no run held, with "
            "and without telemetry.",
            "kwatth",
            w=12,
            decimals=2,
        ),
    )
    for name, unit in (("IT energy", "kwatth"), ("Facility energy", "kwatth"), ("CO2e", "masskg")):
        b.panels[0]["fieldConfig"]["overrides"].append(
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        )
    for name in ("GPU-hours, no run", "GPU-hours, no telemetry"):
        b.panels[1]["fieldConfig"]["overrides"].append(
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": "none"}]}
        )
    b.add(
        table(
            "Runs",
            PER_RUN,
            "Per run, inside the range: GPU-hours, energy, cost (energy at the price in force, compute at the "
            "GPU-hour price in force for each GPU model), CO2e, coverage and tokens per joule (GPU + host "
            "energy). The same numbers as GET /v1/runs/<run>/accounting?from=&to=.",
            h=10,
            sort_by="Total cost",
            units={
                "GPU kWh": "kwatth",
                "Host kWh": "kwatth",
                "Facility kWh": "kwatth",
                "CO2e kg": "masskg",
                "GPU-hours": "none",
                "Tokens": "short",
                "Coverage": "percentunit",
                "PUE": "none",
            },
        )
    )
    b.add(
        stat(
            "Waste",
            WASTE_TOTALS,
            "GPU-hours of the selected runs their ledgers put in a state other than productive (idle, hung, "
            "checkpoint, starved, straggler wait, throttled), and their share of the runs' GPU-hours: "
            "GET /v1/runs/<run>/accounting's ledger.",
            w=8,
            decimals=2,
        ),
        bars(
            "Where the GPU-hours went",
            BY_STATE,
            "The selected runs' GPU-hours by ledger state: each GPU-second in one state, the most specific "
            "explanation first (the API's ledger).",
            None,
            w=16,
            h=8,
        ),
    )
    b.panels[-2]["fieldConfig"]["overrides"].append(
        {
            "matcher": {"id": "byName", "options": "Waste share"},
            "properties": [{"id": "unit", "value": "percentunit"}],
        }
    )
    b.add(
        table(
            "Runs that wasted most",
            WASTE_PER_RUN,
            "Per run, inside the range: GPU-hours by ledger state and what the waste (every state but "
            "productive) cost at the run's prices. The same numbers as GET /v1/runs/<run>/accounting?from=&to= "
            "(ledger); the web view's Waste page ranks them too.",
            h=10,
            sort_by="Wasted GPU-hours",
            units={
                "Waste share": "percentunit",
                "GPU-hours": "none",
                "Wasted GPU-hours": "none",
                **{f"{STATE_LABELS[s]} GPU-hours": "none" for s in PRECEDENCE},
            },
        ),
        bars(
            "Waste by team",
            WASTE_BY_TEAM,
            "Wasted GPU-hours of the selected runs by team and ledger state.",
            None,
            w=24,
            h=8,
        ),
    )
    b.add(
        table(
            "Cost by currency", COST_BY_CURRENCY, "Costs of the selected runs, per site currency.", w=8, h=8
        ),
        bars(
            "Energy and CO2e by team",
            BY_TEAM,
            "Facility kWh and kg CO2e of the selected runs by team.",
            None,
            w=16,
            h=8,
        ),
    )
    b.add(
        timeseries(
            "Facility energy by site",
            FLEET_ENERGY_BY_SITE,
            "All GPUs' and hosts' facility energy per step (an hour at least), priced at the site that "
            "paid for it.",
            "kwatth",
            stack=True,
            w=12,
            draw="bars",
            fill=70,
        ),
        timeseries(
            "Carbon intensity",
            CARBON,
            "The step series of each selected site's grid region.",
            "none",
            w=12,
            fill=0,
        ),
        timeseries(
            "Tokens per joule",
            TOKENS_PER_JOULE,
            "Tokens processed per joule (GPU + host share) of each run that reports progress, per step.",
            "short",
            w=24,
            fill=0,
        ),
    )
    b.panels[-2]["fieldConfig"]["defaults"]["custom"]["lineInterpolation"] = "stepAfter"
    b.add(
        table(
            "Power limit vs tokens per joule",
            POWER_CAP,
            "Per model, GPU model and enforced power limit: tokens per joule of GPU energy and tokens per "
            "second per GPU, over the minutes every GPU of a run ran at that limit. A lower limit that keeps "
            "most of the throughput and raises tokens per joule is energy saved; GET /v1/advisor/power-cap "
            "names the limit within a throughput budget, with the points used (or says the data is too thin).",
            h=8,
            units={
                "Power limit": "watt",
                "Power per GPU": "watt",
                "Tokens per joule": "short",
                "Tokens/s per GPU": "short",
            },
        )
    )
    return b.to_json()
