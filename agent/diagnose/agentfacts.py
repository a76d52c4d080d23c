"""The node checks as the agent sends them: facts at start and whenever they change.

At each facts refresh the agent hands over what it already has -- the
tick's GPU rows, the GPU sources' facts, the processes on each GPU -- and
gets back the checks and the placement they judged as node facts
(:func:`gpufleet.agent.diagnose.report.node_facts`).  Rates (iowait, NFS,
cgroup throttling) are over the time since the previous refresh; a first
reading taken when the agent starts makes the first facts carry rates too.
A node whose sources are simulated carries its own checks, so none are read
from the machine the simulation runs on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpufleet.agent.diagnose.checks import run_checks
from gpufleet.agent.diagnose.report import node_facts
from gpufleet.agent.diagnose.view import NodeSampler, gpu_inputs
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)


class NodeChecks:
    def __init__(self, proc_root: Path | str = "/proc", sys_root: Path | str = "/sys",
                 cfg: DetectorConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.sampler = NodeSampler(proc_root, sys_root, clock)
        self.cfg = cfg or DetectorConfig()

    def prime(self) -> None:
        """A first reading of the host counters, so the first facts carry rates."""
        self.sampler.sample([])

    def facts(self, gpu_rows: list[dict[str, Any]], source_facts: Mapping[str, Any],
              processes: Mapping[int, list[int]] | None) -> dict[str, Any]:
        if source_facts.get("simulated"):
            return {}
        view = self.sampler.sample(gpu_inputs(gpu_rows, source_facts, processes))
        return node_facts(run_checks(view, self.cfg), view)
