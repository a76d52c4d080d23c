"""Whether the network is implicated, from the nodes' fabric columns: a ``network`` cause for stragglers and slow collectives.

A synchronous job waits for its slowest rank; when that rank's node loses
packets, retrains a link, has an InfiniBand/RoCE port down or runs its link
flat out, the GPU is not the cause and no GPU counter says so.  The host
rows carry the fabric (``gpufleet.agent.sources.fabric``: errors, drops and
link-downs counted per interval, the busiest link's utilisation, ports not
ACTIVE), and these pure functions read them over a window:

* :func:`straggler_network_cause`: the straggler's node shows a fabric fault
  its peers' nodes do not (errors, link downs or recoveries, a port down,
  drops, or a link near saturation while the peers' are not);
* :func:`collective_network_cause`: for a run whose collectives are slow or
  hung as a whole, any of its nodes with link errors or a port down, or its
  links saturated on most nodes.

They take the window's host series by node (``Window.hosts``) and the
columns :data:`FABRIC_COLUMNS`; a node without those columns (an agent that
does not read the fabric) is never implicated, and its absence is said in
the evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.collector.detectors.window import Series
from gpufleet.detectconfig import DetectorConfig

#: Host columns the functions read (the window cache must load them with the host rows).
FABRIC_COLUMNS: tuple[str, ...] = (
    "net_errors",
    "net_drops",
    "net_util_pct",
    "ib_util_pct",
    "ib_ports_down",
    "ib_symbol_errors",
    "ib_link_downed",
    "ib_link_error_recovery",
    "ib_rx_errors",
    "ib_tx_discards",
)
#: Physical-layer faults: any in the window implicates the link.
LINK_FAULTS = ("ib_symbol_errors", "ib_link_downed", "ib_link_error_recovery", "net_errors")
#: Packets lost (how many implicate the network: ``fabric_min_lost_packets``).
LOSS_COLUMNS = ("net_drops", "ib_rx_errors", "ib_tx_discards")
_DEFAULTS = DetectorConfig()


@dataclass
class NodeFabric:
    """One node's fabric over a window."""

    node: str
    reported: bool
    link_faults: dict[str, int] = field(default_factory=dict)
    lost_packets: int = 0
    ports_down: int = 0
    #: Median over the window of the busiest link's utilisation (NIC or IB, the larger), %.
    util_pct: float | None = None

    @property
    def faulty(self) -> bool:
        return bool(self.link_faults) or self.ports_down > 0

    saturated_pct: float = _DEFAULTS.fabric_saturated_pct

    @property
    def saturated(self) -> bool:
        return self.util_pct is not None and self.util_pct >= self.saturated_pct

    def evidence(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "fabric_reported": self.reported,
            "link_faults": dict(self.link_faults),
            "lost_packets": self.lost_packets,
            "ib_ports_down": self.ports_down,
            "link_util_pct": self.util_pct,
        }


@dataclass(frozen=True)
class NetworkFinding:
    """The network is implicated: ``reason`` is ``link_errors``, ``port_down``, ``packet_loss`` or ``saturated``."""

    reason: str
    nodes: list[str]
    evidence: dict[str, Any]


def _window(s: Series, t0: float, t1: float) -> np.ndarray:
    return (s.t >= t0) & (s.t <= t1)


def node_fabric(
    host: Series | None, node: str, t0: float, t1: float, cfg: DetectorConfig = _DEFAULTS
) -> NodeFabric:
    if host is None or not any(host.has(c) for c in FABRIC_COLUMNS):
        return NodeFabric(node, False, saturated_pct=cfg.fabric_saturated_pct)
    m = _window(host, t0, t1)
    out = NodeFabric(node, bool(m.any()), saturated_pct=cfg.fabric_saturated_pct)
    if not out.reported:
        return out
    for col in LINK_FAULTS:
        v = host.get(col)[m]
        total = int(np.nansum(v)) if np.isfinite(v).any() else 0
        if total > 0:
            out.link_faults[col] = total
    out.lost_packets = int(
        sum(np.nansum(host.get(c)[m]) for c in LOSS_COLUMNS if np.isfinite(host.get(c)[m]).any())
    )
    down = host.get("ib_ports_down")[m]
    out.ports_down = int(np.nanmax(down)) if np.isfinite(down).any() else 0
    util = np.fmax(host.get("net_util_pct")[m], host.get("ib_util_pct")[m])
    out.util_pct = float(np.nanmedian(util)) if np.isfinite(util).any() else None
    return out


def straggler_network_cause(
    straggler_node: str,
    peer_nodes: Iterable[str],
    hosts: Mapping[str, Series],
    t0: float,
    t1: float,
    cfg: DetectorConfig = _DEFAULTS,
) -> NetworkFinding | None:
    """The straggler's node shows a fabric fault or saturation that none of its peers' nodes shows; None
    when the fabric is clean there, the same everywhere, or not reported."""
    me = node_fabric(hosts.get(straggler_node), straggler_node, t0, t1, cfg)
    if not me.reported:
        return None
    peers = [node_fabric(hosts.get(n), n, t0, t1, cfg) for n in sorted(set(peer_nodes) - {straggler_node})]
    ev = {"straggler": me.evidence(), "peers": [p.evidence() for p in peers], "window": [t0, t1]}
    if me.link_faults and not any(p.link_faults for p in peers):
        return NetworkFinding("link_errors", [straggler_node], ev)
    if me.ports_down > max((p.ports_down for p in peers), default=0):
        return NetworkFinding("port_down", [straggler_node], ev)
    least = cfg.fabric_min_lost_packets
    if me.lost_packets >= least and all(p.lost_packets < least for p in peers):
        return NetworkFinding("packet_loss", [straggler_node], ev)
    if me.saturated and not any(p.saturated for p in peers):
        return NetworkFinding("saturated", [straggler_node], ev)
    return None


def collective_network_cause(
    nodes: Iterable[str], hosts: Mapping[str, Series], t0: float, t1: float, cfg: DetectorConfig = _DEFAULTS
) -> NetworkFinding | None:
    """For a run slow or hung as a whole: a node of it with link faults or a port down, packets lost, or
    saturated links on most of its nodes; None otherwise (or when no node reports the fabric)."""
    figures = [node_fabric(hosts.get(n), n, t0, t1, cfg) for n in sorted(set(nodes))]
    seen = [f for f in figures if f.reported]
    if not seen:
        return None
    ev = {"nodes": [f.evidence() for f in figures], "window": [t0, t1]}
    faulty = [f.node for f in seen if f.link_faults]
    if faulty:
        return NetworkFinding("link_errors", faulty, ev)
    down = [f.node for f in seen if f.ports_down > 0]
    if down:
        return NetworkFinding("port_down", down, ev)
    lossy = [f.node for f in seen if f.lost_packets >= cfg.fabric_min_lost_packets]
    if lossy:
        return NetworkFinding("packet_loss", lossy, ev)
    busy = [f.node for f in seen if f.saturated]
    if busy and len(busy) >= cfg.fabric_saturated_nodes_share * len(seen):
        return NetworkFinding("saturated", busy, ev)
    return None
