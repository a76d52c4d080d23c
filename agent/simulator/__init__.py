"""A simulated GPU fleet for the live demo, the tests, detector scoring and benchmarks.

Scenarios (``scenarios/*.yaml``) describe nodes, runs and injected faults;
:class:`Fleet` simulates them tick by tick, deterministically under a seed;
:func:`write_bundle` writes a trace bundle (contracts.md section 1) with
``labels.json``, the ground truth of what was injected.
"""

from gpufleet.agent.simulator.bundle import write_bundle
from gpufleet.agent.simulator.fleet import Fleet
from gpufleet.agent.simulator.labels import Event, HardNegative, Incident, Labels
from gpufleet.agent.simulator.profiles import PROFILES, GpuProfile
from gpufleet.agent.simulator.realtime import RealtimeDriver
from gpufleet.agent.simulator.record import Trace, record
from gpufleet.agent.simulator.scenario import Scenario, ScenarioError, load_scenario, scenario_names

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
