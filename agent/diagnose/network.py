"""The network on the checklist: each physical NIC and each InfiniBand/RoCE port, as ``sar -n DEV/EDEV`` and ``ibstat`` show them.

Per interface over the sampling interval: bytes each way, errors and drops
(``/proc/net/dev``), and the larger direction against the link speed
(``/sys/class/net/<if>/speed``); per InfiniBand/RoCE port: state, link rate,
traffic and the error counters that mean a bad cable or optic
(``symbol_error``, ``link_error_recovery``, ``link_downed``), from the same
readings the host row uses (:mod:`gpufleet.agent.sources.fabric`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.agent.diagnose.result import Check, skipped
from gpufleet.agent.sources.fabric import IbPort
from gpufleet.agent.sources.host import HostSnapshot

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

#: Utilisation of a link's capacity at and above which the link is the bottleneck: warn.
SATURATED_PCT = 80.0


@dataclass(frozen=True)
class NicView:
    name: str
    #: Link speed, bytes/s; None when the link is down or reports none (virtual, some VMs).
    speed_bytes_s: float | None
    rx_bytes_s: float | None = None
    tx_bytes_s: float | None = None
    errors: int | None = None
    drops: int | None = None
    util_pct: float | None = None


@dataclass(frozen=True)
class IbPortView:
    port: str
    state: str | None
    link_layer: str | None
    rate_bytes_s: float | None
    rx_bytes_s: float | None = None
    tx_bytes_s: float | None = None
    util_pct: float | None = None
    #: Increase of each error counter over the interval (sysfs names); absent when unknown.
    errors: Mapping[str, int] = field(default_factory=dict)


def nic_views(prev: HostSnapshot | None, curr: HostSnapshot, interval_s: float | None) -> list[NicView]:
    out = []
    for name in sorted(curr.nets):
        now, before = curr.nets[name], prev.nets.get(name) if prev is not None else None
        speed = curr.links.get(name)
        if (
            before is None
            or not interval_s
            or interval_s <= 0
            or now.rx_bytes < before.rx_bytes
            or now.tx_bytes < before.tx_bytes
        ):
            out.append(NicView(name, speed))
            continue
        rx = (now.rx_bytes - before.rx_bytes) / interval_s
        tx = (now.tx_bytes - before.tx_bytes) / interval_s
        errors = max(0, now.rx_errs - before.rx_errs) + max(0, now.tx_errs - before.tx_errs)
        drops = max(0, now.rx_drop - before.rx_drop) + max(0, now.tx_drop - before.tx_drop)
        util = min(100.0, 100.0 * max(rx, tx) / speed) if speed else None
        out.append(NicView(name, speed, rx, tx, errors, drops, util))
    return out


def ib_port_views(
    prev: Mapping[str, IbPort] | None, curr: Mapping[str, IbPort], interval_s: float | None
) -> list[IbPortView]:
    out = []
    for key in sorted(curr):
        p, before = curr[key], (prev or {}).get(key)
        if before is None or not interval_s or interval_s <= 0:
            out.append(IbPortView(key, p.state, p.link_layer, p.rate_bytes_s))
            continue
        d: dict[str, int] = {}
        for name, value in p.traffic.items():
            old = before.traffic.get(name)
            if old is not None and value >= old:
                d[name] = value - old
        errors = {
            name: value - before.errors[name]
            for name, value in p.errors.items()
            if name in before.errors and value >= before.errors[name]
        }
        rx = d["rx_bytes"] / interval_s if "rx_bytes" in d else None
        tx = d["tx_bytes"] / interval_s if "tx_bytes" in d else None
        util = (
            min(100.0, 100.0 * max(rx or 0.0, tx or 0.0) / p.rate_bytes_s)
            if p.rate_bytes_s and (rx is not None or tx is not None)
            else None
        )
        out.append(IbPortView(key, p.state, p.link_layer, p.rate_bytes_s, rx, tx, util, errors))
    return out


def _rate(b: float | None) -> str:
    return "?" if b is None else f"{b * 8 / 1e9:.2f} Gbit/s"


def check_nics(view: NodeView) -> list[Check]:
    if view.nics is None:
        return [skipped("nic", "node", "network counters not readable (/proc/net/dev)", "%")]
    if not view.nics:
        return [
            skipped(
                "nic", "node", "no physical network interface (only virtual ones, or no /sys/class/net)", "%"
            )
        ]
    out = []
    for n in view.nics:
        ev: dict[str, Any] = {
            "speed_bytes_s": n.speed_bytes_s,
            "rx_bytes_s": n.rx_bytes_s,
            "tx_bytes_s": n.tx_bytes_s,
            "errors": n.errors,
            "drops": n.drops,
            "util_pct": n.util_pct,
            "interval_s": view.interval_s,
        }
        speed = (
            f"of {n.speed_bytes_s * 8 / 1e9:g} Gbit/s"
            if n.speed_bytes_s
            else "(no link speed: down or not reported)"
        )
        if n.errors is None:
            out.append(
                Check(
                    "nic",
                    n.name,
                    "unknown",
                    f"link {speed.removeprefix('of ')}; rates need two readings",
                    None,
                    "%",
                    "",
                    ev,
                )
            )
            continue
        value = round(n.util_pct, 2) if n.util_pct is not None else None
        text = f"in {_rate(n.rx_bytes_s)}, out {_rate(n.tx_bytes_s)} {speed}"
        if n.errors > 0:
            out.append(
                Check(
                    "nic",
                    n.name,
                    "fail",
                    f"{n.errors} errors in {view.interval_s:.0f} s; {text}",
                    value,
                    "%",
                    "frame or CRC errors: check the cable or optic and the switch port "
                    "(ethtool -S), then the NIC",
                    ev,
                )
            )
        elif n.util_pct is not None and n.util_pct >= SATURATED_PCT:
            out.append(
                Check(
                    "nic",
                    n.name,
                    "warn",
                    f"link {n.util_pct:.0f} % busy: {text}",
                    value,
                    "%",
                    "the link is the bottleneck: move data-set reads or checkpoints off it, or add bandwidth",
                    ev,
                )
            )
        elif n.drops:
            out.append(
                Check(
                    "nic",
                    n.name,
                    "warn",
                    f"{n.drops} packets dropped in {view.interval_s:.0f} s; {text}",
                    value,
                    "%",
                    "drops: receive rings or the socket backlog overflow (ethtool -g, "
                    "net.core.netdev_max_backlog), or the switch discards",
                    ev,
                )
            )
        else:
            out.append(
                Check(
                    "nic",
                    n.name,
                    "ok",
                    text + (f" ({n.util_pct:.0f} %)" if n.util_pct is not None else ""),
                    value,
                    "%",
                    "",
                    ev,
                )
            )
    return out


def check_ib_ports(view: NodeView) -> list[Check]:
    if view.ib_ports is None:
        return [skipped("ib_port", "node", "the fabric is not read here", "%")]
    if not view.ib_ports:
        return [
            skipped(
                "ib_port",
                "node",
                "no InfiniBand or RoCE port (/sys/class/infiniband is empty or absent)",
                "%",
            )
        ]
    out = []
    for p in view.ib_ports:
        ev: dict[str, Any] = {
            "state": p.state,
            "link_layer": p.link_layer,
            "rate_bytes_s": p.rate_bytes_s,
            "rx_bytes_s": p.rx_bytes_s,
            "tx_bytes_s": p.tx_bytes_s,
            "util_pct": p.util_pct,
            "errors": dict(p.errors),
            "interval_s": view.interval_s,
        }
        kind = "RoCE" if p.link_layer == "Ethernet" else "IB"
        rate = f"{p.rate_bytes_s * 8 / 1e9:g} Gb/s {kind}" if p.rate_bytes_s else kind
        value = round(p.util_pct, 2) if p.util_pct is not None else None
        if p.state != "ACTIVE":
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "warn",
                    f"port {p.state or 'state unknown'} ({rate})",
                    value,
                    "%",
                    "a port not ACTIVE carries nothing: if it should be cabled, check ibstat, the cable "
                    "and the switch port; NCCL falls back to other rails or to TCP",
                    ev,
                )
            )
            continue
        bad = {
            k: v
            for k, v in p.errors.items()
            if v and k in ("symbol_error", "link_error_recovery", "link_downed")
        }
        if bad:
            what = ", ".join(f"{v} {k}" for k, v in sorted(bad.items()))
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "fail",
                    f"{what} in {view.interval_s:.0f} s ({rate})",
                    value,
                    "%",
                    "physical-layer errors: reseat or replace the cable or optic (the link retrains and "
                    "collectives stall meanwhile); quarantine the node if they continue",
                    ev,
                )
            )
            continue
        soft = {k: v for k, v in p.errors.items() if v and k in ("port_rcv_errors", "port_xmit_discards")}
        if p.util_pct is not None and p.util_pct >= SATURATED_PCT:
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "warn",
                    f"port {p.util_pct:.0f} % busy ({rate})",
                    value,
                    "%",
                    "the port is saturated: collectives are bandwidth-bound here; check NCCL's rail "
                    "mapping (NCCL_IB_HCA) so every port carries its share",
                    ev,
                )
            )
        elif soft:
            what = ", ".join(f"{v} {k}" for k, v in sorted(soft.items()))
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "warn",
                    f"{what} in {view.interval_s:.0f} s ({rate})",
                    value,
                    "%",
                    "packets lost on the port: congestion or a marginal link; watch port_xmit_wait and "
                    "the switch",
                    ev,
                )
            )
        elif p.rx_bytes_s is None and p.tx_bytes_s is None:
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "ok" if view.interval_s else "unknown",
                    f"ACTIVE, {rate}"
                    + (
                        "; its traffic counters are not readable"
                        if view.interval_s
                        else "; rates need two readings"
                    ),
                    value,
                    "%",
                    "",
                    ev,
                )
            )
        else:
            out.append(
                Check(
                    "ib_port",
                    p.port,
                    "ok",
                    f"ACTIVE, {rate}: in {_rate(p.rx_bytes_s)}, out {_rate(p.tx_bytes_s)}",
                    value,
                    "%",
                    "",
                    ev,
                )
            )
    return out
