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
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from gpufleet.agent.diagnose.checks import run_checks
from gpufleet.agent.diagnose.dcgm_diag import DiagSchedule, read_result
from gpufleet.agent.diagnose.kernel_log import KernelLog
from gpufleet.agent.diagnose.report import node_facts
from gpufleet.agent.diagnose.view import NodeSampler, NodeView, gpu_inputs
from gpufleet.config import AgentSettings
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)


class NodeChecks:
    def __init__(
        self,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        cfg: DetectorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        kernel_log: KernelLog | Literal["auto"] | None = "auto",
        dcgm: DiagSchedule | None = None,
        dcgm_result_file: Path | None = None,
    ) -> None:
        self.sampler = NodeSampler(proc_root, sys_root, clock, kernel_log=kernel_log)
        self.cfg = cfg or DetectorConfig()
        #: Runs dcgmi diag in the background; None: not scheduled here (a prolog may still write results).
        self.dcgm = dcgm
        self.dcgm_result_file = dcgm.result_file if dcgm is not None else dcgm_result_file

    @classmethod
    def from_settings(
        cls, settings: AgentSettings, clock: Callable[[], float] = time.monotonic
    ) -> NodeChecks:
        dcgm = (
            DiagSchedule(
                settings.dcgm_diag_result_file,
                settings.dcgm_diag_interval_s,
                settings.dcgm_diag_level,
                settings.dcgmi,
            )
            if settings.dcgm_diag_interval_s > 0
            else None
        )
        return cls(
            settings.proc_root,
            settings.sys_root,
            clock=clock,
            dcgm=dcgm,
            dcgm_result_file=settings.dcgm_diag_result_file,
        )

    def _dcgm(self, view: NodeView) -> None:
        if self.dcgm is not None:
            self.dcgm.maybe_start()
        result = read_result(self.dcgm_result_file) if self.dcgm_result_file is not None else None
        if result is not None:
            view.dcgm_diag = result
        elif self.dcgm is None:
            view.dcgm_diag_skip = (
                "not scheduled on this agent (agent.dcgm_diag_interval_s 0) and no prolog result"
            )
        elif shutil.which(self.dcgm.dcgmi) is None:
            view.dcgm_diag_skip = f"DCGM not installed ({self.dcgm.dcgmi} not on PATH)"
        else:
            view.dcgm_diag_skip = "the first dcgmi diag run has not finished yet"

    def prime(self) -> None:
        """A first reading of the host counters, so the first facts carry rates."""
        self.sampler.sample([])

    def facts(
        self,
        gpu_rows: list[dict[str, Any]],
        source_facts: Mapping[str, Any],
        processes: Mapping[int, list[int]] | None,
    ) -> dict[str, Any]:
        if source_facts.get("simulated"):
            return {}
        view = self.sampler.sample(gpu_inputs(gpu_rows, source_facts, processes))
        self._dcgm(view)
        return node_facts(run_checks(view, self.cfg), view)
