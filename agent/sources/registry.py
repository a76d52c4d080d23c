"""Telemetry sources by registered name, built from the agent's settings.

The agent's ``sources`` setting lists names (``["nvml", "host"]``); this module
turns each into a :class:`Source`.  Registering a name twice fails loudly, so
two plug-ins can never silently shadow each other.  Building never touches
hardware: sources open NVML, DCGM or HTTP on their first ``collect``, so the
runtime's per-source error handling covers a missing driver too.

Sources that live elsewhere register themselves when their module is imported.
Installed packages name those modules under the ``gpufleet.sources`` entry-point
group (the simulator's ``sim`` and ``fake-nvml``); the registry imports one only
when its name is asked for, so the agent never depends on the simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from gpufleet.agent.sources.base import Source
from gpufleet.config import AgentSettings

#: Builds a source from the agent's settings.
SourceFactory = Callable[[AgentSettings], Source]

_FACTORIES: dict[str, SourceFactory] = {}

#: Entry-point group naming, for each plug-in source, the module that registers it.
ENTRY_POINT_GROUP = "gpufleet.sources"

#: Plug-in modules by source name besides the installed entry points (these win).
PLUGIN_MODULES: dict[str, str] = {}


def plugin_modules() -> dict[str, str]:
    """Source name -> module that registers it, for sources outside this package."""
    return {**{ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}, **PLUGIN_MODULES}


class UnknownSource(ValueError):
    """A configured source name that nothing registered."""


class DuplicateSource(ValueError):
    """A second registration for a name already taken."""


def register(name: str, factory: SourceFactory, *, replace: bool = False) -> None:
    """Make ``name`` buildable; refuses a name already registered unless ``replace``."""
    if name in _FACTORIES and not replace:
        raise DuplicateSource(f"source {name!r} is already registered")
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    _FACTORIES.pop(name, None)


def registered() -> list[str]:
    """Names buildable right now (plug-ins appear once their module registered them)."""
    return sorted(_FACTORIES)


def build_source(name: str, settings: AgentSettings) -> Source:
    """The source registered as ``name``, configured from ``settings``."""
    plugins = plugin_modules() if name not in _FACTORIES else {}
    if name in plugins:
        try:
            importlib.import_module(plugins[name])
        except ImportError as e:
            raise UnknownSource(f"source {name!r}: cannot import {plugins[name]}: {e}") from e
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(sorted({*_FACTORIES, *plugin_modules()}))
        raise UnknownSource(f"unknown source {name!r} (known: {known})")
    return factory(settings)


def build_sources(settings: AgentSettings) -> list[Source]:
    """Every source listed in ``settings.sources``, in order; a name listed twice is refused."""
    dup = sorted({n for n in settings.sources if settings.sources.count(n) > 1})
    if dup:
        raise DuplicateSource(f"sources listed more than once: {dup}")
    return [build_source(name, settings) for name in settings.sources]


# --------------------------------------------------------------------------- built-in sources


def _nvml(settings: AgentSettings) -> Source:
    from gpufleet.agent.sources.nvml import NvmlSource

    return NvmlSource(sys_root=settings.sys_root)


def _dcgm(settings: AgentSettings) -> Source:
    from gpufleet.agent.sources.dcgm import DcgmSource

    return DcgmSource(update_interval_s=settings.interval_s)


def _dcgm_exporter(settings: AgentSettings) -> Source:
    from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource

    return DcgmExporterSource(settings.dcgm_exporter_url, timeout_s=settings.request_timeout_s)


def _host(settings: AgentSettings) -> Source:
    from gpufleet.agent.sources.host import HostSource

    # The host's /proc and /sys where the agent sees them (a DaemonSet mounts them at /host/proc, /host/sys).
    return HostSource(
        proc_root=settings.proc_root, sys_root=settings.sys_root, host_power_w=settings.host_power_w
    )


for _name, _factory in (("nvml", _nvml), ("dcgm", _dcgm), ("dcgm_exporter", _dcgm_exporter), ("host", _host)):
    register(_name, _factory)
