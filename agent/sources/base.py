"""The one small protocol every telemetry source implements.

A source turns one read of its hardware or tool into rows keyed by the
metric catalog (``gpufleet.catalog``): GPU rows carry ``gpu`` (index on the
host) plus any catalog fields it knows; a field it cannot read is ``None``
(NULL), never 0.  The agent runtime stamps ``time`` and ``node`` and merges
rows of several sources for the same GPU, so a source only reports what it
measured.  Errors are raised as :class:`SourceError`; the runtime counts and
reports them without stopping other sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

GpuRow = dict[str, Any]
HostRow = dict[str, Any]


class SourceError(RuntimeError):
    """A source could not produce a reading this time (the message says why)."""


class SourceUnavailable(SourceError):
    """The source cannot run on this node at all (library or device missing)."""


@dataclass
class Reading:
    """What one ``collect`` call measured."""

    gpus: list[GpuRow] = field(default_factory=list)
    host: HostRow | None = None


@runtime_checkable
class Source(Protocol):
    #: Registered name, as used in the agent's ``sources`` setting.
    name: str

    def collect(self) -> Reading:
        """Read the current values. Raises SourceError on failure."""
        ...


@runtime_checkable
class FactsSource(Protocol):
    """Optional ability: describe the node (GPU models, driver, PCIe maxima...)."""

    def facts(self) -> dict[str, Any]: ...


@runtime_checkable
class NamesNode(Protocol):
    """A source that is a node of its own (a simulated one): the agent files samples under its name."""

    node_name: str


@runtime_checkable
class Closeable(Protocol):
    """Optional ability: release handles (NVML shutdown, sockets)."""

    def close(self) -> None: ...
