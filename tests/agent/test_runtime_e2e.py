"""The agent end to end: fake NVML and the host source into the real collector and PostgreSQL."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpufleet.agent.runtime import Agent
from gpufleet.agent.shipper import Verdict
from gpufleet.agent.sources.base import Source
from gpufleet.agent.sources.host import HostSource
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.config import AgentSettings
from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml
from tests.collector.conftest import Collector, collector  # noqa: F401  (the fixture)


def agent_for(c: Collector, spool: Path, **kw: Any) -> Agent:
    s = AgentSettings.model_validate(
        {
            "collector_url": c.url,
            "token": c.tokens["node-a"],
            "interval_s": 0.1,
            "ship_interval_s": 0.3,
            "metrics_port": 0,
            "start_jitter_s": 0.0,
            "attribute_processes": False,
            **kw,
        }
    )
    fake = FakeNvml([H100_SXM, H100_SXM])
    for g in fake.gpus:
        g.load()
    sources: list[Source] = [NvmlSource(fake, sys_root="/nonexistent"), HostSource("/proc", None)]
    return Agent(s, sources, node="node-a", spool_dir=spool)


def rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_agent_samples_land_in_the_collector(collector: Collector, tmp_path: Path) -> None:  # noqa: F811
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("run-42\n")
    agent = agent_for(collector, tmp_path / "spool", job_files_dir=str(jobs)).start()
    stop = threading.Event()
    th = threading.Thread(target=agent.run, args=(stop,))
    th.start()
    time.sleep(1.5)
    stop.set()
    th.join(5)
    assert agent.shutdown(ship_s=5) is True
    s = agent.spool.stats
    assert s.spooled > 0 and s.delivered == s.spooled and agent.spool.pending_samples == 0
    n_gpu = rows(collector.db, "SELECT count(*) FROM gpu_samples WHERE node = 'node-a'")[0][0]
    n_host = rows(collector.db, "SELECT count(*) FROM host_samples WHERE node = 'node-a'")[0][0]
    assert n_gpu == 2 * n_host and n_gpu + n_host == s.delivered
    # Every tick stamped once, no duplicates, NVML values in catalog units, attribution applied.
    assert (
        rows(
            collector.db,
            "SELECT count(*) FROM (SELECT time, gpu FROM gpu_samples GROUP BY 1, 2 HAVING count(*) > 1) d",
        )[0][0]
        == 0
    )
    by_gpu = dict(rows(collector.db, "SELECT gpu, max(run_id) FROM gpu_samples GROUP BY gpu"))
    assert by_gpu == {0: None, 1: "run-42"}
    power = rows(collector.db, "SELECT min(power_w), max(power_w), max(mem_total_mib) FROM gpu_samples")[0]
    assert power[0] > 588 and power[1] < 589 and power[2] == 81559
    facts = rows(collector.db, "SELECT facts FROM nodes WHERE node = 'node-a'")[0][0]
    assert facts["driver_version"] == "590.48.01" and facts["gpu_count"] == 2 and "cpu_count" in facts
    assert agent.metrics.value("gpufleet_agent_batches_sent_total", status="stored") >= 3


def test_a_resent_batch_is_deduplicated(collector: Collector, tmp_path: Path) -> None:  # noqa: F811
    spool = tmp_path / "spool"
    agent = agent_for(collector, spool).start(ship=False, serve_metrics=False)
    for _ in range(3):
        agent.tick()
        time.sleep(0.1)
    agent.seal()
    (sealed,) = spool.glob("*.seg")
    kept = tmp_path / sealed.name
    shutil.copy(sealed, kept)
    assert agent.shipper is not None
    first = agent.shipper.ship_one()
    assert first is not None and first.verdict is Verdict.DELIVERED and first.status == "stored"
    agent.shutdown(ship_s=0)
    stored = rows(collector.db, "SELECT count(*) FROM gpu_samples")[0][0]
    assert stored == 6
    # A crash after the collector's 200 but before the delete: the segment is still there on restart.
    shutil.copy(kept, sealed)
    again = agent_for(collector, spool).start(ship=False, serve_metrics=False)
    assert again.shipper is not None
    second = again.shipper.ship_one()
    assert second is not None and second.verdict is Verdict.DELIVERED and second.status == "duplicate"
    assert rows(collector.db, "SELECT count(*) FROM gpu_samples")[0][0] == stored
    assert again.spool.sealed_count == 0
    assert again.metrics.value("gpufleet_agent_batches_sent_total", status="duplicate") == 1
    again.shutdown(ship_s=0)


def test_collector_outage_is_bridged_by_the_spool(collector: Collector, tmp_path: Path) -> None:  # noqa: F811
    # The agent starts while the collector is unreachable, spools, then delivers everything once it is back.
    agent = agent_for(collector, tmp_path / "spool", retry_base_s=0.05, retry_max_s=0.2)
    agent.start(serve_metrics=False)
    assert agent.shipper is not None
    good_url = agent.shipper.url
    agent.shipper.url = "http://127.0.0.1:9/v1/ingest"  # nothing listens there
    stop = threading.Event()
    th = threading.Thread(target=agent.run, args=(stop,))
    th.start()
    time.sleep(1.0)
    assert agent.spool.sealed_count >= 2
    assert agent.metrics.value("gpufleet_agent_batches_retried_total", reason="connection") >= 1
    agent.shipper.url = good_url
    deadline = time.monotonic() + 10
    while agent.spool.sealed_count and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    th.join(5)
    assert agent.shutdown(ship_s=5) is True
    s = agent.spool.stats
    n = rows(collector.db, "SELECT (SELECT count(*) FROM gpu_samples) + (SELECT count(*) FROM host_samples)")[
        0
    ][0]
    assert n == s.spooled == s.delivered


def test_shipments_a_ship_interval_apart_keep_one_connection(collector: Collector, tmp_path: Path) -> None:  # noqa: F811
    """With both ends at their defaults, the agent's next batch, a ship interval
    and then some later, goes over the connection the last one used: the
    collector holds it (``ingest.keep_alive_s``) and so does the agent
    (``keepalive_s``).  At httpx's and uvicorn's own 5-s defaults, equal to the
    ship interval, the connection was gone by then and every shipment paid a
    new connection (over TLS, a handshake)."""
    agent = agent_for(collector, tmp_path / "spool", ship_interval_s=AgentSettings().ship_interval_s)
    agent.start(ship=False, serve_metrics=False)
    assert agent.shipper is not None
    live = collector.server.server.server_state.connections

    def ship() -> None:
        agent.tick()
        agent.seal()
        assert agent.shipper is not None
        attempt = agent.shipper.ship_one()
        assert attempt is not None and attempt.verdict is Verdict.DELIVERED

    ship()
    first = set(live)
    assert len(first) == 1
    time.sleep(AgentSettings().ship_interval_s + 0.5)
    ship()
    assert set(live) == first
    agent.shutdown(ship_s=1)


def test_a_keepalive_not_longer_than_the_ship_interval_is_warned_about(
    collector: Collector,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = agent_for(collector, tmp_path / "spool", ship_interval_s=5.0, keepalive_s=5.0)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.runtime"):
        agent.start(ship=False, serve_metrics=False)
    agent.shutdown(ship_s=0.5)
    assert "every shipment opens a new connection" in caplog.text
