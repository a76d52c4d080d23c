"""Detectors: pure functions over windows of samples.

The live sweep, ``gpufleet replay`` and the tests run the same code.
"""

from gpufleet.collector.detectors.registry import (
    DETECTORS,
    Detector,
    DetectorFailure,
    SweepResult,
    detect_all,
    run_detectors,
)
from gpufleet.collector.detectors.window import Finding, GpuKey, RunInfo, Series, Window
from gpufleet.detectconfig import DetectorConfig

__all__ = [
    "DETECTORS",
    "Detector",
    "DetectorConfig",
    "DetectorFailure",
    "Finding",
    "GpuKey",
    "RunInfo",
    "Series",
    "SweepResult",
    "Window",
    "detect_all",
    "run_detectors",
]
