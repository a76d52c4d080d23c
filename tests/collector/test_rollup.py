"""Rollups: exact interval energy per minute/hour, recomputed for late data."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg

from gpufleet.collector import rollup
from gpufleet.db.policies import backend_of


def PLAIN(conn: psycopg.Connection) -> bool:
    return backend_of(conn) != "timescaledb"


T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def insert_gpu(
    conn: psycopg.Connection, rows: list[tuple[float, int, float | None, int | None]], node: str = "n1"
) -> None:
    """rows: (seconds after T0, gpu, power_w, energy_mj)."""
    with conn.cursor().copy("COPY gpu_samples (time, node, gpu, power_w, energy_mj) FROM STDIN") as cp:
        for s, g, p, e in rows:
            cp.write_row((T0 + timedelta(seconds=s), node, g, p, e))
    lo = T0 + timedelta(seconds=min(r[0] for r in rows))
    hi = T0 + timedelta(seconds=max(r[0] for r in rows))
    conn.execute("INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)", (node, lo, hi))


def minutes(conn: psycopg.Connection, gpu: int = 0) -> dict[int, tuple[float, float]]:
    rows = conn.execute(
        "SELECT bucket, energy_j, covered_s FROM gpu_energy_1m WHERE gpu = %s ORDER BY bucket", (gpu,)
    ).fetchall()
    return {int((b - T0).total_seconds() // 60): (e, c) for b, e, c in rows}


def test_constant_power_spread_over_minutes(conn: psycopg.Connection) -> None:
    # 100 W every 10 s for 3 minutes, power only
    insert_gpu(conn, [(s, 0, 100.0, None) for s in range(0, 181, 10)])
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    m = minutes(conn)
    assert sorted(m) == [0, 1, 2]
    for e, c in m.values():
        assert abs(e - 6000.0) < 1e-6 and abs(c - 60.0) < 1e-9
    hour = conn.execute("SELECT energy_j, covered_s FROM gpu_energy_1h").fetchall()
    assert hour == [(18000.0, 180.0)]
    if not PLAIN(conn):
        conn.execute("CALL refresh_continuous_aggregate('gpu_stats_1m', NULL, NULL)")
    stats = conn.execute("SELECT samples, power_w FROM gpu_stats_1m ORDER BY bucket").fetchall()
    assert stats[0] == (6, 100.0)


def test_counter_wins_and_interval_is_split_at_the_edge(conn: psycopg.Connection) -> None:
    # samples at 50 s and 70 s: counter says 2000 J; split 10 s / 10 s across minutes 0 and 1
    insert_gpu(conn, [(50, 0, 999.0, 1_000_000), (70, 0, 999.0, 3_000_000)])
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    m = minutes(conn)
    assert m == {0: (1000.0, 10.0), 1: (1000.0, 10.0)}


def test_reset_falls_back_to_power_and_long_gap_is_not_bridged_by_power(conn: psycopg.Connection) -> None:
    insert_gpu(
        conn,
        [
            (0, 0, 100.0, 5_000_000),
            (10, 0, 100.0, 1_000),  # reset -> power: 1000 J
            (200, 0, 100.0, None),
        ],
    )  # 190 s gap, no counter at one end -> not counted
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    total = conn.execute("SELECT sum(energy_j), sum(covered_s) FROM gpu_energy_1m").fetchone()
    assert total == (1000.0, 10.0)


def test_counter_bridges_a_long_gap(conn: psycopg.Connection) -> None:
    # one span row for the hour-long counter interval, not 60 minute rows (tests/accounting/
    # test_long_counter_gaps.py: accounting reads its share from there)
    insert_gpu(conn, [(0, 0, 100.0, 0), (3600, 0, 100.0, 360_000_000)])
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    assert conn.execute("SELECT count(*) FROM gpu_energy_1m").fetchone() == (0,)
    spans = conn.execute("SELECT t0, t1, energy_j FROM gpu_energy_spans").fetchall()
    assert spans == [(T0, T0 + timedelta(seconds=3600), 360_000.0)]


def test_late_and_shuffled_arrival_gives_the_same_rollups(conn: psycopg.Connection) -> None:
    rng = random.Random(7)
    rows = [
        (s + rng.random(), g, 200.0 + 50 * rng.random(), None if rng.random() < 0.2 else 1000 * s * 300 + g)
        for s in range(0, 600, 7)
        for g in range(2)
    ]
    # all at once
    insert_gpu(conn, rows)
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    expected = conn.execute(
        "SELECT bucket, gpu, energy_j, covered_s FROM gpu_energy_1m ORDER BY 1, 2"
    ).fetchall()
    expected_h = conn.execute("SELECT bucket, gpu, energy_j FROM gpu_energy_1h ORDER BY 1, 2").fetchall()
    conn.execute("TRUNCATE gpu_samples, gpu_energy_1m, gpu_energy_1h, rollup_queue")
    # in shuffled chunks, rolling up between chunks
    rng.shuffle(rows)
    for i in range(0, len(rows), 13):
        insert_gpu(conn, rows[i : i + 13])
        if i % 3 == 0:
            rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    got = conn.execute("SELECT bucket, gpu, energy_j, covered_s FROM gpu_energy_1m ORDER BY 1, 2").fetchall()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a[:2] == b[:2] and abs(a[2] - b[2]) < 1e-6 and abs(a[3] - b[3]) < 1e-6
    got_h = conn.execute("SELECT bucket, gpu, energy_j FROM gpu_energy_1h ORDER BY 1, 2").fetchall()
    assert [(a, b) for a, b, _ in got_h] == [(a, b) for a, b, _ in expected_h]
    assert all(abs(x[2] - y[2]) < 1e-6 for x, y in zip(got_h, expected_h, strict=True))


def test_host_energy(conn: psycopg.Connection) -> None:
    with conn.cursor().copy("COPY host_samples (time, node, host_power_w) FROM STDIN") as cp:
        for s in range(0, 121, 30):
            cp.write_row((T0 + timedelta(seconds=s), "n1", 300.0))
    conn.execute(
        "INSERT INTO rollup_queue (node, t_min, t_max) VALUES ('n1', %s, %s)",
        (T0, T0 + timedelta(seconds=120)),
    )
    rollup.drain(conn, 60.0, plain_stats=PLAIN(conn))
    assert conn.execute("SELECT sum(energy_j), sum(covered_s) FROM host_energy_1m").fetchone() == (
        36000.0,
        120.0,
    )
    assert conn.execute("SELECT energy_j FROM host_energy_1h").fetchone() == (36000.0,)
