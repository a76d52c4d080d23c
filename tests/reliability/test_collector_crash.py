"""Scenario 1: the collector is killed -9 repeatedly while a fleet ships.

A 2xx is sent only after COMMIT, and agents resend every segment until one
arrives, so a crash at any point (mid-COPY, between COMMIT and the answer,
with a queue of waiting requests) may cost a resend but never a sample, and
the batch-id registry turns resends into ``duplicate`` answers instead of
second copies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.reliability.conftest import knob, node_tokens
from testsupport.fleet import Fleet
from testsupport.oracle import integrity
from testsupport.procs import CollectorProc


def test_collector_kill9_loses_and_duplicates_nothing(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    n_agents = int(knob("s1_agents", 10, 50))
    target = int(knob("s1_samples", 30_000, 1_000_000))
    kills = int(knob("s1_kills", 3, 5))
    interval = knob("s1_interval", 0.1, 0.1)
    tokens = node_tokens(fresh_db, [f"crash-{i:03d}" for i in range(n_agents)])
    col = collectors(fresh_db)
    col.start().wait_up()
    fleet = Fleet(
        tokens,
        col.url,
        tmp_path / "spools",
        interval_s=interval,
        ship_interval_s=0.5,
        retry_base_s=0.1,
        retry_max_s=1.0,
    )
    restarts: list[float] = []
    down_s: list[float] = []
    try:
        fleet.start()
        for k in range(1, kills + 1):
            goal = target * k // kills
            while fleet.totals().spooled < goal:
                assert col.alive(), col.tail()
                time.sleep(0.2)
            col.kill()  # mid-ingest: requests in flight, a group maybe mid-COPY
            t_kill = time.monotonic()
            if k == kills:
                fleet.stop_sampling()
            time.sleep(1.0)
            col.start().wait_up()
            restarts.append(time.monotonic())
            down_s.append(restarts[-1] - t_kill)
        drain_s = fleet.wait_drained(timeout=90)
        tot = fleet.totals()
        result = integrity(fresh_db, fleet.oracle)
    finally:
        fleet.close()
    figures.update(
        agents=n_agents,
        kills=kills,
        collector_down_s=[round(d, 1) for d in down_s],
        drained_after_last_restart_s=round(drain_s, 1),
        spooled=tot.spooled,
        delivered=tot.delivered,
        dropped=tot.dropped,
        **result.as_dict(),
    )
    assert col.starts == kills + 1
    assert tot.spooled >= target
    assert result.acked_samples == tot.delivered == tot.spooled
    assert tot.dropped == 0 and tot.pending == 0
    assert result.missing_samples == 0 and result.missing_batches == 0
    assert result.duplicate_rows == 0
    assert result.rows["gpu_samples"] + result.rows["host_samples"] == result.acked_samples
    assert drain_s <= 60
