"""Every detector by name, and the sweep that runs them all over one window.

A detector is ``detect(window, config, frame=None) -> list[Finding]``: a pure
function of the window.  The sweep builds the shared :class:`Frame` once and
runs each detector on its own; one that raises is logged and reported in the
result, and the others still run.  Their findings then pass
:func:`~gpufleet.collector.detectors.arbitration.arbitrate`: one explanation per
lost GPU-second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.collector.detectors import (
    checkpoint_stall,
    gpu_health,
    host_misconfig,
    hung_collective,
    idle_allocation,
    nvlink_degraded,
    pcie_degraded,
    starvation,
    straggler,
    throttling,
)
from gpufleet.collector.detectors.arbitration import arbitrate
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)


class Detector(Protocol):
    def __call__(
        self, window: Window, config: DetectorConfig, frame: Frame | None = None
    ) -> list[Finding]: ...


DETECTORS: Mapping[str, Detector] = {
    starvation.KIND: starvation.detect,
    straggler.KIND: straggler.detect,
    checkpoint_stall.KIND: checkpoint_stall.detect,
    throttling.KIND: throttling.detect,
    pcie_degraded.KIND: pcie_degraded.detect,
    host_misconfig.KIND: host_misconfig.detect,
    nvlink_degraded.KIND: nvlink_degraded.detect,
    gpu_health.KIND: gpu_health.detect,
    idle_allocation.KIND: idle_allocation.detect,
    hung_collective.KIND: hung_collective.detect,
}


@dataclass
class DetectorFailure:
    """A detector that raised during a sweep (``error`` is its repr)."""

    detector: str
    error: str


@dataclass
class SweepResult:
    findings: list[Finding] = field(default_factory=list)
    failures: list[DetectorFailure] = field(default_factory=list)
    #: Seconds spent building the shared frame (``frame``) and in each detector, by name:
    #: which detector a fleet's sweep time goes to (a detector may reuse work another
    #: left in the frame, so the first to need it pays for it).
    seconds: dict[str, float] = field(default_factory=dict)


def run_detectors(
    window: Window, config: DetectorConfig | None = None, detectors: Mapping[str, Detector] | None = None
) -> SweepResult:
    """Run every detector (or ``detectors``) over ``window``, isolating failures."""
    cfg = config or DetectorConfig()
    result = SweepResult()
    frame: Frame | None
    t0 = time.perf_counter()
    try:
        frame = Frame(window, cfg)
    except Exception as e:
        log.exception("detector sweep: building the sample frame failed")
        result.failures.append(DetectorFailure("frame", repr(e)))
        frame = None
    t1 = time.perf_counter()
    result.seconds["frame"] = t1 - t0
    for name, det in (detectors or DETECTORS).items():
        try:
            result.findings.extend(det(window, cfg, frame))
        except Exception as e:
            log.exception("detector %s failed", name)
            result.failures.append(DetectorFailure(name, repr(e)))
        t0, t1 = t1, time.perf_counter()
        result.seconds[name] = t1 - t0
    # One explanation per lost second: what a higher-ranked finding explains, no other kind reports.
    result.findings = arbitrate(result.findings, window.t_end)
    return result


def detect_all(window: Window, config: DetectorConfig | None = None) -> list[Finding]:
    """Findings of every detector; a failing detector is logged and skipped."""
    return run_detectors(window, config).findings
