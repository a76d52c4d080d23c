"""Scenario 2: the database crashes (``pg_ctl stop -m immediate``) mid-ingest and comes back.

With ``synchronous_commit = on`` a COMMIT that returned is in the WAL, and the
collector answers 2xx only after COMMIT returned, so crash recovery must give
back every acknowledged row.  While the database is away the collector says
so: readiness false, ingest 503 with Retry-After (agents back off and keep
their spools), and it recovers on its own when the database returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from gpufleet.config import Settings
from gpufleet.db import migrate
from tests.reliability.conftest import gpu_batch, knob, node_tokens, post
from testsupport.fleet import Fleet
from testsupport.oracle import integrity
from testsupport.pgcluster import pg_cluster
from testsupport.procs import CollectorProc


def _ready(url: str) -> bool | None:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return None


def _wait(pred: Callable[[], bool], timeout: float, step: float = 0.1) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def test_database_crash_loses_no_acknowledged_row(
    tmp_path: Path, settings: Settings, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    n_agents = int(knob("s2_agents", 6, 50))
    before_s = knob("s2_ingest_before_s", 6, 60)
    outage_s = knob("s2_outage_s", 8, 60)
    with pg_cluster() as pg:
        url = pg.url()
        migrate.upgrade(url, settings)
        with psycopg.connect(url) as c:
            assert c.execute("SHOW synchronous_commit").fetchone() == ("on",)
        tokens = node_tokens(url, [f"db-{i:02d}" for i in range(n_agents)])
        probe_node, probe_token = next(iter(tokens.items()))
        col = collectors(url)
        col.start().wait_up()
        fleet = Fleet(
            tokens,
            col.url,
            tmp_path / "spools",
            interval_s=0.1,
            ship_interval_s=0.5,
            retry_base_s=0.1,
            retry_max_s=1.0,
        )
        statuses_down: list[tuple[int, str | None]] = []
        try:
            fleet.start()
            time.sleep(before_s)
            acked_before = fleet.oracle.samples
            pg.stop("immediate")
            t_down = time.monotonic()
            not_ready_s = _wait(lambda: _ready(col.url) is False, 10)
            seq = 0
            while time.monotonic() - t_down < outage_s:
                seq += 1
                r = post(col.url, probe_token, gpu_batch(f"probe:down:{seq}", probe_node))
                statuses_down.append((r.status_code, r.headers.get("retry-after")))
                time.sleep(0.5)
            pg.start()
            seq = 0

            def ingests() -> bool:
                nonlocal seq
                seq += 1
                return post(col.url, probe_token, gpu_batch(f"probe:up:{seq}", probe_node)).status_code == 200

            resumed_s = _wait(ingests, 60, step=0.2)
            ready_again_s = _wait(lambda: _ready(col.url) is True, 30)
            time.sleep(2)
            fleet.stop_sampling()
            drain_s = fleet.wait_drained(timeout=90)
            tot = fleet.totals()
            result = integrity(url, fleet.oracle)
        finally:
            fleet.close()
            col.kill()
    figures.update(
        agents=n_agents,
        acked_before_crash=acked_before,
        readyz_false_after_s=round(not_ready_s, 2),
        statuses_while_down=sorted({s for s, _ in statuses_down}),
        retry_after_while_down=sorted({ra for _, ra in statuses_down if ra}),
        ingest_resumed_after_db_up_s=round(resumed_s, 2),
        ready_after_db_up_s=round(ready_again_s, 2),
        drain_s=round(drain_s, 1),
        spooled=tot.spooled,
        delivered=tot.delivered,
        **result.as_dict(),
    )
    assert acked_before > 0
    assert not_ready_s <= 5
    assert statuses_down and all(s == 503 and ra for s, ra in statuses_down), statuses_down
    assert resumed_s <= 30
    assert result.missing_samples == 0 and result.missing_batches == 0 and result.duplicate_rows == 0
    assert tot.dropped == 0 and tot.delivered == tot.spooled == result.acked_samples
