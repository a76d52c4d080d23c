"""The time BRIN indexes stay summarized up to the newest rows, so a read of the last seconds scans
those seconds, not everything written since the last VACUUM (plain PostgreSQL)."""

from __future__ import annotations

import json
import logging
import time
import uuid

import psycopg
import pytest
from psycopg import sql

from gpufleet.collector import brin_tail
from gpufleet.collector.brin_tail import BrinTail
from gpufleet.collector.window_cache import WindowCache

#: Rows per insert in these tests: about 20 page ranges of the GPU table's index at 32 pages a range.
ROWS = 60_000


def fill(conn: psycopg.Connection, t0: float, rows: int = ROWS, node: str = "n1") -> float:
    """``rows`` GPU samples from ``t0`` on, 1 ms apart and in time order; returns the last time."""
    conn.execute(
        "INSERT INTO gpu_samples (time, node, gpu, util_pct) "
        "SELECT to_timestamp(%s + i / 1000.0), %s, 0, 90 FROM generate_series(0, %s - 1) i",
        (t0, node, rows),
    )
    return t0 + (rows - 1) / 1000.0


def heap_blocks(conn: psycopg.Connection, lo: float, hi: float) -> int:
    """Heap blocks a time-range read of ``gpu_samples`` visits through the BRIN index."""
    with conn.transaction():
        # One process: in a parallel bitmap heap scan the plan's block count is
        # the leader's share only (about half of the blocks, now and then).
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_indexscan = off")
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM gpu_samples "
            "WHERE time >= to_timestamp(%s) AND time <= to_timestamp(%s)",
            (lo, hi),
        ).fetchone()
    assert plan is not None
    doc = plan[0] if isinstance(plan[0], list) else json.loads(plan[0])

    def scan(node: dict[str, object]) -> dict[str, object] | None:
        if node.get("Node Type") == "Bitmap Heap Scan":
            return node
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            found = scan(child)
            if found is not None:
                return found
        return None

    node = scan(doc[0]["Plan"])
    assert node is not None, doc
    return int(node.get("Lossy Heap Blocks", 0)) + int(node.get("Exact Heap Blocks", 0))  # type: ignore[call-overload]


def test_new_ranges_are_summarized_first_whole_then_from_the_last(conn: psycopg.Connection) -> None:
    t0 = time.time() - 3600
    end = fill(conn, t0)
    conn.execute("VACUUM gpu_samples")
    end = fill(conn, end + 0.001)
    # Unsummarized, the rows written since the VACUUM all match a read of the last 50 ms.
    tail = heap_blocks(conn, end - 0.05, end)
    assert tail > 10 * 32
    brin = BrinTail()
    assert brin.catch_up(conn)
    assert brin.summarized >= 10
    assert heap_blocks(conn, end - 0.05, end) <= 2 * 32 < tail
    # Later calls summarize only the ranges from the last one on.
    first = brin.summarized
    end = fill(conn, end + 0.001)
    assert heap_blocks(conn, end - 0.05, end) > 10 * 32
    assert brin.catch_up(conn)
    assert brin.summarized - first >= 10
    assert heap_blocks(conn, end - 0.05, end) <= 2 * 32
    # A table rewritten since (TRUNCATE) is summarized whole again.
    conn.execute("TRUNCATE gpu_samples")
    end = fill(conn, t0)
    assert brin.catch_up(conn)
    assert heap_blocks(conn, end - 0.05, end) <= 2 * 32


def test_a_refresh_summarizes_before_it_reads(conn: psycopg.Connection) -> None:
    now = time.time()
    cache = WindowCache(600.0)
    end = fill(conn, now - 300)
    cache.refresh(conn, end)
    t_from = end + 0.001
    end = fill(conn, t_from)
    conn.execute(
        "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max) "
        "VALUES ('n1:late', 'n1', %s, 0, to_timestamp(%s), to_timestamp(%s))",
        (ROWS, t_from, end),
    )
    assert heap_blocks(conn, end - 0.05, end) > 10 * 32
    cache.refresh(conn, end)
    assert heap_blocks(conn, end - 0.05, end) <= 2 * 32
    assert len(cache.window(end + 1, [], {}).gpus[("n1", 0)]) == 2 * ROWS


def test_a_lock_held_elsewhere_is_waited_for_briefly_then_left(db: str, conn: psycopg.Connection) -> None:
    """A VACUUM (here, a session holding its lock) is summarizing already: the sweep does not wait on it."""
    end = fill(conn, time.time() - 600)
    brin = BrinTail()
    with psycopg.connect(db) as other:
        other.execute("LOCK TABLE gpu_samples IN SHARE UPDATE EXCLUSIVE MODE")
        t0 = time.perf_counter()
        assert not brin.catch_up(conn)
        assert time.perf_counter() - t0 < 2.0
        assert heap_blocks(conn, end - 0.05, end) > 10 * 32
        other.rollback()
    assert brin.catch_up(conn)
    assert heap_blocks(conn, end - 0.05, end) <= 2 * 32


def test_inside_a_transaction_it_waits_for_the_next_call(conn: psycopg.Connection) -> None:
    fill(conn, time.time() - 600, rows=100)
    brin = BrinTail()
    with conn.transaction():
        assert not brin.catch_up(conn)
    assert brin.catch_up(conn)


def test_tables_without_the_indexes_are_left_alone(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TimescaleDB layout has no time BRIN indexes: nothing to summarize, no error."""
    monkeypatch.setattr(brin_tail, "INDEXES", {"gpu_samples": "no_such_index"})
    brin = BrinTail()
    assert brin.catch_up(conn)
    assert brin.indexes == [] and brin.summarized == 0


def test_a_user_who_may_not_summarize_is_told_once(
    db: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the tables' owner may summarize: another user's collector logs why reads stay slow, once."""
    role = f"gf_reader_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("GRANT SELECT ON gpu_samples, host_samples TO {}").format(sql.Identifier(role)))
        fill(conn, time.time() - 600, rows=100)
        info = psycopg.conninfo.conninfo_to_dict(db)
        info["user"] = role
        info.pop("password", None)
        with (
            psycopg.connect(psycopg.conninfo.make_conninfo("", **info), autocommit=True) as reader,
            caplog.at_level(logging.WARNING, logger=brin_tail.__name__),
        ):
            brin = BrinTail()
            assert not brin.catch_up(reader)
            assert not brin.catch_up(reader)
        warned = [r for r in caplog.records if "only the owner" in r.getMessage()]
        assert len(warned) == 1 and "gpu_samples" in warned[0].getMessage()
    finally:
        conn.execute(sql.SQL("REVOKE ALL ON gpu_samples, host_samples FROM {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
