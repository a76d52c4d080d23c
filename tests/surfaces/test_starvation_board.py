"""The starvation board's GPU-Util of starved runs: each run's own GPUs, over the run's own window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from gpufleet.collector import rollup
from gpufleet.dashboards.dryrun import run_dashboard
from gpufleet.dashboards.loader import load_all
from gpufleet.dashboards.macros import TimeRange
from gpufleet.db.policies import backend_of

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _fill(conn: psycopg.Connection) -> None:
    """n1/0 is held by run 'fed' (starved) for 10 minutes at 30 % GPU-Util, then by run 'next' (never
    starved) at 90 %; n2/0 by run 'other' (never starved) throughout at 50 %."""
    conn.execute(
        "INSERT INTO runs (run_id, team, start, \"end\") VALUES ('fed', 't', %(t0)s, %(t10)s), "
        "('next', 't', %(t10)s, %(t20)s), ('other', 't', %(t0)s, %(t20)s)",
        {"t0": T0, "t10": T0 + timedelta(minutes=10), "t20": T0 + timedelta(minutes=20)},
    )
    conn.execute(
        "INSERT INTO run_allocations (run_id, node, gpu) VALUES ('fed', 'n1', 0), ('next', 'n1', 0), "
        "('other', 'n2', 0)"
    )
    conn.execute(
        'INSERT INTO incidents (kind, scope_key, run_id, cause, severity, state, start, "end", last_seen, '
        "evidence) VALUES ('starvation', 's:fed', 'fed', 'cpu', 'warning', 'resolved', %s, %s, %s, "
        "'{\"gpu_time_lost_share\": 0.5}')",
        (T0 + timedelta(minutes=2), T0 + timedelta(minutes=8), T0 + timedelta(minutes=8)),
    )
    rows = []
    for k in range(0, 20 * 60, 10):
        t = T0 + timedelta(seconds=k)
        rows.append((t, "n1", 0, 30.0 if k < 600 else 90.0))
        rows.append((t, "n2", 0, 50.0))
    with conn.cursor().copy("COPY gpu_samples (time, node, gpu, util_pct) FROM STDIN") as cp:
        for r in rows:
            cp.write_row(r)
    for node in ("n1", "n2"):
        conn.execute(
            "INSERT INTO rollup_queue (node, t_min, t_max) VALUES (%s, %s, %s)",
            (node, T0, T0 + timedelta(minutes=20)),
        )
    rollup.drain(conn, 60.0, plain_stats=backend_of(conn) != "timescaledb")
    if backend_of(conn) == "timescaledb":
        conn.execute("CALL refresh_continuous_aggregate('gpu_stats_1m', NULL, NULL)")


@pytest.mark.parametrize("interval_ms", [10_000, 60_000], ids=["raw", "rollup"])
def test_starved_runs_gpu_util_is_their_own(conn: psycopg.Connection, interval_ms: int) -> None:
    _fill(conn)
    rng = TimeRange(T0, T0 + timedelta(minutes=20))
    results = run_dashboard(conn, load_all()["gpufleet-starvation"], rng, interval_ms=interval_ms)
    (r,) = [x for x in results if x.title == "GPU-Util of starved runs"]
    assert r.error is None
    series = {(row[1], row[0]): row[2] for row in r.rows}
    assert {run for run, _ in series} == {"fed"}, "only the starved run, not the runs that held its GPUs"
    times = sorted(float(t) for _, t in series)
    assert times[0] == T0.timestamp() and times[-1] < (T0 + timedelta(minutes=10)).timestamp()
    assert len(times) == 600 * 1000 // interval_ms
    assert set(series.values()) == {30.0}
