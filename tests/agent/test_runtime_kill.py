"""A real agent process killed with SIGKILL mid-run, then restarted: at most ~1 s lost, nothing stored twice."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from gpufleet.agent.spool import read_records
from tests.collector.conftest import Collector, collector  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.2


def start_agent(c: Collector, tmp_path: Path, log_name: str) -> subprocess.Popen[bytes]:
    token = tmp_path / "token"
    token.write_text(c.tokens["node-a"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_DATA_DIR"] = str(tmp_path / "data")
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.cli",
        "agent",
        "--fake-nvml",
        "2",
        "--source",
        "host",
        "--node",
        "node-a",
        "--collector-url",
        c.url,
        "--token-file",
        str(token),
        "--spool-dir",
        str(tmp_path / "spool"),
        "--interval",
        str(INTERVAL_S),
        "--ship-interval",
        "1",
        "--metrics-port",
        "0",
    ]
    log = open(tmp_path / log_name, "wb")  # noqa: SIM115  (closed with the process)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def gpu0_times(db: str) -> list[float]:
    with psycopg.connect(db) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT extract(epoch FROM time)::float8 FROM gpu_samples WHERE node = 'node-a' AND gpu = 0 "
                "ORDER BY time"
            ).fetchall()
        ]


def wait_for(pred: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_kill_9_loses_at_most_the_current_tick_and_duplicates_nothing(
    collector: Collector,  # noqa: F811
    tmp_path: Path,
) -> None:
    first = start_agent(collector, tmp_path, "first.log")
    try:
        wait_for(lambda: len(gpu0_times(collector.db)) >= 5, 30)
        time.sleep(2.3)  # mid-segment: some ticks are only in the open segment
        t_kill = time.time()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    (open_segment,) = (tmp_path / "spool").glob("*.open")
    in_open = [r["t"] for r in read_records(open_segment.read_bytes()).records]

    second = start_agent(collector, tmp_path, "second.log")
    try:
        wait_for(lambda: any(t > t_kill + 0.5 for t in gpu0_times(collector.db)), 30)
        time.sleep(1.5)
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
    finally:
        if second.poll() is None:
            second.kill()

    times = gpu0_times(collector.db)
    before = [t for t in times if t <= t_kill]
    after = [t for t in times if t > t_kill]
    # Everything the first process sampled up to the kill arrived, except at most the tick being
    # written -- including the ticks that were only in the open segment when it died.
    assert t_kill - before[-1] <= 1.0, (t_kill, before[-3:])
    assert in_open and all(any(abs(t - s) < 1e-4 for s in before) for t in in_open)
    gaps = [b - a for a, b in itertools.pairwise(before)]
    assert max(gaps) < 3 * INTERVAL_S, max(gaps)
    assert after, "the restarted agent shipped nothing"
    with psycopg.connect(collector.db) as conn:
        dup_gpu = conn.execute("SELECT count(*) - count(DISTINCT (time, gpu)) FROM gpu_samples").fetchone()
        dup_host = conn.execute("SELECT count(*) - count(DISTINCT time) FROM host_samples").fetchone()
    assert dup_gpu == (0,) and dup_host == (0,)
    # The graceful stop shipped everything, including the segment the kill left open.
    assert not list((tmp_path / "spool").glob("*.seg")) and not list((tmp_path / "spool").glob("*.open"))
