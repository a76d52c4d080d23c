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
    RANGE_FROM,
    RANGE_TO,
    accounting,
    all_or,
    incident_in_site,
    node_in_site,
    open_at,
    raw_or_rollup,
    weighted,
)
from gpufleet.store.gpu_states import BUSY_UTIL_PCT, gpu_state, gpu_states_at

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

_STATE_BUCKETS = raw_or_rollup(
    f"""SELECT $__timeGroup(s.time, $__interval) AS bucket, min(s.time) AS first_t, s.node, s.gpu,
       avg(s.util_pct) AS util
FROM gpu_samples s
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {node_in_site("s.node")}
GROUP BY 1, 3, 4""",
    f"""SELECT $__timeGroup(r.bucket, $__interval) AS bucket, min(r.bucket) AS first_t, r.node, r.gpu,
       {weighted("util_pct")} AS util
FROM gpu_stats_1m r
WHERE $__timeFilter(r.bucket) AND {node_in_site("r.node")}
GROUP BY 1, 3, 4""",
)

#: The GPU-buckets a starvation incident of a run holding the GPU covers (at the bucket's first sample),
#: found by one join of the few starved allocations with the buckets; a per-bucket EXISTS over them ran
#: past 200 s on 10,000 GPUs at 6 h (``bench/read_side.py``), this join in about 30 s, nearly all of it
#: grouping the raw samples.
GPU_STATES_OVER_TIME = f"""
WITH g AS (
{_STATE_BUCKETS}
), starved AS (
  SELECT a.node, a.gpu, i.start, coalesce(i."end", 'infinity') AS stop
  FROM incidents i JOIN run_allocations a ON a.run_id = i.run_id
  WHERE i.kind = 'starvation' AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
), hits AS (
  SELECT DISTINCT g.bucket, g.node, g.gpu
  FROM g JOIN starved x ON x.node = g.node AND x.gpu = g.gpu
  WHERE g.first_t >= x.start AND g.first_t < x.stop
), classified AS (
  SELECT g.bucket, {gpu_state("g.util", "h.node IS NOT NULL")} AS state
  FROM g LEFT JOIN hits h ON h.bucket = g.bucket AND h.node = g.node AND h.gpu = g.gpu
)
SELECT bucket AS "time",
       count(*) FILTER (WHERE state = 'busy') AS "busy",
       count(*) FILTER (WHERE state = 'starved') AS "starved",
       count(*) FILTER (WHERE state = 'idle') AS "idle"
FROM classified
GROUP BY 1
ORDER BY 1
"""

_POWER = raw_or_rollup(
    f"""SELECT $__timeGroup(s.time, $__interval) AS bucket, coalesce(n.site, 'no site') AS site, s.node, s.gpu,
       avg(s.power_w) AS watts
FROM gpu_samples s LEFT JOIN nodes n ON n.node = s.node
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {node_in_site("s.node")}
GROUP BY 1, 2, 3, 4""",
    f"""SELECT $__timeGroup(r.bucket, $__interval) AS bucket, coalesce(n.site, 'no site') AS site, r.node, r.gpu,
       {weighted("power_w")} AS watts
FROM gpu_stats_1m r LEFT JOIN nodes n ON n.node = r.node
WHERE $__timeFilter(r.bucket) AND {node_in_site("r.node")}
GROUP BY 1, 2, 3, 4""",
)

POWER_BY_SITE = f"""
SELECT bucket AS "time", site AS metric, sum(watts) AS value
FROM (
{_POWER}
) AS per_gpu
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

OPEN_OVER_TIME = f"""
SELECT t AS "time", i.kind AS metric, count(*) AS value
FROM generate_series({RANGE_FROM}, {RANGE_TO}, make_interval(secs => greatest($__interval_ms, 1000) / 1000.0)) AS t
JOIN incidents i ON i.start <= t AND coalesce(i."end", 'infinity') > t
WHERE {incident_in_site()}
GROUP BY 1, 2
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
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval), s.node AS metric, avg(s.util_pct) AS value
FROM gpu_samples s
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {node_in_site("s.node")}
GROUP BY 1, 2""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), r.node AS metric, {weighted("util_pct")} AS value
FROM gpu_stats_1m r
WHERE $__timeFilter(r.bucket) AND {node_in_site("r.node")}
GROUP BY 1, 2""",
    )
    + "\nORDER BY 1, 2"
)

ACTIVITY = (
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval), avg(s.util_pct) AS "GPU-Util",
       avg(s.sm_active) * 100 AS "SM active", avg(s.tensor_active) * 100 AS "Tensor active"
FROM gpu_samples s
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL AND {node_in_site("s.node")}
GROUP BY 1""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), {weighted("util_pct")} AS "GPU-Util",
       {weighted("sm_active")} * 100 AS "SM active", {weighted("tensor_active")} * 100 AS "Tensor active"
FROM gpu_stats_1m r
WHERE $__timeFilter(r.bucket) AND {node_in_site("r.node")}
GROUP BY 1""",
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
            "GPUs per state in each interval (average GPU-Util of the interval).",
            "none",
            stack=True,
            w=12,
        ),
        timeseries(
            "GPU power by site",
            POWER_BY_SITE,
            "Sum over GPUs of each GPU's average board power in the interval.",
            "watt",
            stack=True,
            w=12,
        ),
        timeseries(
            "Fleet activity",
            ACTIVITY,
            "Average GPU-Util and DCGM SM / tensor activity over every reporting GPU.",
            "percent",
            w=12,
            fill=0,
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
            "GPU-Util by node", UTIL_BY_NODE, "Average GPU-Util of each node's GPUs.", "percent", w=24, h=8
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
