"""The in-memory window: appends, back-fills, trims; arrays read from PostgreSQL as numpy."""

from __future__ import annotations

import time

import numpy as np
import psycopg
import pytest

from gpufleet.collector.window_cache import WindowCache, _Buf


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


def test_trim_drops_exactly_the_samples_before_the_cut() -> None:
    """A few samples (a steady sweep), none, many (after a pause), a cut between samples, all."""
    b = buf([float(x) for x in range(100)])
    for cut, first in ((3.0, 3.0), (3.0, 3.0), (2.0, 3.0), (5.5, 6.0), (40.0, 40.0), (47.5, 48.0)):
        b.trim(cut)
        assert b.t[0] == first and b.cols[1][0] == -first
        assert len(b) == 100 - int(first)
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


def _rows(
    conn: psycopg.Connection, samples: list[tuple[str, float, list[float | None]]], cols: str = "abc"
) -> list[tuple[object, ...]]:
    """(key, times, values) as _select's query sends them for ``samples`` (key, epoch time, 3 values),
    of the columns ``cols`` of the three."""
    from gpufleet.collector.window_cache import raw_cursor

    conn.execute("CREATE TEMP TABLE IF NOT EXISTS s (k text, time timestamptz, a real, b real, c real)")
    conn.execute("TRUNCATE s")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO s VALUES (%s, to_timestamp(%s), %s, %s, %s)", [(k, t, *v) for k, t, v in samples]
        )
    with raw_cursor(conn) as cur:
        vals = ", ".join(f"COALESCE({c}::float4, 'NaN'::float4)" for c in cols)
        # Each key's rows in insertion order (array_agg follows the scan), as the sample tables send them.
        return cur.execute(
            f"SELECT k, array_agg(time ORDER BY ctid), array_agg(ARRAY[{vals}] ORDER BY ctid) "
            "FROM s GROUP BY k ORDER BY k"
        ).fetchall()


def test_merge_rows_reads_postgres_arrays(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows parsed together land in each key's buffer as they would one by one: times to the
    microsecond, NULL as NaN, times out of order within a row sorted, a column that starts
    reporting stored from then on, an existing buffer appended to; the same whatever the chunking."""
    from gpufleet.collector import window_cache

    nan = np.nan
    t0 = 1_700_000_000.0
    samples: list[tuple[str, float, list[float | None]]] = [
        ("a", t0 + 0.25, [1.0, None, 3.0]),
        ("a", t0 + 1.5, [2.0, None, None]),
        ("b", t0 + 3.0, [5.0, None, None]),
        ("b", t0 + 1.0, [4.0, None, None]),  # out of order
        ("c", t0 + 2.0, [None, None, None]),
        *[("d", t0 + i, [float(i), float(-i), None]) for i in range(40)],
    ]
    rows = _rows(conn, samples)
    for chunk in (262_144, 5, 1):
        monkeypatch.setattr(window_cache, "MERGE_CHUNK_SAMPLES", chunk)
        bufs: dict[object, _Buf] = {
            "b": _Buf(np.array([t0 - 5.0]), np.array([[9], [nan], [nan]], dtype=np.float32))
        }
        n = window_cache.merge_rows(bufs, rows, 3)  # type: ignore[arg-type]
        assert n == len(samples)
        for key in "abcd":
            mine = sorted((t, v) for k, t, v in samples if k == key)
            if key == "b":
                mine = [(t0 - 5.0, [9.0, None, None]), *mine]
            b = bufs[key]
            assert b.t.tolist() == [t for t, _ in mine], (chunk, key)
            want = np.array([[nan if x is None else x for x in v] for _, v in mine], dtype=np.float32).T
            assert np.array_equal(b.cols, want, equal_nan=True), (chunk, key, b.cols, want)
        assert bufs["a"].rows.tolist() == [0, 2] and bufs["b"].rows.tolist() == [0]
        assert bufs["c"].rows.tolist() == [] and bufs["d"].rows.tolist() == [0, 1]
    # Rows again (a re-fetch) change nothing.
    again = window_cache.merge_rows(bufs, rows, 3)  # type: ignore[arg-type]
    assert again == len(samples) and len(bufs["d"]) == 40 and len(bufs["b"]) == 3


def test_merge_rows_appends_to_buffers_that_store_fewer_columns(conn: psycopg.Connection) -> None:
    """A read of some columns appends each row to its buffer's own stored columns, times sorted
    first (PostgreSQL aggregates in scan order); a read column a buffer lacked, now with a value,
    is stored from then on, NaN before; one column a buffer stores but the read lacks reads NaN."""
    from gpufleet.collector import window_cache

    nan = np.nan
    t0 = 1_700_000_000.0
    samples: list[tuple[str, float, list[float | None]]] = [
        ("x", t0 + 2.0, [2.0, None, 20.0]),
        ("x", t0 + 1.0, [1.0, None, 10.0]),  # out of order
        ("y", t0 + 1.0, [3.0, None, None]),
        ("z", t0 + 1.0, [4.0, 7.0, None]),  # starts reporting column 1
        ("w", t0 + 1.0, [5.0, None, None]),
    ]

    def held(*cols: int) -> _Buf:
        full = np.full((4, 1), nan, dtype=np.float32)
        for c in cols:
            full[c, 0] = 100 + c
        return _Buf(np.array([t0]), full)

    bufs = {"x": held(0), "y": held(0), "z": held(0), "w": held(0, 3)}
    # A table of four columns, of which the read asks for the first two (a and b).
    n = window_cache.merge_rows(bufs, _rows(conn, samples, cols="ab"), 4, np.array([0, 1]))  # type: ignore[arg-type]
    assert n == len(samples)
    assert bufs["x"].t.tolist() == [t0, t0 + 1, t0 + 2] and bufs["x"].rows.tolist() == [0]
    assert np.array_equal(bufs["x"].cols[0], [100, 1, 2])
    assert bufs["y"].t.tolist() == [t0, t0 + 1] and np.array_equal(bufs["y"].cols[0], [100, 3])
    assert bufs["z"].rows.tolist() == [0, 1]
    assert np.array_equal(bufs["z"].cols[:2], [[100, 4], [nan, 7]], equal_nan=True)
    assert bufs["w"].rows.tolist() == [0, 3]
    assert np.array_equal(bufs["w"].cols[[0, 3]], [[100, 5], [103, nan]], equal_nan=True)


def test_refresh_forgets_batch_ids_it_cannot_read_again(conn: psycopg.Connection) -> None:
    """Only ids received within the re-read slack are kept: the set does not grow with uptime."""
    conn.execute(
        "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max, received_at) "
        "SELECT id, 'n', 0, 1, now() - age, now() - age, now() - age FROM (VALUES "
        "('a:1', interval '10 min'), ('a:2', interval '30 s')) AS v(id, age)"
    )
    cache = WindowCache(3600.0, loaded=True)
    cache.watermark = conn.execute("SELECT now() - interval '20 min'").fetchone()[0]  # type: ignore[index]
    cache.refresh(conn, time.time())
    assert set(cache.seen) == {"a:1", "a:2"}
    cache.refresh(conn, time.time())  # re-reads from 60 s before the previous refresh
    assert set(cache.seen) == {"a:2"}


def test_refresh_reads_the_held_columns_and_a_new_one_where_it_starts(conn: psycopg.Connection) -> None:
    """A refresh asks only for the columns the window stores; a GPU or host that starts to report
    another one has it read in full, its earlier samples NaN there, its peers untouched."""
    now = int(time.time())

    def write(t0: int, t1: int, gpu_extra: dict[tuple[str, int], str], host_extra: dict[str, str]) -> None:
        for node in ("n1", "n2"):
            conn.execute(
                "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max) "
                "VALUES (%s, %s, 2, 1, to_timestamp(%s), to_timestamp(%s))",
                (f"{node}:{t0}", node, t0, t1 - 1),
            )
            for gpu in (0, 1):
                extra = gpu_extra.get((node, gpu))
                conn.execute(
                    "INSERT INTO gpu_samples (time, node, gpu, util_pct, power_w"
                    + (f", {extra}" if extra else "")
                    + ") SELECT to_timestamp(t), %s, %s, 90, 500"
                    + (", 0.5" if extra else "")
                    + " FROM generate_series(%s::bigint, %s::bigint - 1) t",
                    (node, gpu, t0, t1),
                )
            hx = host_extra.get(node)
            conn.execute(
                "INSERT INTO host_samples (time, node, cpu_user_pct"
                + (f", {hx}" if hx else "")
                + ") SELECT to_timestamp(t), %s, 20"
                + (", 3" if hx else "")
                + " FROM generate_series(%s::bigint, %s::bigint - 1) t",
                (node, t0, t1),
            )

    write(now - 60, now - 10, {}, {})
    cache = WindowCache(600.0)
    cache.refresh(conn, now - 10)  # the load
    cache.refresh(conn, now - 10)  # reads again what was committed just before it (the slack)
    assert {k: b.rows.tolist() for k, b in cache.gpus.items()} == {
        (n, g): [0, 4] for n in ("n1", "n2") for g in (0, 1)
    }
    # n1's GPU 1 starts to report SM activity, n2's host iowait.
    write(now - 10, now, {("n1", 1): "sm_active"}, {"n2": "cpu_iowait_pct"})
    assert cache.refresh(conn, now) == 4 * 10 + 2 * 10
    w = cache.window(now, [], {})
    sm = w.gpus[("n1", 1)].get("sm_active")
    assert np.isnan(sm[:-10]).all() and (sm[-10:] == np.float32(0.5)).all() and len(sm) == 60
    for key in (("n1", 0), ("n2", 0), ("n2", 1)):
        assert "sm_active" not in w.gpus[key].cols and len(w.gpus[key]) == 60
        assert (w.gpus[key].get("util_pct") == 90).all()
    assert (w.hosts["n2"].get("cpu_iowait_pct")[-10:] == 3).all() and "cpu_iowait_pct" not in w.hosts[
        "n1"
    ].cols
    # From now on the new columns are among those read for every GPU and host.
    write(now, now + 5, {("n1", 1): "sm_active", ("n2", 0): "sm_active"}, {})
    cache.refresh(conn, now + 5)
    assert (cache.window(now + 5, [], {}).gpus[("n2", 0)].get("sm_active")[-5:] == np.float32(0.5)).all()


def test_a_window_whose_hosts_report_no_detector_column_refreshes(conn: psycopg.Connection) -> None:
    """Host rows without any column the detectors read make buffers that store no column: a read
    then asks for every column, not for none."""
    now = int(time.time())
    cache = WindowCache(600.0)
    for t0 in (now - 30, now - 20, now - 10):
        conn.execute(
            "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max) "
            "VALUES (%s, 'n', 0, 10, to_timestamp(%s), to_timestamp(%s))",
            (f"n:{t0}", t0, t0 + 9),
        )
        conn.execute(
            "INSERT INTO host_samples (time, node) SELECT to_timestamp(t), 'n' "
            "FROM generate_series(%s::bigint, %s::bigint) t",
            (t0, t0 + 9),
        )
        cache.refresh(conn, t0 + 10)
    assert len(cache.hosts["n"]) == 30 and cache.hosts["n"].rows.tolist() == []


def test_window_reads_are_never_prepared(conn: psycopg.Connection) -> None:
    """The same read every sweep would be prepared by the driver after five, and PostgreSQL would
    then plan it once for any time range: the steady reads stay unprepared, planned each time."""
    now = int(time.time())
    cache = WindowCache(600.0)
    for k in range(8):
        t0 = now - 80 + 5 * k
        conn.execute(
            "INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max) "
            "VALUES (%s, 'n1', 5, 5, to_timestamp(%s), to_timestamp(%s))",
            (f"n1:{t0}", t0, t0 + 4),
        )
        conn.execute(
            "INSERT INTO gpu_samples (time, node, gpu, util_pct) SELECT to_timestamp(t), 'n1', 0, 90 "
            "FROM generate_series(%s::bigint, %s::bigint) t",
            (t0, t0 + 4),
        )
        conn.execute(
            "INSERT INTO host_samples (time, node, cpu_user_pct) SELECT to_timestamp(t), 'n1', 20 "
            "FROM generate_series(%s::bigint, %s::bigint) t",
            (t0, t0 + 4),
        )
        cache.refresh(conn, t0 + 5)
    assert len(cache.window(now - 35, [], {}).gpus[("n1", 0)]) == 40
    prepared = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()]
    assert not [q for q in prepared if "array_agg" in q], prepared
