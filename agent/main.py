"""Start an agent from settings: what ``gpufleet agent`` runs.

Resolves the node name and the spool directory, builds the sources (the
configured ones, a simulated node with ``sim``, or fake GPUs for tests and
benchmarks), runs the loop until SIGTERM or SIGINT, then seals the spool and
ships what it can within ``shutdown_ship_s``.  Problems a person must fix
(bad node name, missing token, spool in use) raise :class:`AgentError` with a
one-line message.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

from gpufleet.agent.k8s.attribution import KubernetesAttribution
from gpufleet.agent.runtime import Agent
from gpufleet.agent.sources.base import NamesNode, Source, SourceError
from gpufleet.agent.sources.registry import UnknownSource, build_source
from gpufleet.agent.spool import SpoolLocked
from gpufleet.config import AgentSettings, Settings
from gpufleet.metricsauth import MetricsAuthError, read_token
from gpufleet.names import is_node_name

log = logging.getLogger(__name__)


class AgentError(RuntimeError):
    """The agent cannot start; the message says what to fix."""


def resolve_node(settings: AgentSettings) -> str:
    """The configured node name, else this machine's short host name."""
    node = settings.node or socket.gethostname().split(".")[0]
    if not is_node_name(node):
        raise AgentError(f"node name {node!r} is not valid (letters, digits, '.', '_', '-'); set agent.node")
    return node


def spool_dir(settings: Settings) -> Path:
    return settings.agent.spool_dir or settings.data_dir / "agent-spool"


def make_sources(
    settings: AgentSettings, *, fake_nvml: int | None = None, sim: str | None = None
) -> list[Source]:
    """The configured sources; ``sim`` replaces them with one simulated node, ``fake_nvml`` swaps NVML for a fake.

    Both are sources of :mod:`gpufleet.sim` that the registry knows by name
    (``sim``, ``fake-nvml``); the agent only fills in their settings.
    """
    names = ["sim"] if sim is not None else list(settings.sources)
    if sim is not None:
        settings = settings.model_copy(update={"sim": settings.sim.model_copy(update={"scenario": sim})})
    if fake_nvml:
        settings = settings.model_copy(
            update={"sim": settings.sim.model_copy(update={"fake_nvml_gpus": fake_nvml})}
        )
        names = ["fake-nvml" if n == "nvml" else n for n in names]
        if "fake-nvml" not in names:
            names.insert(0, "fake-nvml")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AgentError(f"sources listed more than once: {', '.join(dup)}")
    if not names:
        raise AgentError("no sources configured (agent.sources is empty)")
    built = []
    for name in names:
        try:
            built.append(build_source(name, settings))
        except (UnknownSource, SourceError) as e:
            raise AgentError(str(e)) from e
        except ValueError as e:  # a malformed simulator scenario, a bad source option
            raise AgentError(f"source {name!r}: {e}") from e
    return built


def build_agent(settings: Settings, *, fake_nvml: int | None = None, sim: str | None = None) -> Agent:
    a = settings.agent
    if not a.token:
        raise AgentError("no node token: set agent.token (or GPUFLEET_AGENT__TOKEN, or --token)")
    try:
        read_token(a.metrics_token, a.metrics_token_file, "agent.metrics_token")
    except MetricsAuthError as e:
        raise AgentError(str(e)) from e
    if a.metrics_client_ca is not None and a.metrics_certfile is None:
        raise AgentError("agent.metrics_client_ca needs agent.metrics_certfile: client certificates need TLS")
    sources = make_sources(a, fake_nvml=fake_nvml, sim=sim)
    named = [s.node_name for s in sources if isinstance(s, NamesNode)]
    if named and a.node is None:
        # A simulated node is named by its scenario: file its samples under that name.
        a = a.model_copy(update={"node": named[0]})
    node = resolve_node(a)
    return Agent(
        a, sources, node=node, spool_dir=spool_dir(settings), kubernetes=kubernetes_attribution(a, node)
    )


def kubernetes_attribution(settings: AgentSettings, node: str) -> KubernetesAttribution | None:
    """The Kubernetes attribution the settings ask for (None when off).

    Pod metadata that cannot be set up (not in a pod, no API server) is
    logged and left out: pods are then their own runs.
    """
    k = settings.kubernetes
    if not k.enabled:
        return None
    from gpufleet.agent.k8s.podresources import PodResourcesClient
    from gpufleet.agent.k8s.pods import ApiError, ApiServer
    from gpufleet.agent.k8s.runs import RunResolver

    metadata = None
    if k.pod_metadata:
        try:
            metadata = ApiServer(k.api_server, k.token_file, k.ca_file, timeout_s=k.timeout_s)
        except ApiError as e:
            log.warning("kubernetes attribution without pod metadata (pods are their own runs): %s", e)
    resolver = RunResolver(
        k.run_id_key, tuple(k.run_kinds), tuple(k.team_labels), k.team_from_namespace, dict(k.team_map)
    )
    return KubernetesAttribution(
        node,
        PodResourcesClient(k.pod_resources_socket, k.timeout_s),
        metadata,
        resolver,
        tuple(k.gpu_resources),
        k.refresh_s,
        k.metadata_refresh_s,
    )


def run(
    settings: Settings,
    *,
    fake_nvml: int | None = None,
    sim: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run an agent until SIGTERM/SIGINT (or ``stop``); 0 when it stopped cleanly."""
    agent = build_agent(settings, fake_nvml=fake_nvml, sim=sim)
    stop = stop or threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info(
            "agent: %s received; sealing the spool and shipping for up to %.0f s",
            signal.Signals(signum).name,
            settings.agent.shutdown_ship_s,
        )
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except SpoolLocked as e:
        raise AgentError(str(e)) from e
    except OSError as e:
        raise AgentError(f"cannot start: {e}") from e
    try:
        agent.run(stop)
    finally:
        agent.shutdown()
    return 0
