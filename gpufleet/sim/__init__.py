"""A simulated GPU fleet for the live demo, the tests, detector scoring and benchmarks.

Scenarios (``scenarios/*.yaml``) describe nodes, runs and injected faults;
:class:`Fleet` simulates them tick by tick, deterministically under a seed;
:func:`write_bundle` writes a trace bundle (contracts.md section 1) with
``labels.json``, the ground truth of what was injected.

The names below load on first use, so ``gpufleet.sim.nvml_fake`` stays as light
as the NVML source it stands in for (the GPU trace recorder runs it on machines
without the simulator's dependencies).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.sim.bundle import write_bundle
    from gpufleet.sim.fleet import Fleet
    from gpufleet.sim.labels import Event, HardNegative, Incident, Labels
    from gpufleet.sim.profiles import PROFILES, GpuProfile
    from gpufleet.sim.realtime import RealtimeDriver
    from gpufleet.sim.scenario import Scenario, ScenarioError, load_scenario, scenario_names
    from gpufleet.sim.trace import Trace, record

_HOME = {
    "write_bundle": "bundle",
    "Fleet": "fleet",
    "Event": "labels",
    "HardNegative": "labels",
    "Incident": "labels",
    "Labels": "labels",
    "PROFILES": "profiles",
    "GpuProfile": "profiles",
    "RealtimeDriver": "realtime",
    "Trace": "trace",
    "record": "trace",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "load_scenario": "scenario",
    "scenario_names": "scenario",
}

__all__ = [
    "PROFILES",
    "Event",
    "Fleet",
    "GpuProfile",
    "HardNegative",
    "Incident",
    "Labels",
    "RealtimeDriver",
    "Scenario",
    "ScenarioError",
    "Trace",
    "load_scenario",
    "record",
    "scenario_names",
    "write_bundle",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'gpufleet.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpufleet.sim.{_HOME[name]}"), name)
