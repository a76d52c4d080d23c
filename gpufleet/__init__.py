"""gpufleet: continuous GPU fleet telemetry, detectors and per-run accounting."""

__version__ = "0.1.0"
