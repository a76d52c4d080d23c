"""Fleet overview: what the GPUs are doing, what they draw, and what is wrong right now.

"Now" is the end of the dashboard's range, so the same board answers "what
was the fleet doing yesterday at 3 pm" by moving the range.
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.model import (
    Board,
    bars,
    heatmap,
    query_variable,
    sql_annotation,
    stat,
    table,
    timeseries,
)
from gpufleet.dashboards.sql import (
    HOURS_FROM_MS,
    RANGE_FROM,
    RANGE_TO,
    accounting,
    all_or,
    incident_in_site,
    interval_bin,
    minutes_or_hours,
    node_in_site,
    open_at,
)
from gpufleet.db.energy_sql import ORIGIN
from gpufleet.store.gpu_states import BUSY_UTIL_PCT, gpu_states_at

UID = "gpufleet-fleet"

SITE_VAR = query_variable(
    "site",
    "Site",
    "SELECT site FROM sites ORDER BY 1",
    refresh=1,
    description="Sites from the sites table; All includes nodes without a site.",
)

#: Busy, starved and idle GPUs at the end of the range, by the one definition the web view counts with.
GPU_STATES_NOW = f"""
SELECT count(*) FILTER (WHERE g.state = 'busy') AS "Busy",
       count(*) FILTER (WHERE g.state = 'starved') AS "Starved",
       count(*) FILTER (WHERE g.state = 'idle') AS "Idle",
       count(*) AS "Reporting"
FROM ({gpu_states_at(RANGE_TO, "interval '2 minutes'", node_in_site("s.node"))}) g
"""

#: Per stored bucket (a minute, or an hour): the fleet's GPU-minutes, busy ones, and the minutes it
#: reported (the most any node did in an hour row).
_FLEET_STATES = minutes_or_hours(
    f"""SELECT a.bucket, max(a.minutes)::float8 AS minutes, sum(a.gpu_minutes) AS gpu_minutes,
       sum(a.busy_minutes) AS busy_minutes
FROM node_activity_1m a
WHERE $__timeFilter(a.bucket) AND {node_in_site("a.node")}
GROUP BY 1"""
)

#: GPUs per state in each interval, averaged over its minutes: each GPU-minute is busy or idle by the
#: minute's mean GPU-Util, and starved instead while a starvation incident of a run holding the GPU is
#: open at the minute's start.  Busy and idle GPU-minutes come from node_activity (one row a node, not a
#: GPU: the per-GPU form took 41 s at 6 h on 10,000 GPUs, ``bench/read_side.py``); only the starved
#: GPU-minutes are read per GPU, from gpu_stats_1m, to move them out of busy or idle, grouped by the
#: hour where the rows are hours.  Each starved allocation's minutes are read through the
#: (node, gpu, bucket) key: ``OFFSET 0`` keeps the planner from scanning every GPU-minute of the range.
GPU_STATES_OVER_TIME = f"""
WITH act AS (
{_FLEET_STATES}
), starved AS (
  SELECT DISTINCT
    CASE WHEN $__interval_ms >= {HOURS_FROM_MS} THEN date_bin(interval '1 hour', s.bucket, {ORIGIN}) ELSE s.bucket END
      AS at,
    s.bucket, a.node, a.gpu, s.busy
  FROM incidents i JOIN run_allocations a ON a.run_id = i.run_id
  CROSS JOIN LATERAL (
    SELECT r.bucket, coalesce(r.util_pct, 0) >= {BUSY_UTIL_PCT} AS busy
    FROM gpu_stats_1m r
    WHERE r.node = a.node AND r.gpu = a.gpu AND r.bucket >= greatest(i.start, {RANGE_FROM} - interval '1 hour')
      AND r.bucket < coalesce(i."end", 'infinity') AND r.bucket <= {RANGE_TO}
    OFFSET 0
  ) s
  WHERE i.kind = 'starvation' AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
    AND {node_in_site("a.node")}
), starved_at AS (
  SELECT at, count(*) AS starved, count(*) FILTER (WHERE busy) AS starved_busy
  FROM starved
  GROUP BY 1
)
SELECT $__timeGroup(a.bucket, $__interval) AS "time",
       sum(greatest(a.busy_minutes - coalesce(x.starved_busy, 0), 0)) / sum(a.minutes) AS "busy",
       sum(coalesce(x.starved, 0)) / sum(a.minutes) AS "starved",
       sum(greatest(a.gpu_minutes - a.busy_minutes - coalesce(x.starved - x.starved_busy, 0), 0))
         / sum(a.minutes) AS "idle"
FROM act a LEFT JOIN starved_at x ON x.at = a.bucket
GROUP BY 1
ORDER BY 1
"""

_SITE_POWER = minutes_or_hours(
    f"""SELECT a.bucket, coalesce(n.site, 'no site') AS site, sum(a.power_w) AS watts,
       max(a.minutes)::float8 AS minutes
FROM node_activity_1m a LEFT JOIN nodes n ON n.node = a.node
WHERE $__timeFilter(a.bucket) AND {node_in_site("a.node")}
GROUP BY 1, 2"""
)

#: Each site's GPU power averaged over the interval's minutes: the site's summed GPU-minute power over
#: the minutes it reported.
POWER_BY_SITE = f"""
SELECT $__timeGroup(bucket, $__interval) AS "time", site AS metric, sum(watts) / sum(minutes) AS value
FROM (
{_SITE_POWER}
) AS per_site
GROUP BY 1, 2
ORDER BY 1, 2
"""

ENERGY_TODAY = f"""
SELECT coalesce(sum(a.gpu_kwh), 0) AS "GPU energy today",
       coalesce(sum(a.facility_kwh), 0) AS "Facility energy today"
FROM {accounting(fleet=True, since=f"date_trunc('day', {RANGE_TO}, 'UTC')")} a
WHERE a.line = 'total' AND {all_or("site", "a.site")}
"""

POWER_NOW = f"""
SELECT sum(p.power_w) / 1000.0 AS "GPU power now"
FROM (
  SELECT DISTINCT ON (s.node, s.gpu) s.power_w
  FROM gpu_samples s
  WHERE s.time BETWEEN {RANGE_TO} - interval '2 minutes' AND {RANGE_TO}
    AND s.mig_instance IS NULL AND {node_in_site("s.node")}
  ORDER BY s.node, s.gpu, s.time DESC
) AS p
"""

OPEN_BY_KIND = f"""
SELECT i.kind AS "Kind", count(*) AS "Open incidents"
FROM incidents i
WHERE {open_at(RANGE_TO)} AND {incident_in_site()}
GROUP BY 1
ORDER BY 2 DESC, 1
"""

_STEP_S = "(greatest($__interval_ms, 1000) / 1000.0)"

#: Incidents open at each step (start <= t < end), by kind, as one sweep: each incident of the range
#: adds one at the first step at or after its start and takes it away at the first step at or after its
#: end, and a running sum per kind counts them.  A join of every step with every incident open at it
#: compared 1,000 steps with each incident of the table: 1.1 to 1.9 s on 70,000 incidents.
OPEN_OVER_TIME = f"""
WITH steps AS (
  SELECT t, (row_number() OVER (ORDER BY t)) - 1 AS k
  FROM generate_series({RANGE_FROM}, {RANGE_TO}, make_interval(secs => {_STEP_S})) AS t
), shown AS (
  SELECT i.kind, i.start, i."end"
  FROM incidents i
  WHERE i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') > {RANGE_FROM} AND {incident_in_site()}
), moves AS (
  SELECT kind, greatest(ceil(extract(epoch FROM start - {RANGE_FROM}) / {_STEP_S}), 0) AS k, 1 AS d FROM shown
  UNION ALL
  SELECT kind, ceil(extract(epoch FROM "end" - {RANGE_FROM}) / {_STEP_S}), -1 FROM shown WHERE "end" IS NOT NULL
), per_step AS (
  SELECT kind, k, sum(d) AS d FROM moves GROUP BY 1, 2
), running AS (
  SELECT s.t, kd.kind, sum(coalesce(p.d, 0)) OVER (PARTITION BY kd.kind ORDER BY s.k) AS open
  FROM steps s CROSS JOIN (SELECT DISTINCT kind FROM per_step) kd
  LEFT JOIN per_step p ON p.kind = kd.kind AND p.k = s.k
)
SELECT t AS "time", kind AS metric, open AS value
FROM running
WHERE open > 0
ORDER BY 1, 2
"""

OPEN_INCIDENTS = f"""
SELECT i.kind AS "Kind", i.severity AS "Severity", i.run_id AS "Run", i.node AS "Node", i.gpu AS "GPU",
       i.cause AS "Cause", i.start AS "Since",
       extract(epoch FROM {RANGE_TO} - i.start) AS "Open for",
       i.evidence::text AS "Evidence"
FROM incidents i
WHERE {open_at(RANGE_TO)} AND {incident_in_site()}
ORDER BY CASE i.severity WHEN 'critical' THEN 0 ELSE 1 END, i.start
"""

NODES = f"""
SELECT n.node AS "Node", n.site AS "Site", n.gpu_count AS "GPUs",
       n.last_seen AS "Last batch received",
       extract(epoch FROM now() - n.last_seen) AS "Silent for",
       n.rejected_skew AS "Samples refused (clock skew)"
FROM nodes n
WHERE {node_in_site("n.node")}
ORDER BY n.node
"""

UTIL_BY_NODE = (
    minutes_or_hours(
        f"""SELECT {interval_bin("a.bucket")} AS "time", a.node AS metric,
       sum(a.util_sum) / nullif(sum(a.util_samples), 0) AS value
FROM node_activity_1m a
WHERE $__timeFilter(a.bucket) AND {node_in_site("a.node")}
GROUP BY 1, 2"""
    )
    + "\nORDER BY 1, 2"
)

ACTIVITY = (
    minutes_or_hours(
        f"""SELECT {interval_bin("a.bucket")} AS "time",
       sum(a.util_sum) / nullif(sum(a.util_samples), 0) AS "GPU-Util",
       sum(a.sm_sum) / nullif(sum(a.sm_samples), 0) * 100 AS "SM active",
       sum(a.tensor_sum) / nullif(sum(a.tensor_samples), 0) * 100 AS "Tensor active"
FROM node_activity_1m a
WHERE $__timeFilter(a.bucket) AND {node_in_site("a.node")}
GROUP BY 1"""
    )
    + "\nORDER BY 1"
)

INCIDENT_ANNOTATIONS = f"""
SELECT i.start AS "time", coalesce(i."end", i.last_seen) AS "timeend",
       i.kind || coalesce(' (' || i.cause || ')', '') || ' on ' || coalesce(i.run_id, '') ||
       coalesce(' ' || i.node || '/' || i.gpu, '') AS "text",
       i.kind || ',' || i.severity AS "tags"
FROM incidents i
WHERE i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM} AND i.severity = 'critical'
  AND {incident_in_site()}
ORDER BY 1
"""


#: Hardware health over the range: NVLink, memory and bus incidents, and repeated XIDs, worst first.
HEALTH_INCIDENTS = f"""
SELECT i.node AS "Node", i.gpu AS "GPU", i.kind AS "Kind", i.cause AS "Cause", i.severity AS "Severity",
       i.state AS "State", i.start AS "Since",
       coalesce(i.evidence->>'links_down', i.evidence->>'errors_per_min', i.evidence->>'sbe_per_h',
                i.evidence->>'pcie_replays_per_min', i.evidence->>'dbe_errors',
                i.evidence->>'xid_codes', '') AS "Figure",
       jsonb_array_length(CASE WHEN jsonb_typeof(i.actions) = 'array' THEN i.actions ELSE '[]' END)
         AS "Quarantine actions"
FROM incidents i
WHERE (i.kind IN ('nvlink_degraded', 'gpu_health') OR (i.kind = 'host_misconfig' AND i.cause = 'repeated_xid'))
  AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM} AND {incident_in_site()}
ORDER BY (i.state = 'open') DESC, CASE i.severity WHEN 'critical' THEN 0 ELSE 1 END, i.start DESC
"""


def build() -> dict[str, Any]:
    b = Board(
        UID,
        "gpufleet / Fleet overview",
        "GPUs busy, idle and starved; power and energy; open incidents. 'Now' is the end of the range.",
    )
    b.variables.append(SITE_VAR)
    b.annotations.append(sql_annotation("Critical incidents", INCIDENT_ANNOTATIONS))
    b.row("Now")
    b.add(
        stat(
            "GPUs",
            GPU_STATES_NOW,
            f"GPUs reporting in the last 2 minutes of the range: busy (GPU-Util >= {BUSY_UTIL_PCT:g} %), "
            "starved (held by a run with an open starvation incident) or idle.",
            w=10,
            color_mode="none",
        ),
        stat(
            "Power now",
            POWER_NOW,
            "Board power of every reporting GPU, latest sample in the last 2 minutes.",
            "kwatt",
            w=4,
            decimals=1,
        ),
        stat(
            "Energy today",
            ENERGY_TODAY,
            "Energy of every GPU (and host) since 00:00 UTC of the range's end day, as the API accounts it; "
            "facility energy applies the PUE in force at each site.",
            "kwatth",
            w=10,
            decimals=1,
        ),
    )
    b.add(
        bars(
            "Open incidents by kind",
            OPEN_BY_KIND,
            "Incidents open at the end of the range.",
            "none",
            w=8,
            h=8,
        ),
        table(
            "Open incidents",
            OPEN_INCIDENTS,
            "Open at the end of the range, critical first.",
            w=16,
            h=8,
            units={"Open for": "s", "Since": "dateTimeAsIso"},
        ),
    )
    b.add(
        table(
            "GPU hardware health",
            HEALTH_INCIDENTS,
            "NVLink degradation (links down, collectives over PCIe, link errors), GPU memory and bus health "
            "(uncorrectable ECC, row remaps, correctable-error storms, PCIe replays) and repeated XIDs over "
            "the range, open and critical first; the figure is the incident's headline number, the "
            "incident's evidence has the rest and decodes the XIDs. Quarantine actions: drains or cordons "
            "recorded on it.",
            h=8,
            units={"Since": "dateTimeAsIso"},
        )
    )
    b.row("Over time")
    b.add(
        timeseries(
            "GPU states",
            GPU_STATES_OVER_TIME,
            "GPUs per state, averaged over the minutes of each interval: a GPU-minute is busy at or above "
            f"{BUSY_UTIL_PCT:g} % mean GPU-Util, starved while a run holding the GPU has a starvation "
            "incident open at the minute's start, else idle. Minutes at most; hours from 10-minute intervals.",
            "none",
            stack=True,
            w=12,
            min_interval="1m",
        ),
        timeseries(
            "GPU power by site",
            POWER_BY_SITE,
            "Board power of the site's GPUs, averaged over the minutes of the interval the site reported. "
            "Minutes at most; hours from 10-minute intervals.",
            "watt",
            stack=True,
            w=12,
            min_interval="1m",
        ),
        timeseries(
            "Fleet activity",
            ACTIVITY,
            "Average GPU-Util and DCGM SM / tensor activity over every sample of every reporting GPU. "
            "Minutes at most; hours from 10-minute intervals.",
            "percent",
            w=12,
            fill=0,
            min_interval="1m",
        ),
        timeseries(
            "Open incidents",
            OPEN_OVER_TIME,
            "Incidents open at each step, by kind.",
            "none",
            stack=True,
            w=12,
            draw="bars",
            fill=60,
        ),
        heatmap(
            "GPU-Util by node",
            UTIL_BY_NODE,
            "Average GPU-Util of each node's GPUs over their samples, in at most 200 intervals of the range "
            "(2 minutes at 6 h, 5 at 24 h). Minutes at most; hours from 10-minute intervals.",
            "percent",
            w=24,
            h=8,
            # a row per node: at 300 points a fleet of 1,250 nodes drew 450,000 cells at 6 h and the panel
            # took a second to read; 200 points halve both there and keep 24 h at 5-minute columns (150
            # would move 24 h to hourly ones; docs/capacity.md)
            max_points=200,
            min_interval="1m",
        ),
    )
    b.row("Nodes")
    b.add(
        table(
            "Nodes",
            NODES,
            "Nodes as the collector has seen them. 'Silent for' counts from the last batch received "
            "(wall clock), so a silent agent stands out.",
            h=8,
            units={"Silent for": "s", "Last batch received": "dateTimeAsIso"},
        )
    )
    return b.to_json()
