"""The reads behind the web pages (fleet, runs, incidents, nodes), as plain SQL over the gpufleet schema.

"Now" for the fleet's state is the newest sample the collector has stored
(so a silent fleet shows its last known state, labelled with its time, not
an empty page); accounting uses the wall clock, as the API does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.store.gpu_states import FRESH, gpu_states_at
from gpufleet.store.run_model import state_sql

#: Points per chart series, about.
CHART_POINTS = 240


def _dicts(conn: psycopg.Connection, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, params).fetchall()


def newest_sample_time(conn: psycopg.Connection) -> datetime | None:
    """Newest sample time among recently received batches (an index walk, not a table scan)."""
    row = conn.execute(
        "SELECT max(t_max) FROM (SELECT t_max FROM ingest_batches ORDER BY received_at DESC LIMIT 500) b"
    ).fetchone()
    return row[0] if row else None


_GPU_NOW = f"""
SELECT g.node, count(*) AS gpus,
       count(*) FILTER (WHERE g.state = 'starved') AS starved,
       count(*) FILTER (WHERE g.state = 'busy') AS busy,
       count(*) FILTER (WHERE g.state = 'idle') AS idle,
       avg(g.util_pct) AS util_pct, sum(g.power_w) AS power_w
FROM ({gpu_states_at("%(t)s", "%(fresh)s")}) g
GROUP BY g.node
"""


@dataclass
class FleetNow:
    as_of: datetime | None
    nodes: list[dict[str, Any]]
    gpus: int
    busy: int
    idle: int
    starved: int
    power_w: float
    running_runs: int
    open_by_kind: list[tuple[str, int, int]]  # kind, open, critical


def fleet_now(conn: psycopg.Connection) -> FleetNow:
    as_of = newest_sample_time(conn)
    per_node: dict[str, dict[str, Any]] = {}
    if as_of is not None:
        for r in _dicts(conn, _GPU_NOW, {"t": as_of, "fresh": FRESH}):
            per_node[r["node"]] = r
    nodes = _dicts(
        conn,
        "SELECT node, site, gpu_count, last_seen, extract(epoch FROM now() - last_seen) AS silent_s "
        "FROM nodes ORDER BY node",
    )
    for n in nodes:
        n.update({k: v for k, v in per_node.get(n["node"], {}).items() if k != "node"})
    running = conn.execute(
        f"SELECT count(*) FROM runs r WHERE {state_sql('r', 'now()')} = 'running'"
    ).fetchone()
    kinds = conn.execute(
        "SELECT kind, count(*), count(*) FILTER (WHERE severity = 'critical') FROM incidents "
        "WHERE state = 'open' GROUP BY 1 ORDER BY 2 DESC, 1"
    ).fetchall()
    return FleetNow(
        as_of=as_of,
        nodes=nodes,
        gpus=sum(int(r["gpus"]) for r in per_node.values()),
        busy=sum(int(r["busy"]) for r in per_node.values()),
        idle=sum(int(r["idle"]) for r in per_node.values()),
        starved=sum(int(r["starved"]) for r in per_node.values()),
        power_w=sum(float(r["power_w"] or 0.0) for r in per_node.values()),
        running_runs=int(running[0]) if running else 0,
        open_by_kind=[(k, int(n), int(c)) for k, n, c in kinds],
    )


def runs(conn: psycopg.Connection, limit: int) -> list[dict[str, Any]]:
    return _dicts(
        conn,
        """
SELECT r.run_id, r.name, r.team, r.site, r.start, r."end",
       (SELECT count(*) FROM run_allocations a WHERE a.run_id = r.run_id) AS gpus,
       (SELECT count(*) FROM incidents i WHERE i.run_id = r.run_id AND i.state = 'open') AS open_incidents,
       (SELECT string_agg(DISTINCT i.kind, ', ') FROM incidents i WHERE i.run_id = r.run_id AND i.state = 'open')
         AS open_kinds
FROM runs r ORDER BY r.start DESC, r.run_id LIMIT %s""",
        (limit,),
    )


def run(conn: psycopg.Connection, run_id: str) -> dict[str, Any] | None:
    rows = _dicts(
        conn,
        """
SELECT r.run_id, r.name, r.team, r.site, r.start, r."end",
       (SELECT count(*) FROM run_allocations a WHERE a.run_id = r.run_id) AS gpus,
       (SELECT string_agg(a.node || ':' || a.gpus, '  ') FROM (
          SELECT node, string_agg(gpu::text, ',' ORDER BY gpu) AS gpus FROM run_allocations
          WHERE run_id = r.run_id GROUP BY node ORDER BY node) a) AS allocation
FROM runs r WHERE r.run_id = %s""",
        (run_id,),
    )
    return rows[0] if rows else None


def incidents(
    conn: psycopg.Connection,
    *,
    state: str | None = None,
    run_id: str | None = None,
    node: str | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    where, params = ["TRUE"], []
    if node:
        where.append("i.node = %s")
        params.append(node)
    if state:
        where.append("i.state = %s")
        params.append(state)
    if run_id:
        where.append("i.run_id = %s")
        params.append(run_id)
    return _dicts(
        conn,
        f"""
SELECT i.id, i.kind, i.cause, i.severity, i.state, i.run_id, i.node, i.gpu, i.start, i."end", i.evidence,
       i.actions
FROM incidents i WHERE {" AND ".join(where)}
ORDER BY (i.state = 'open') DESC, CASE i.severity WHEN 'critical' THEN 0 ELSE 1 END, i.start DESC
LIMIT %s""",
        [*params, limit],
    )


@dataclass
class GpuSeries:
    step_s: float
    #: (node, gpu) -> [(epoch s, util %, power W)]
    points: dict[tuple[str, int], list[tuple[float, float | None, float | None]]]


def run_gpu_series(conn: psycopg.Connection, run_id: str, lo: datetime, hi: datetime) -> GpuSeries:
    """Per-GPU utilisation and power of a run in [lo, hi), about :data:`CHART_POINTS` points each.

    Raw samples for windows up to three hours, the one-minute rollup beyond.
    """
    span = max((hi - lo).total_seconds(), 1.0)
    step = max(1.0, round(span / CHART_POINTS))
    if span > 3 * 3600:
        step = max(60.0, round(step / 60.0) * 60.0)
        sql = """
SELECT extract(epoch FROM date_bin(make_interval(secs => %(step)s), r.bucket, %(lo)s)) AS t, r.node, r.gpu,
       sum(r.util_pct * r.samples) / nullif(sum(r.samples), 0) AS util,
       sum(r.power_w * r.samples) / nullif(sum(r.samples), 0) AS power
FROM gpu_stats_1m r JOIN run_allocations a ON a.node = r.node AND a.gpu = r.gpu AND a.run_id = %(run)s
WHERE r.bucket >= %(lo)s AND r.bucket < %(hi)s
GROUP BY 1, 2, 3 ORDER BY 2, 3, 1"""
    else:
        sql = """
SELECT extract(epoch FROM date_bin(make_interval(secs => %(step)s), s.time, %(lo)s)) AS t, s.node, s.gpu,
       avg(s.util_pct) AS util, avg(s.power_w) AS power
FROM gpu_samples s JOIN run_allocations a ON a.node = s.node AND a.gpu = s.gpu AND a.run_id = %(run)s
WHERE s.time >= %(lo)s AND s.time < %(hi)s AND s.mig_instance IS NULL
GROUP BY 1, 2, 3 ORDER BY 2, 3, 1"""
    out: dict[tuple[str, int], list[tuple[float, float | None, float | None]]] = {}
    for t, node, gpu, util, power in conn.execute(sql, {"step": step, "lo": lo, "hi": hi, "run": run_id}):
        out.setdefault((node, int(gpu)), []).append(
            (float(t), None if util is None else float(util), None if power is None else float(power))
        )
    return GpuSeries(step, out)


def node(conn: psycopg.Connection, name: str) -> dict[str, Any] | None:
    """A node's row, with ``silent_s``: seconds since its last batch."""
    rows = _dicts(
        conn,
        "SELECT node, site, gpu_count, last_seen, facts, facts_time, "
        "extract(epoch FROM now() - last_seen) AS silent_s FROM nodes WHERE node = %s",
        (name,),
    )
    return rows[0] if rows else None


#: The newest sample of each GPU of the node (one index probe per GPU, on both layouts).
_JOB_NOW = """
SELECT l.* FROM generate_series(0, %(n)s - 1) AS g(gpu)
CROSS JOIN LATERAL (
  SELECT s.gpu, s.time, s.run_id, s.job_cpu_cores, s.job_cpu_quota_cores, s.job_cpu_throttled_share,
         s.job_cpu_pressure_pct, s.job_io_pressure_pct
  FROM gpu_samples s WHERE s.node = %(node)s AND s.gpu = g.gpu AND s.mig_instance IS NULL
  ORDER BY s.time DESC LIMIT 1) l
ORDER BY l.gpu
"""


def newest_job_samples(conn: psycopg.Connection, name: str, gpus: int) -> list[dict[str, Any]]:
    """The newest sample of each of the node's first ``gpus`` GPUs, with its job's cgroup figures."""
    return _dicts(conn, _JOB_NOW, {"node": name, "n": gpus})


def teams(conn: psycopg.Connection, run_ids: list[str]) -> dict[str, str | None]:
    """Each run's team."""
    return dict(conn.execute("SELECT run_id, team FROM runs WHERE run_id = ANY(%s)", (run_ids,)).fetchall())


# ---------------------------------------------------------------- what connects pages: runs on nodes, node charts


def running_runs_by_node(conn: psycopg.Connection) -> dict[str, list[dict[str, Any]]]:
    """The runs running now on each node (run id, name, team), for the fleet page's links."""
    rows = _dicts(
        conn,
        f"""
SELECT DISTINCT a.node, r.run_id, r.name, r.team FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
WHERE {state_sql("r", "now()")} = 'running' ORDER BY a.node, r.run_id""",
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["node"], []).append(r)
    return out


def node_runs(conn: psycopg.Connection, name: str) -> list[dict[str, Any]]:
    """The runs that held GPUs of the node, newest first, with the GPUs they held there."""
    return _dicts(
        conn,
        """
SELECT r.run_id, r.name, r.team, r.start, r."end", array_agg(a.gpu ORDER BY a.gpu) AS gpus
FROM run_allocations a JOIN runs r ON r.run_id = a.run_id WHERE a.node = %s
GROUP BY r.run_id, r.name, r.team, r.start, r."end" ORDER BY r.start DESC, r.run_id LIMIT 50""",
        (name,),
    )


def node_incidents(conn: psycopg.Connection, name: str, limit: int = 200) -> list[dict[str, Any]]:
    """Incidents that touch the node: on it, listing one of its GPUs, or of a run that held GPUs on it
    (a run's starvation has no node of its own, yet its GPUs there wait)."""
    return _dicts(
        conn,
        """
SELECT i.id, i.kind, i.cause, i.severity, i.state, i.run_id, i.node, i.gpu, i.start, i."end", i.evidence,
       i.actions
FROM incidents i
WHERE i.node = %(node)s
   OR (jsonb_typeof(i.evidence -> 'gpus') = 'array'
       AND EXISTS (SELECT 1 FROM jsonb_array_elements(i.evidence -> 'gpus') g
                   WHERE jsonb_typeof(g) = 'object' AND g ->> 'node' = %(node)s))
   OR (i.node IS NULL AND i.run_id IN (SELECT a.run_id FROM run_allocations a WHERE a.node = %(node)s))
ORDER BY (i.state = 'open') DESC, CASE i.severity WHEN 'critical' THEN 0 ELSE 1 END, i.start DESC
LIMIT %(limit)s""",
        {"node": name, "limit": limit},
    )


def node_gpu_series(conn: psycopg.Connection, name: str, lo: datetime, hi: datetime) -> GpuSeries:
    """Per-GPU utilisation and power of one node in [lo, hi), as :func:`run_gpu_series` draws a run's."""
    span = max((hi - lo).total_seconds(), 1.0)
    step = max(1.0, round(span / CHART_POINTS))
    if span > 3 * 3600:
        step = max(60.0, round(step / 60.0) * 60.0)
        sql = """
SELECT extract(epoch FROM date_bin(make_interval(secs => %(step)s), r.bucket, %(lo)s)) AS t, r.node, r.gpu,
       sum(r.util_pct * r.samples) / nullif(sum(r.samples), 0) AS util,
       sum(r.power_w * r.samples) / nullif(sum(r.samples), 0) AS power
FROM gpu_stats_1m r WHERE r.node = %(node)s AND r.bucket >= %(lo)s AND r.bucket < %(hi)s
GROUP BY 1, 2, 3 ORDER BY 2, 3, 1"""
    else:
        sql = """
SELECT extract(epoch FROM date_bin(make_interval(secs => %(step)s), s.time, %(lo)s)) AS t, s.node, s.gpu,
       avg(s.util_pct) AS util, avg(s.power_w) AS power
FROM gpu_samples s WHERE s.node = %(node)s AND s.time >= %(lo)s AND s.time < %(hi)s AND s.mig_instance IS NULL
GROUP BY 1, 2, 3 ORDER BY 2, 3, 1"""
    out: dict[tuple[str, int], list[tuple[float, float | None, float | None]]] = {}
    for t, node, gpu, util, power in conn.execute(sql, {"step": step, "lo": lo, "hi": hi, "node": name}):
        out.setdefault((node, int(gpu)), []).append(
            (float(t), None if util is None else float(util), None if power is None else float(power))
        )
    return GpuSeries(step, out)


def run_nodes(conn: psycopg.Connection, run_id: str) -> list[str]:
    """The nodes a run holds GPUs on."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT node FROM run_allocations WHERE run_id = %s ORDER BY node", (run_id,)
        ).fetchall()
    ]
