"""A fleet of real agents on fake GPUs, in this process, shipping to a collector.

Every agent is the production :class:`gpufleet.agent.runtime.Agent` (scheduler,
spool, shipper, backoff) over the fake NVML H100s and the real host source;
only the tick is faster than in production so that a test moves many
samples in little time.  The :class:`~testsupport.oracle.Oracle` sees
each acknowledgement as it happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.runtime import Agent
from gpufleet.agent.sources.base import Source
from gpufleet.agent.sources.registry import build_source
from gpufleet.config import AgentSettings
from gpufleet.sim.nvml_fake import fake_nvml_source
from testsupport.oracle import Oracle


def agent_settings(url: str, token: str, **kw: Any) -> AgentSettings:
    """Settings of a test agent: fast ticks, short backoff, no /metrics port, no process scan."""
    values: dict[str, Any] = {
        "collector_url": url,
        "token": token,
        "interval_s": 0.2,
        "ship_interval_s": 1.0,
        "retry_base_s": 0.2,
        "retry_max_s": 2.0,
        "request_timeout_s": 5.0,
        "metrics_port": 0,
        "attribute_processes": False,
        "shutdown_ship_s": 0.0,
    }
    values.update(kw)
    return AgentSettings(**values)


def _facts(facts: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    return lambda: dict(facts)


@dataclass
class Totals:
    spooled: int
    delivered: int
    dropped: int
    pending: int
    dead_lettered_batches: int


class Fleet:
    def __init__(
        self,
        tokens: dict[str, str],
        url: str,
        spool_root: Path,
        *,
        gpus: int = 8,
        host: bool = True,
        facts: dict[str, dict[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        """``facts``: node facts to report for some nodes (e.g. a ``powersave``
        governor, so the detectors have something to open incidents on)."""
        self.oracle = Oracle()
        self.agents: list[Agent] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for node, token in tokens.items():
            s = agent_settings(url, token, **settings)
            sources: list[Source] = [fake_nvml_source(gpus)]
            if host:
                sources.append(build_source("host", s))
            node_facts = {"fleet": "test", **(facts or {}).get(node, {})}
            a = Agent(s, sources, node=node, spool_dir=spool_root / node, facts_of_node=_facts(node_facts))
            self.agents.append(a)

    def start(self) -> Fleet:
        for a in self.agents:
            a.start(serve_metrics=False)
            assert a.shipper is not None
            self.oracle.watch(a.spool)
            t = threading.Thread(target=a.run, args=(self._stop,), name=f"agent-{a.node}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop_sampling(self) -> None:
        """Stop ticking; the shippers keep draining."""
        self._stop.set()
        for t in self._threads:
            t.join(10)
        for a in self.agents:
            a.seal()

    def drained(self) -> bool:
        return all(a.spool.sealed_count == 0 for a in self.agents)

    def wait_drained(self, timeout: float) -> float:
        """Seconds until every spool is empty; raises TimeoutError after ``timeout``."""
        t0 = time.monotonic()
        while not self.drained():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(
                    f"spools not drained after {timeout:.0f} s: "
                    f"{sum(a.spool.pending_samples for a in self.agents)} samples pending"
                )
            time.sleep(0.1)
        return time.monotonic() - t0

    def totals(self) -> Totals:
        st = [a.spool.stats for a in self.agents]
        return Totals(
            spooled=sum(s.spooled for s in st),
            delivered=sum(s.delivered for s in st),
            dropped=sum(s.dropped_full + s.dropped_dead + s.dropped_corrupt + s.dropped_write for s in st),
            pending=sum(a.spool.pending_samples for a in self.agents),
            dead_lettered_batches=sum(len(list(a.spool.dead_dir.glob("*.seg"))) for a in self.agents),
        )

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        for a in self.agents:
            a.shutdown(0)
