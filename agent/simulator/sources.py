"""Sources that read a simulated node, so the real agent runtime can run on one.

They implement :class:`gpufleet.agent.sources.base.Source` (and ``FactsSource``) just
like the NVML and host sources: rows keyed by catalog names, ``SourceError``
when there is nothing to read (the node's agent is "down" in the scenario,
or its GPUs are gone during a driver reload).  Before each read they let the
fleet catch up with the clock it follows, if any.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from gpufleet.agent.sources.base import Reading, Source, SourceError

if TYPE_CHECKING:
    from gpufleet.agent.simulator.fleet import Fleet


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
    agents.  Without one, the first ``sim`` source builds the scenario named
    by ``GPUFLEET_SIM_SCENARIO`` (default ``demo``; ``GPUFLEET_SIM_SEED``,
    ``GPUFLEET_SIM_SPEED``) starting now and following the wall clock.
    """
    global _attached
    with _attach_lock:
        _attached = fleet


def attached_fleet() -> Fleet:
    global _attached
    with _attach_lock:
        if _attached is None:
            from gpufleet.agent.simulator.fleet import Fleet
            from gpufleet.agent.simulator.realtime import RealtimeDriver

            seed = os.environ.get("GPUFLEET_SIM_SEED")
            fleet = Fleet.from_scenario(os.environ.get("GPUFLEET_SIM_SCENARIO", "demo"),
                                        seed=int(seed) if seed else None, start_time=time.time())
            RealtimeDriver(fleet, speed=float(os.environ.get("GPUFLEET_SIM_SPEED", "1")))
            _attached = fleet
        return _attached


def _sim_factory(settings: Any) -> Source:
    """Build the ``sim`` source from the agent's settings (``AgentSettings``: its ``node``)."""
    fleet = attached_fleet()
    node = settings.node or fleet.nodes[0]
    if node not in fleet.nodes:
        raise SourceError(f"sim source: node {node!r} is not in scenario {fleet.scenario.name!r} "
                          f"(nodes: {', '.join(fleet.nodes)})")
    return SimNodeSource(fleet, node)


# The registry (and the settings module behind it) is looked up at run time so
# that the simulator stays importable, and type-checkable, on its own.
importlib.import_module("gpufleet.agent.sources.registry").register("sim", _sim_factory, replace=True)
