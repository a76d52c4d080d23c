"""The in-memory window: appends, back-fills, trims; arrays read from PostgreSQL as numpy."""

from __future__ import annotations

import time

import numpy as np
import psycopg

from gpufleet.collector.window_cache import WindowCache, _Buf, parse_array


def buf(ts: list[float]) -> _Buf:
    t = np.array(ts, dtype=np.float64)
    return _Buf(t, np.vstack([t.astype(np.float32), -t.astype(np.float32)]))


def test_append_trim_and_backfill() -> None:
    b = buf([1, 2, 3])
    for k in range(4, 200):
        b.merge(np.array([float(k)]), np.array([[k], [-k]], dtype=np.float32))
        b.trim(k - 50)
    assert b.t.tolist() == [float(x) for x in range(149, 200)]
    assert b.cols[1].tolist() == [-float(x) for x in range(149, 200)]
    # a back-filled sample lands in order; a re-fetched one is not duplicated
    b.merge(np.array([150.5, 160.0]), np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    assert len(b) == 52 and np.all(np.diff(b.t) > 0)
    assert b.t[2] == 150.5
    b.trim(1e9)
    assert len(b) == 0


def test_only_columns_with_values_are_stored() -> None:
    """A column without any value is not stored and reads as NaN; one that starts reporting is stored
    from then on, NaN before; out-of-order samples keep the same values."""
    nan = np.nan
    b = _Buf(np.array([1.0, 2.0]), np.array([[1, 2], [nan, nan], [nan, nan]], dtype=np.float32))
    assert b.rows.tolist() == [0] and b.vals.shape == (1, 2)
    b.merge(np.array([3.0]), np.array([[3], [nan], [nan]], dtype=np.float32))
    assert b.rows.tolist() == [0]
    b.merge(np.array([4.0, 5.0]), np.array([[4, 5], [nan, nan], [nan, 50]], dtype=np.float32))
    assert b.rows.tolist() == [0, 2]
    full = np.array([[1, 2, 3, 4, 5], [nan] * 5, [nan, nan, nan, nan, 50]], dtype=np.float32)
    assert np.array_equal(b.cols, full, equal_nan=True)
    b.merge(np.array([2.5]), np.array([[9], [7], [nan]], dtype=np.float32))
    assert b.rows.tolist() == [0, 1, 2] and b.t.tolist() == [1, 2, 2.5, 3, 4, 5]
    assert np.array_equal(b.cols, np.insert(full, 2, [9, 7, nan], axis=1), equal_nan=True)
    w = WindowCache(10.0, gpus={("n", 0): b}).window(5.0, [], {})
    s = w.gpus[("n", 0)]
    assert set(s.cols) == {"util_pct", "sm_active", "tensor_active"} and not s.has("dram_active")
    assert np.isnan(s.get("dram_active")).all() and s.get("tensor_active")[-1] == 50


def test_parse_array_matches_postgres(conn: psycopg.Connection) -> None:
    for typ, kind in (("real", "real"), ("smallint", "smallint"), ("integer", "integer"), ("bigint", "bigint"),
                      ("double precision", "double")):
        for values in ([1, 2, 3], [None, None], [None, 5, None, 7], []):
            with conn.cursor(binary=True) as cur:
                from gpufleet.collector.window_cache import _PG_ARRAY, _RawLoader

                cur.adapters.register_loader(_PG_ARRAY[kind], _RawLoader)
                raw = cur.execute(f"SELECT %s::{typ}[]", (values,)).fetchone()[0]  # type: ignore[index]
            got = parse_array(raw, len(values), kind) if values else np.zeros(0)
            expected = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            assert np.array_equal(got, expected, equal_nan=True), (typ, values, got)


def test_refresh_forgets_batch_ids_it_cannot_read_again(conn: psycopg.Connection) -> None:
    """Only ids received within the re-read slack are kept: the set does not grow with uptime."""
    conn.execute("INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max, received_at) "
                 "SELECT id, 'n', 0, 1, now() - age, now() - age, now() - age FROM (VALUES "
                 "('a:1', interval '10 min'), ('a:2', interval '30 s')) AS v(id, age)")
    cache = WindowCache(3600.0, loaded=True)
    cache.watermark = conn.execute("SELECT now() - interval '20 min'").fetchone()[0]  # type: ignore[index]
    cache.refresh(conn, time.time())
    assert set(cache.seen) == {"a:1", "a:2"}
    cache.refresh(conn, time.time())  # re-reads from 60 s before the previous refresh
    assert set(cache.seen) == {"a:2"}
