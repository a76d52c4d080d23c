"""Sources that read a simulated node, so the real agent runtime can run on one.

They implement :class:`agent.sources.base.Source` (and ``FactsSource``) just
like the NVML and host sources: rows keyed by catalog names, ``SourceError``
when there is nothing to read (the node's agent is "down" in the scenario,
or its GPUs are gone during a driver reload).  Before each read they let the
fleet catch up with the clock it follows, if any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.sources.base import Reading, SourceError

if TYPE_CHECKING:
    from agent.simulator.fleet import Fleet


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
