"""node_activity_1m / _1h: each node's GPU-minutes folded into one row, recounted here from the samples."""

from __future__ import annotations

import random
import struct
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from gpufleet.collector import rollup
from gpufleet.db import activity_sql
from gpufleet.db.policies import backend_of
from gpufleet.store.gpu_states import BUSY_UTIL_PCT

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)

Sample = tuple[datetime, str, int, float | None, float | None, float | None, float | None]


def _f32(x: float | None) -> float | None:
    """The value as the samples' ``real`` columns store it."""
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def _samples(seed: int) -> list[Sample]:
    """Two nodes of 3 GPUs over 70 minutes across an hour boundary, one sample every 10 to 20 s:
    GPU-Util around the busy line, SM activity missing on one node (no DCGM), power now and then absent."""
    rng = random.Random(seed)
    out: list[Sample] = []
    for node in ("n1", "n2"):
        for gpu in range(3):
            t = T0 + timedelta(minutes=30, seconds=rng.uniform(0, 10))
            while t < T0 + timedelta(minutes=100):
                util = rng.choice([0.0, 3.0, BUSY_UTIL_PCT, 9.9, 55.0, 100.0, None])
                sm = None if node == "n2" else rng.random()
                tensor = rng.random() if rng.random() < 0.5 else None
                power = None if rng.random() < 0.1 else rng.uniform(60, 700)
                out.append((t, node, gpu, _f32(util), _f32(sm), _f32(tensor), _f32(power)))
                t += timedelta(seconds=rng.uniform(10, 20))
    return out


def _store(conn: psycopg.Connection, rows: list[Sample]) -> None:
    with conn.cursor().copy(
        "COPY gpu_samples (time, node, gpu, util_pct, sm_active, tensor_active, power_w) FROM STDIN"
    ) as cp:
        for r in rows:
            cp.write_row(r)
    per_node: dict[str, list[datetime]] = defaultdict(list)
    for r in rows:
        per_node[r[1]].append(r[0])
    for node, ts in per_node.items():
        conn.execute(
            "INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)", (node, min(ts), max(ts))
        )


def _expected(rows: list[Sample], width: timedelta) -> dict[tuple[datetime, str], tuple[float, ...]]:
    """Each (bucket, node) of ``width`` recounted: GPU-minutes, busy ones by the minute's mean GPU-Util,
    counts and sums of the values present, summed per-GPU-minute mean power."""
    per_gpu_minute: dict[tuple[datetime, str, int], list[Sample]] = defaultdict(list)
    for r in rows:
        minute = r[0].replace(second=0, microsecond=0)
        per_gpu_minute[(minute, r[1], r[2])].append(r)
    out: dict[tuple[datetime, str], list[float]] = {}
    minutes_seen: dict[tuple[datetime, str], set[datetime]] = defaultdict(set)
    for (minute, node, _gpu), rs in per_gpu_minute.items():
        bucket = T0 + (minute - T0) // width * width
        acc = out.setdefault((bucket, node), [0.0] * 10)
        minutes_seen[(bucket, node)].add(minute)
        utils = [r[3] for r in rs if r[3] is not None]
        sms = [r[4] for r in rs if r[4] is not None]
        tensors = [r[5] for r in rs if r[5] is not None]
        powers = [r[6] for r in rs if r[6] is not None]
        mean_util = sum(utils) / len(utils) if utils else 0.0
        acc[1] += 1
        acc[2] += mean_util >= BUSY_UTIL_PCT
        acc[3] += len(utils)
        acc[4] += sum(utils)
        acc[5] += len(sms)
        acc[6] += sum(sms)
        acc[7] += len(tensors)
        acc[8] += sum(tensors)
        acc[9] += sum(powers) / len(powers) if powers else 0.0
    for key, acc in out.items():
        acc[0] = len(minutes_seen[key])
    return {k: tuple(v) for k, v in out.items()}


def _stored(conn: psycopg.Connection, table: str) -> dict[tuple[datetime, str], tuple[float, ...]]:
    rows = conn.execute(f"SELECT bucket, node, {activity_sql.NAMES} FROM {table}").fetchall()
    return {(r[0], r[1]): tuple(float(x) for x in r[2:]) for r in rows}


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        assert got[key] == pytest.approx(w, rel=1e-9, abs=1e-9), key


def test_minutes_and_hours_recount_from_the_samples(conn: psycopg.Connection) -> None:
    rows = _samples(1)
    _store(conn, rows)
    rollup.drain(conn, 60.0, plain_stats=backend_of(conn) != "timescaledb")
    _same(_stored(conn, "node_activity_1m"), _expected(rows, timedelta(minutes=1)))
    hours = _expected(rows, timedelta(hours=1))
    assert len(hours) == 4  # two nodes, two hours: the hour boundary is crossed
    _same(_stored(conn, "node_activity_1h"), hours)


def test_late_samples_rebuild_only_what_they_touch(conn: psycopg.Connection) -> None:
    """Samples arriving late and in pieces give the rows of the whole set at once: each piece rebuilds
    its node's minutes and hours, and the other node's rows are left as they were."""
    rows = _samples(2)
    rng = random.Random(3)
    rng.shuffle(rows)
    plain = backend_of(conn) != "timescaledb"
    for k in range(0, len(rows), len(rows) // 5 + 1):
        _store(conn, rows[k : k + len(rows) // 5 + 1])
        rollup.drain(conn, 60.0, plain_stats=plain)
    _same(_stored(conn, "node_activity_1m"), _expected(rows, timedelta(minutes=1)))
    _same(_stored(conn, "node_activity_1h"), _expected(rows, timedelta(hours=1)))
    before = _stored(conn, "node_activity_1h")
    late = (T0 + timedelta(minutes=45, seconds=5), "n1", 0, 100.0, 1.0, None, 5000.0)
    _store(conn, [late])
    rollup.drain(conn, 60.0, plain_stats=plain)
    after = _stored(conn, "node_activity_1h")
    assert after[(T0, "n2")] == before[(T0, "n2")]
    _same(after, _expected([*rows, late], timedelta(hours=1)))
