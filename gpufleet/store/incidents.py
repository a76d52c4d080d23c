"""Reading incidents (the sweep writes them through ``collector.incident_store``)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

COLUMNS = 'id, kind, run_id, node, gpu, cause, severity, state, start, "end", last_seen, evidence, actions'


def list_incidents(
    conn: psycopg.Connection,
    state: str | None = None,
    kind: str | None = None,
    run_id: str | None = None,
    node: str | None = None,
    limit: int = 500,
    offset: int = 0,
) -> list[dict[str, Any]]:
    where, params = ["TRUE"], []
    for col, val in (("state", state), ("kind", kind), ("run_id", run_id), ("node", node)):
        if val is not None:
            where.append(f"{col} = %s")
            params.append(val)
    sql = (
        f"SELECT {COLUMNS} FROM incidents WHERE {' AND '.join(where)} "
        "ORDER BY (state = 'open') DESC, start DESC, id DESC LIMIT %s OFFSET %s"
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, [*params, limit, offset]).fetchall()


def get_incident(conn: psycopg.Connection, incident_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT {COLUMNS} FROM incidents WHERE id = %s", (incident_id,)).fetchone()
