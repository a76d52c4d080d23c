"""Sources that read a simulated node, so the real agent runtime can run on one.

They implement :class:`gpufleet.agent.sources.base.Source` (and ``FactsSource``) just
like the NVML and host sources: rows keyed by catalog names, ``SourceError``
when there is nothing to read (the node's agent is "down" in the scenario,
or its GPUs are gone during a driver reload).  Before each read they let the
fleet catch up with the clock it follows, if any.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from gpufleet.agent.sources.base import Reading, Source, SourceError
from gpufleet.agent.sources.registry import register
from gpufleet.config import AgentSettings, SimSettings

if TYPE_CHECKING:
    from gpufleet.sim.fleet import Fleet


class SimGpuSource:
    """GPU rows of one simulated node."""

    name = "sim_gpu"

    def __init__(self, fleet: Fleet, node: str) -> None:
        self.fleet = fleet
        self.node = node
        self._last_t = float("-inf")

    def collect(self) -> Reading:
        self.fleet.sync()
        if not self.fleet.node_up(self.node):
            raise SourceError(f"simulated node {self.node} is not reporting (scenario sample gap)")
        rows = self.fleet.gpu_rows(self.node)
        if not rows:
            raise SourceError(f"simulated node {self.node}: no GPU visible (driver reloading)")
        # "Last XID seen in the interval" is about this source's interval, which
        # may span several simulation ticks.
        for row in rows:
            row["xid"] = self.fleet.last_xid(self.node, row["gpu"], self._last_t)
        self._last_t = self.fleet.t
        return Reading(gpus=rows)

    def facts(self) -> dict[str, Any]:
        return self.fleet.facts(self.node)


class SimHostSource:
    """The host row of one simulated node."""

    name = "sim_host"

    def __init__(self, fleet: Fleet, node: str) -> None:
        self.fleet = fleet
        self.node = node

    def collect(self) -> Reading:
        self.fleet.sync()
        row = self.fleet.host_row(self.node)
        if row is None:
            raise SourceError(f"simulated node {self.node} is not reporting (scenario sample gap)")
        return Reading(host=row)


class SimNodeSource:
    """GPU rows and the host row of one simulated node in one reading.

    What the agent's ``sim`` source name builds: one name stands in for
    ``nvml`` + ``host`` on a node that only exists in the simulation.
    """

    name = "sim"

    def __init__(self, fleet: Fleet, node: str) -> None:
        #: The node this source is (the agent files its samples under it when ``agent.node`` is unset).
        self.node_name = node
        self.gpu = SimGpuSource(fleet, node)
        self.host = SimHostSource(fleet, node)

    def collect(self) -> Reading:
        reading = self.gpu.collect()
        reading.host = self.host.collect().host
        return reading

    def facts(self) -> dict[str, Any]:
        return self.gpu.facts()


_attached: Fleet | None = None
_attach_lock = threading.Lock()


def attach(fleet: Fleet | None) -> None:
    """Make ``fleet`` the one ``sim`` sources of this process read (None: forget it).

    The demo attaches its fleet (with its realtime driver) before starting
    agents.  Without one, the first ``sim`` source builds the scenario the
    agent's ``sim`` settings name (scenario, seed, speed) starting now and
    following the wall clock.
    """
    global _attached
    with _attach_lock:
        _attached = fleet


def attached_fleet(sim: SimSettings | None = None) -> Fleet:
    """The attached fleet, else the scenario ``sim`` names (``agent.sim``) starting now on the wall clock."""
    global _attached
    with _attach_lock:
        if _attached is None:
            from gpufleet.sim.fleet import Fleet
            from gpufleet.sim.realtime import RealtimeDriver

            sim = sim or SimSettings()
            fleet = Fleet.from_scenario(sim.scenario, seed=sim.seed, start_time=time.time())
            RealtimeDriver(fleet, speed=sim.speed)
            _attached = fleet
        return _attached


def _sim_factory(settings: Any) -> Source:
    """Build the ``sim`` source from the agent's settings (``AgentSettings``: its ``node`` and ``sim``)."""
    fleet = attached_fleet(settings.sim)
    node = settings.node or fleet.nodes[0]
    if node not in fleet.nodes:
        raise SourceError(
            f"sim source: node {node!r} is not in scenario {fleet.scenario.name!r} "
            f"(nodes: {', '.join(fleet.nodes)})"
        )
    return SimNodeSource(fleet, node)


def _fake_nvml_factory(settings: AgentSettings) -> Source:
    """The ``fake-nvml`` source: the real NVML source over ``agent.sim.fake_nvml_gpus`` loaded fake H100s."""
    from gpufleet.sim.nvml_fake import fake_nvml_source

    return fake_nvml_source(settings.sim.fake_nvml_gpus)


register("sim", _sim_factory, replace=True)
register("fake-nvml", _fake_nvml_factory, replace=True)
