"""Runs and their GPU allocations."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


RUN_SELECT = """
SELECT r.run_id, r.name, r.site, r.team, r.start, r."end", r.params, r.labels,
  CASE WHEN r.start > now() THEN 'pending' WHEN r."end" IS NULL OR r."end" > now() THEN 'running'
       ELSE 'ended' END AS state,
  COALESCE((SELECT json_agg(json_build_object('node', a.node, 'gpus', a.gpus) ORDER BY a.node)
            FROM (SELECT node, array_agg(gpu ORDER BY gpu) AS gpus FROM run_allocations
                  WHERE run_id = r.run_id GROUP BY node) a), '[]'::json) AS allocations,
  (SELECT count(*) FROM run_allocations WHERE run_id = r.run_id)::int AS gpu_count
FROM runs r"""


def new_run_id() -> str:
    return "run-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def get_run(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(RUN_SELECT + " WHERE r.run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise NotFound(f"run {run_id!r} not found")
    return row


def list_runs(conn: psycopg.Connection, state: str | None = None, site: str | None = None,
              since: datetime | None = None, until: datetime | None = None, limit: int = 100,
              offset: int = 0) -> list[dict[str, Any]]:
    """Runs overlapping [since, until), newest first."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    if state == "running":
        where.append('r.start <= now() AND (r."end" IS NULL OR r."end" > now())')
    elif state == "pending":
        where.append("r.start > now()")
    elif state == "ended":
        where.append('r."end" <= now()')
    if site:
        where.append("r.site = %s")
        params.append(site)
    if since:
        where.append('(r."end" IS NULL OR r."end" > %s)')
        params.append(since)
    if until:
        where.append("r.start < %s")
        params.append(until)
    sql = RUN_SELECT + " WHERE " + " AND ".join(where) + " ORDER BY r.start DESC, r.run_id LIMIT %s OFFSET %s"
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, [*params, limit, offset]).fetchall()


def _check_site(conn: psycopg.Connection, site: str | None) -> None:
    if site is not None and conn.execute("SELECT 1 FROM sites WHERE site = %s", (site,)).fetchone() is None:
        raise NotFound(f"site {site!r} is not registered; create it first")


def add_allocations(conn: psycopg.Connection, run_id: str, allocations: list[dict[str, Any]]) -> None:
    nodes, gpus = [], []
    for a in allocations:
        for g in a["gpus"]:
            nodes.append(a["node"])
            gpus.append(g)
    if nodes:
        conn.execute(
            "INSERT INTO run_allocations (run_id, node, gpu) SELECT %s, n, g FROM unnest(%s::text[], %s::int[]) "
            "AS u(n, g) ON CONFLICT DO NOTHING",
            (run_id, nodes, gpus),
        )


def create_run(conn: psycopg.Connection, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Register a run; registering the same run again merges its allocations.

    Returns (run, created).  A second registration with a different start or
    site is a conflict (a scheduler hook on each node of a job registers the
    same run; they must agree).
    """
    run_id = spec.get("run_id") or new_run_id()
    start = spec.get("start") or datetime.now(UTC)
    end = spec.get("end")
    if end is not None and end < start:
        raise Conflict("end is before start")
    with conn.transaction():
        _check_site(conn, spec.get("site"))
        cur = conn.execute(
            'INSERT INTO runs (run_id, name, site, team, start, "end", params, labels) '
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            (run_id, spec.get("name"), spec.get("site"), spec.get("team"), start, end, spec.get("params"),
             Jsonb(spec.get("labels") or {})),
        )
        created = cur.fetchone() is not None
        if not created:
            existing = get_run(conn, run_id)
            if spec.get("start") is not None and existing["start"] != spec["start"]:
                raise Conflict(f"run {run_id!r} exists with start {existing['start'].isoformat()}")
            if spec.get("site") is not None and existing["site"] != spec["site"]:
                raise Conflict(f"run {run_id!r} exists at site {existing['site']!r}")
        add_allocations(conn, run_id, spec.get("allocations") or [])
    return get_run(conn, run_id), created


def update_run(conn: psycopg.Connection, run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    with conn.transaction():
        existing = get_run(conn, run_id)
        sets, params = [], []
        for col in ("name", "team", "params"):
            if col in changes:
                sets.append(f"{col} = %s")
                params.append(changes[col])
        if "end" in changes:
            end = changes["end"]
            if end is not None and end < existing["start"]:
                raise Conflict("end is before the run's start")
            sets.append('"end" = %s')
            params.append(end)
        if changes.get("labels") is not None:
            sets.append("labels = labels || %s")
            params.append(Jsonb(changes["labels"]))
        if sets:
            conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id = %s", [*params, run_id])
        if changes.get("allocations"):
            add_allocations(conn, run_id, changes["allocations"])
    return get_run(conn, run_id)


def record_progress(conn: psycopg.Connection, run_id: str, time: datetime, tokens: float | None,
                    samples: float | None) -> None:
    get_run(conn, run_id)
    conn.execute(
        "INSERT INTO run_progress (run_id, time, tokens, samples) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (run_id, time) DO UPDATE SET tokens = EXCLUDED.tokens, samples = EXCLUDED.samples",
        (run_id, time, tokens, samples),
    )
