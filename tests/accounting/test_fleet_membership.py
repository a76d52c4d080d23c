"""GPU time without telemetry counts from when a GPU joined the fleet until it left (issue 35 item 3).

Before, every GPU ever seen counted over the whole period: a fleet of 2 GPUs whose first sample was 30 minutes
old showed 2.97 GPU-hours with no telemetry for the last 2 hours, and a month before a fleet existed was
thousands of "no telemetry" GPU-hours.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from gpufleet.accounting import fleet_accounting
from tests.accounting.builders import T0, at, drain, gpu_samples, node, run


def _since(t: datetime) -> float:
    return (t - T0).total_seconds()


def test_a_thirty_minute_old_fleet_has_no_telemetry_gap_before_it_existed(conn: psycopg.Connection) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    first = now - timedelta(minutes=30)
    # what ingest writes for a new node: first_seen when its first batch came, its samples every 10 s
    conn.execute(
        "INSERT INTO nodes (node, first_seen, last_seen, gpu_count) VALUES ('n1', %s, %s, 2)", (first, now)
    )
    gpu_samples(conn, [(_since(first) + 10 * k, "n1", g, 300.0, None) for g in (0, 1) for k in range(181)])
    f = fleet_accounting(conn, now - timedelta(hours=2), now, now=now, source="raw")
    assert f["no_telemetry"]["gpu_hours"] <= 1.0  # the target; here it is none at all
    assert f["no_telemetry"]["gpu_hours"] < 1e-6
    assert abs(f["total"]["gpu_hours"] - 1.0) < 1e-6  # 2 GPUs x 30 min, not x 2 h
    assert abs(f["unallocated"]["gpu_hours"] - 1.0) < 1e-6 and f["total"]["coverage"] > 0.999
    drain(conn)
    rolled = fleet_accounting(conn, now - timedelta(hours=2), now, now=now, source="auto")
    assert abs(rolled["total"]["gpu_hours"] - 1.0) < 1e-6 and rolled["no_telemetry"]["gpu_hours"] < 1e-6


def test_a_month_before_the_fleet_existed_has_no_gpu_time(conn: psycopg.Connection) -> None:
    node(conn, "n1", 8)
    gpu_samples(conn, [(float(t), "n1", g, 400.0, None) for g in range(8) for t in range(0, 3601, 10)])
    f = fleet_accounting(conn, T0 - timedelta(days=30), T0, now=at(3600), source="raw")
    assert f["total"]["gpu_hours"] == 0.0 and f["no_telemetry"]["gpu_hours"] == 0.0
    month = fleet_accounting(
        conn, T0 - timedelta(days=30), T0 + timedelta(days=1), now=at(3600), source="raw"
    )
    assert abs(month["total"]["gpu_hours"] - 8.0) < 1e-6 and month["total"]["coverage"] > 0.999


def test_a_gpu_joins_when_first_seen_and_a_run_registers_it_earlier(conn: psycopg.Connection) -> None:
    node(conn, "n1", 2)
    # GPU 0 reports from 0 s; GPU 1 only from 1800 s, but a run held it from 600 s (registration counts)
    gpu_samples(
        conn,
        [(float(t), "n1", 0, 300.0, None) for t in range(0, 3601, 10)]
        + [(float(t), "n1", 1, 300.0, None) for t in range(1800, 3601, 10)],
    )
    run(conn, "r", 600, 1200, {"n1": [1]})
    f = fleet_accounting(conn, at(-3600), at(3600), now=at(3600), source="raw")
    # GPU 0: 1 h; GPU 1: from 600 s (the run) = 3000 s, of which 600 s held by the run, 600 s dark
    assert abs(f["total"]["gpu_hours"] - (3600 + 3000) / 3600) < 1e-6
    assert abs(f["runs"]["gpu_hours"] - 600 / 3600) < 1e-6
    assert abs(f["no_telemetry"]["gpu_hours"] - 600 / 3600) < 1e-6
    runs, idle, dark, total = (f[k]["gpu_hours"] for k in ("runs", "unallocated", "no_telemetry", "total"))
    assert abs(runs + idle + dark - total) < 1e-9


def test_a_gpu_silent_past_the_horizon_has_left(conn: psycopg.Connection) -> None:
    """Silence up to ``gone_after_s`` is GPU time without telemetry (an agent down: SREs must see it); past it
    the GPU has left (a node retired or taken away) and counts nowhere."""
    node(conn, "n1", 1)
    gpu_samples(conn, [(float(t), "n1", 0, 300.0, None) for t in range(0, 3601, 10)])
    now = at(3 * 86400)
    f = fleet_accounting(conn, at(0), now, now=now, source="raw", gone_after_s=86400)
    # member from 0 to a day after its last sample (3600 s): 1 h with telemetry, 24 h without
    assert abs(f["total"]["gpu_hours"] - 25.0) < 1e-6 and abs(f["no_telemetry"]["gpu_hours"] - 24.0) < 1e-6
    longer = fleet_accounting(conn, at(0), now, now=now, source="raw", gone_after_s=7 * 86400)
    assert abs(longer["total"]["gpu_hours"] - 72.0) < 1e-6  # not gone yet: silent all the way to now
    # heard from again: it is back, and its silence is a gap again
    gpu_samples(conn, [(3 * 86400 - 60.0 + t, "n1", 0, 300.0, None) for t in (0, 10)])
    back = fleet_accounting(conn, at(0), now, now=now, source="raw", gone_after_s=86400)
    assert abs(back["total"]["gpu_hours"] - 72.0) < 1e-6


def test_a_gpu_nothing_was_ever_heard_of_has_not_joined(conn: psycopg.Connection) -> None:
    """A node's GPU count names GPUs 0-3; two of them never reported, never ran anything, and the node has no
    registration time: they are not in the fleet (not 4 GPUs' worth of no telemetry)."""
    node(conn, "n1", 4)
    gpu_samples(conn, [(float(t), "n1", g, 300.0, None) for g in (0, 1) for t in range(0, 3601, 10)])
    f = fleet_accounting(conn, at(0), at(3600), now=at(3600), source="raw")
    assert abs(f["total"]["gpu_hours"] - 2.0) < 1e-6 and f["no_telemetry"]["gpu_hours"] < 1e-6
