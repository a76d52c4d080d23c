"""Starvation board: which runs lose the most GPU time waiting for input, and why.

GPU time lost is read from each incident's evidence and time: for input
starvation the share of GPU time lost (``gpu_time_lost_share``) times the GPUs
affected; for checkpoint stalls the share of run time lost
(``run_time_lost_share``) times the run's GPUs; both times the part of the
incident inside the range (up to the last sweep that saw it, for open ones).
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.fleet_overview import SITE_VAR
from gpufleet.dashboards.model import Board, bars, query_variable, table, timeseries
from gpufleet.dashboards.sql import (
    RANGE_FROM,
    RANGE_TO,
    all_or,
    ev_num,
    incident_in_site,
    raw_or_rollup,
    weighted,
)

UID = "gpufleet-starvation"
KINDS = "('starvation', 'checkpoint_stall')"

TEAM_VAR = query_variable(
    "team",
    "Team",
    "SELECT DISTINCT team FROM runs WHERE team IS NOT NULL ORDER BY 1",
    refresh=1,
    description="Teams of registered runs; All includes runs without a team.",
)

LOST = f"""
  SELECT i.id, i.kind, i.cause, i.state, i.start, i.run_id, r.name, r.team, r.site, i.evidence,
         greatest(i.start, {RANGE_FROM}) AS t0,
         least(coalesce(i."end", i.last_seen), {RANGE_TO}) AS t1,
         CASE i.kind WHEN 'starvation' THEN {ev_num("gpu_time_lost_share")}
                     ELSE {ev_num("run_time_lost_share")} END AS share,
         coalesce(CASE i.kind WHEN 'starvation' THEN {ev_num("gpus_affected")} ELSE {ev_num("gpu_count")} END,
                  (SELECT count(*) FROM run_allocations a WHERE a.run_id = i.run_id)) AS gpus
  FROM incidents i JOIN runs r ON r.run_id = i.run_id
  WHERE i.kind IN {KINDS} AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
    AND {incident_in_site()} AND {all_or("team", "r.team")}"""

RANKED = f"""
WITH lost AS ({LOST}
)
SELECT run_id AS "Run", coalesce(name, '') AS "Name", coalesce(team, '') AS "Team", kind AS "Kind",
       coalesce(cause, '') AS "Cause",
       sum(coalesce(share, 0) * gpus * greatest(extract(epoch FROM t1 - t0), 0)) / 3600.0 AS "GPU-hours lost",
       max(share) AS "Share lost", max(gpus) AS "GPUs affected", min(start) AS "Since",
       bool_or(state = 'open') AS "Open"
FROM lost
GROUP BY 1, 2, 3, 4, 5
ORDER BY "GPU-hours lost" DESC, 1
"""

BY_CAUSE = f"""
WITH lost AS ({LOST}
)
SELECT kind || coalesce(' / ' || cause, '') AS "Cause",
       sum(coalesce(share, 0) * gpus * greatest(extract(epoch FROM t1 - t0), 0)) / 3600.0 AS "GPU-hours lost"
FROM lost
GROUP BY 1
ORDER BY 2 DESC
"""

STARVED_GPUS = f"""
WITH lost AS ({LOST}
)
SELECT t AS "time", l.run_id AS metric, sum(coalesce(l.share, 0) * l.gpus) AS value
FROM generate_series({RANGE_FROM}, {RANGE_TO}, make_interval(secs => greatest($__interval_ms, 1000) / 1000.0)) AS t
JOIN lost l ON l.start <= t AND l.t1 >= t
GROUP BY 1, 2
ORDER BY 1, 2
"""

EVIDENCE = f"""
WITH lost AS ({LOST}
)
SELECT run_id AS "Run", kind AS "Kind", coalesce(cause, '') AS "Cause", evidence ->> 'pattern' AS "Pattern",
       {ev_num("period_s", "lost")} AS "Period",
       {ev_num("duty_cycle", "lost")} AS "Duty cycle",
       {ev_num("cpu_user_pct", "lost")} AS "CPU user",
       {ev_num("iowait_pct", "lost")} AS "iowait",
       {ev_num("disk_util_pct", "lost")} AS "Disk util",
       {ev_num("disk_await_ms", "lost")} AS "Disk await",
       {ev_num("write_bytes_s", "lost")} AS "Checkpoint write rate",
       evidence ->> 'host' AS "Host", start AS "Start"
FROM lost
ORDER BY start
"""

#: Hosts of runs with a starvation incident in the range (``@`` is the table alias).
_STARVED_HOSTS = f"""@.node IN (
    SELECT a.node FROM incidents i JOIN run_allocations a ON a.run_id = i.run_id JOIN runs r ON r.run_id = i.run_id
    WHERE i.kind = 'starvation' AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
      AND {incident_in_site()} AND {all_or("team", "r.team")})"""

HOST_PRESSURE = (
    raw_or_rollup(
        f"""SELECT $__timeGroupAlias(s.time, $__interval), s.node || ' cpu user' AS metric, avg(s.cpu_user_pct) AS value
FROM host_samples s WHERE $__timeFilter(s.time) AND {_STARVED_HOSTS.replace("@", "s")}
GROUP BY 1, 2
UNION ALL
SELECT $__timeGroupAlias(s.time, $__interval), s.node || ' iowait', avg(s.cpu_iowait_pct)
FROM host_samples s WHERE $__timeFilter(s.time) AND {_STARVED_HOSTS.replace("@", "s")}
GROUP BY 1, 2""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || ' cpu user' AS metric,
       {weighted("cpu_user_pct")} AS value
FROM host_stats_1m r WHERE $__timeFilter(r.bucket) AND {_STARVED_HOSTS.replace("@", "r")}
GROUP BY 1, 2
UNION ALL
SELECT $__timeGroupAlias(r.bucket, $__interval), r.node || ' iowait', {weighted("cpu_iowait_pct")}
FROM host_stats_1m r WHERE $__timeFilter(r.bucket) AND {_STARVED_HOSTS.replace("@", "r")}
GROUP BY 1, 2""",
    )
    + "\nORDER BY 1, 2"
)

#: Each starved run's GPUs over the run's own window, clipped to the range: a GPU's samples belong to
#: the run that held it when they were taken, not to every run that ever held it (which drew each
#: starved GPU's samples once per run of the month: 37 s at 6 h on 10,000 GPUs, ``bench/read_side.py``).
_STARVED_HELD = f"""
  SELECT a.run_id, a.node, a.gpu, greatest(r.start, {RANGE_FROM}) AS lo,
         least(coalesce(r."end", 'infinity'), {RANGE_TO}) AS hi
  FROM runs r JOIN run_allocations a ON a.run_id = r.run_id
  WHERE r.run_id IN (
    SELECT i.run_id FROM incidents i
    WHERE i.kind = 'starvation' AND i.start <= {RANGE_TO} AND coalesce(i."end", 'infinity') >= {RANGE_FROM}
      AND {incident_in_site()})
    AND {all_or("team", "r.team")}"""

RUN_ACTIVITY = (
    f"WITH held AS ({_STARVED_HELD}\n)\n"
    + raw_or_rollup(
        """SELECT $__timeGroupAlias(s.time, $__interval), h.run_id AS metric, avg(s.util_pct) AS value
FROM held h JOIN gpu_samples s ON s.node = h.node AND s.gpu = h.gpu AND s.time >= h.lo AND s.time < h.hi
WHERE $__timeFilter(s.time) AND s.mig_instance IS NULL
GROUP BY 1, 2""",
        f"""SELECT $__timeGroupAlias(r.bucket, $__interval), h.run_id AS metric, {weighted("util_pct")} AS value
FROM held h JOIN gpu_stats_1m r ON r.node = h.node AND r.gpu = h.gpu
  AND r.bucket > h.lo - interval '1 minute' AND r.bucket < h.hi
WHERE $__timeFilter(r.bucket)
GROUP BY 1, 2""",
    )
    + "\nORDER BY 1, 2"
)


def build() -> dict[str, Any]:
    b = Board(
        UID,
        "gpufleet / Starvation board",
        "Runs ranked by GPU time lost to input starvation and checkpoint stalls, with the detector's "
        "cause and the host evidence behind it.",
    )
    b.variables += [SITE_VAR, TEAM_VAR]
    b.add(
        table(
            "Runs by GPU time lost",
            RANKED,
            "GPU-hours lost inside the range: evidence share x GPUs affected x incident time. Cause is "
            "cpu, io or unknown for starvation.",
            h=9,
            sort_by="GPU-hours lost",
            units={"GPU-hours lost": "none", "Share lost": "percentunit", "Since": "dateTimeAsIso"},
        )
    )
    b.add(
        bars("GPU-hours lost by cause", BY_CAUSE, "Summed over the runs above.", "none", w=8, h=8),
        timeseries(
            "GPUs' worth of time lost",
            STARVED_GPUS,
            "At each step, per run: share lost x GPUs affected, over open incidents.",
            "none",
            stack=True,
            w=16,
            h=8,
            fill=40,
        ),
    )
    b.add(
        table(
            "Evidence",
            EVIDENCE,
            "What the detector measured: oscillation period and duty cycle, host CPU, iowait and disk, "
            "checkpoint write rate.",
            h=8,
            units={
                "Period": "s",
                "Duty cycle": "percentunit",
                "CPU user": "percent",
                "iowait": "percent",
                "Disk util": "percent",
                "Disk await": "ms",
                "Checkpoint write rate": "Bps",
                "Start": "dateTimeAsIso",
            },
        )
    )
    b.add(
        timeseries(
            "Hosts of starved runs: CPU user and iowait",
            HOST_PRESSURE,
            "High user CPU points at the input pipeline (decode, augmentation); high iowait at storage.",
            "percent",
            w=12,
            fill=0,
        ),
        timeseries(
            "GPU-Util of starved runs",
            RUN_ACTIVITY,
            "Average over each run's GPUs; a saw-tooth is the loader not keeping up.",
            "percent",
            w=12,
            fill=0,
        ),
    )
    return b.to_json()
