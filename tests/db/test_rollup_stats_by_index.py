"""The plain-PostgreSQL stats rollup reads only the samples of the ranges it rebuilds.

Its refresh of ``gpu_stats_1m`` / ``host_stats_1m`` once selected the samples
by a correlated ``EXISTS`` over the claimed ranges alone, which no index can
answer: every rollup cycle read the whole sample table (a sequential scan of
14.4 million rows for 25 nodes' day in ``bench/read_side.py``'s fleet, and of
every raw sample kept in a live one).  The check counts the rows the plan's
scan of the sample table reads, with sequential scans priced out so that a
query an index can answer is answered by one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gpufleet.collector import rollup
from gpufleet.db import activity_sql
from gpufleet.db.policies import backend_of

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def scans(node: dict[str, Any], table: str) -> Iterator[dict[str, Any]]:
    if node.get("Relation Name") == table:
        yield node
    for child in node.get("Plans", []):
        yield from scans(child, table)


def rows_read(conn: psycopg.Connection, statement: str, params: dict[str, Any], table: str) -> int:
    """The rows of ``table`` that ``statement``'s plan reads (kept or filtered out), sequential scans priced
    out so that a statement an index can answer is answered by one; nothing it writes is kept."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.encode(), params).fetchone()[0]  # type: ignore[index]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return sum(
        (
            s.get("Actual Rows", 0)
            + s.get("Rows Removed by Filter", 0)
            + s.get("Rows Removed by Index Recheck", 0)
        )
        * s.get("Actual Loops", 1)
        for s in scans(plan[0]["Plan"], table)
    )


@pytest.mark.parametrize("kind", ["gpu", "host"])
def test_the_stats_refresh_reads_only_its_ranges_samples(conn: psycopg.Connection, kind: str) -> None:
    if backend_of(conn) == "timescaledb":
        pytest.skip("TimescaleDB refreshes its continuous aggregates itself")
    table = f"{kind}_samples"
    with conn.cursor().copy(f"COPY {table} (time, node{', gpu' if kind == 'gpu' else ''}) FROM STDIN") as cp:
        for n in range(20):
            for s in range(0, 3600, 30):  # an hour of 20 nodes, every 30 s
                cp.write_row((T0 + timedelta(seconds=s), f"n{n}", *((0,) if kind == "gpu" else ())))
    conn.execute(f"ANALYZE {table}")
    _, insert = rollup._stats_sql(kind)
    # two nodes' minutes 0-2 and 5-9: the nodes' samples over [0, 10) minutes are 2 x 20 rows
    params = {
        "nodes": ["n3", "n7"],
        "lo": [T0, T0 + timedelta(minutes=5)],
        "hi": [T0 + timedelta(minutes=2), T0 + timedelta(minutes=9)],
    }
    read = rows_read(conn, insert, params, table)
    assert read <= 2 * 20, f"the refresh read {read} rows of {table} for 2 nodes' 10 minutes (40 rows)"
    # and what it writes is the ranges' minutes, nothing else
    conn.execute(insert, params)
    got = conn.execute(f"SELECT node, bucket, samples FROM {kind}_stats_1m ORDER BY 1, 2").fetchall()
    assert [(n, int((b - T0).total_seconds() // 60)) for n, b, _ in got] == [("n3", m) for m in range(3)] + [
        ("n7", m) for m in range(5, 10)
    ]
    assert {s for *_, s in got} == {2}


def test_the_node_activity_rebuild_reads_only_its_ranges_samples(conn: psycopg.Connection) -> None:
    """node_activity_1m is rebuilt from raw samples on both backends, every rollup pass: it must find
    the ranges' samples by index too."""
    with conn.cursor().copy("COPY gpu_samples (time, node, gpu) FROM STDIN") as cp:
        for n in range(20):
            for s in range(0, 3600, 30):
                cp.write_row((T0 + timedelta(seconds=s), f"n{n}", 0))
    conn.execute("ANALYZE gpu_samples")
    _, insert = activity_sql.rebuild_minutes_sql()
    params = {
        "nodes": ["n3", "n7"],
        "lo": [T0, T0 + timedelta(minutes=5)],
        "hi": [T0 + timedelta(minutes=2), T0 + timedelta(minutes=9)],
    }
    read = rows_read(conn, insert, params, "gpu_samples")
    assert read <= 2 * 20, f"the rebuild read {read} rows of gpu_samples for 2 nodes' 10 minutes (40 rows)"
    conn.execute(insert, params)
    got = conn.execute("SELECT node, bucket, gpu_minutes FROM node_activity_1m ORDER BY 1, 2").fetchall()
    assert [(n, int((b - T0).total_seconds() // 60)) for n, b, _ in got] == [("n3", m) for m in range(3)] + [
        ("n7", m) for m in range(5, 10)
    ]
