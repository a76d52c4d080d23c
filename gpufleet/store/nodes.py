"""Nodes as the collector has seen them."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.store.runs import NotFound

COLUMNS = "node, site, first_seen, last_seen, gpu_count, rejected_skew, facts"


def list_nodes(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT {COLUMNS} FROM nodes ORDER BY node").fetchall()


def set_node_site(conn: psycopg.Connection, node: str, site: str | None) -> dict[str, Any]:
    """Assign a node to a site (creating the node row if it has not reported yet)."""
    if site is not None and conn.execute("SELECT 1 FROM sites WHERE site = %s", (site,)).fetchone() is None:
        raise NotFound(f"site {site!r} not found")
    conn.execute(
        "INSERT INTO nodes (node, site) VALUES (%s, %s) ON CONFLICT (node) DO UPDATE SET site = "
        "EXCLUDED.site",
        (node, site),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(f"SELECT {COLUMNS} FROM nodes WHERE node = %s", (node,)).fetchone()
    assert row is not None
    return row
