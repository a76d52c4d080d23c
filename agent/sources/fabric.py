"""The node's fabric as the host row reports it: NIC link speeds and InfiniBand/RoCE port counters.

A straggler or a slow all-reduce that the network causes shows on the
network's own counters, which the host row carries beside the CPU and disk
figures (:func:`gpufleet.agent.sources.host.host_rates` turns two readings
into the row's rates):

* **Ethernet**: errors and drops come with the byte counters in
  ``/proc/net/dev`` (the same kernel counters as
  ``/sys/class/net/<if>/statistics``); the link speed of each interface from
  ``/sys/class/net/<if>/speed`` (Mbit/s; the kernel answers -1 or refuses the
  read while the link is down), so an interface's utilisation is its larger
  direction against that speed, as ``sar -n DEV`` %ifutil does.
* **InfiniBand and RoCE** (``/sys/class/infiniband/<hca>/ports/<n>``):
  ``port_rcv_data``/``port_xmit_data`` count 32-bit words (4 octets), as the
  IBA performance-management attributes define them; where the driver offers
  the 64-bit ``counters_ext/*_64`` they are read instead.  The 32-bit PMA
  counters of older HCAs do not wrap: they stop at 2**32 - 1, so a counter
  found there says nothing about the interval and is left out rather than
  read as no traffic.  ``rate`` reads like ``100 Gb/sec (4X EDR)``; ``state``
  like ``4: ACTIVE``.  A counter the HCA does not implement reads
  ``N/A (no PMA)`` and is unknown, never 0.

Hardware sits behind ``sys_root`` so the tests read captured trees.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: A 32-bit PMA counter that reached this value has stopped counting (it saturates).
SATURATED_32 = 2**32 - 1
#: Octets per unit of ``port_rcv_data`` / ``port_xmit_data`` (32-bit words).
IB_DATA_WORD_BYTES = 4
#: The error counters the host row reports, by the catalog field each feeds.
IB_ERROR_COUNTERS: dict[str, str] = {
    "ib_symbol_errors": "symbol_error",
    "ib_link_downed": "link_downed",
    "ib_link_error_recovery": "link_error_recovery",
    "ib_rx_errors": "port_rcv_errors",
    "ib_tx_discards": "port_xmit_discards",
}
#: Where each error counter saturates: its width in the IBA PortCounters attribute.
IB_ERROR_CEILING: dict[str, int] = {
    "symbol_error": 0xFFFF,
    "link_downed": 0xFF,
    "link_error_recovery": 0xFF,
    "port_rcv_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
}
#: Traffic counters: (plain name, 64-bit name under counters_ext, multiplier to bytes or packets).
IB_TRAFFIC_COUNTERS: dict[str, tuple[str, str, int]] = {
    "rx_bytes": ("port_rcv_data", "port_rcv_data_64", IB_DATA_WORD_BYTES),
    "tx_bytes": ("port_xmit_data", "port_xmit_data_64", IB_DATA_WORD_BYTES),
    "rx_packets": ("port_rcv_packets", "port_rcv_packets_64", 1),
    "tx_packets": ("port_xmit_packets", "port_xmit_packets_64", 1),
}
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


@dataclass(frozen=True)
class IbPort:
    """One InfiniBand/RoCE port: its state, link rate and cumulative counters."""

    #: ``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED``... (the text after ``N:`` in ``state``).
    state: str | None
    #: Link rate, bytes/s (``rate``'s Gb/sec × 1e9 / 8); None when unreadable.
    rate_bytes_s: float | None
    #: ``InfiniBand`` or ``Ethernet`` (RoCE).
    link_layer: str | None = None
    #: ``rx_bytes``, ``tx_bytes`` (octets), ``rx_packets``, ``tx_packets``; absent when unknown.
    traffic: Mapping[str, int] = field(default_factory=dict)
    #: The :data:`IB_ERROR_COUNTERS` counters by their sysfs name; absent when unknown.
    errors: Mapping[str, int] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_counter(path: Path, ceiling: int | None = None) -> int | None:
    """A cumulative counter file; None when absent, not a number (``N/A (no PMA)``) or stuck at
    ``ceiling``, the value where a saturating counter stops."""
    text = _text(path)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    if value < 0 or (ceiling is not None and value == ceiling):
        return None
    return value


def parse_ib_rate(text: str | None) -> float | None:
    """``100 Gb/sec (4X EDR)`` -> bytes/s."""
    m = _RATE.match(text or "")
    return float(m.group(1)) * 1e9 / 8.0 if m else None


def parse_ib_state(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    if not text:
        return None
    return text.split(":", 1)[-1].strip() or None


def read_ib_port(port: Path) -> IbPort:
    counters, ext = port / "counters", port / "counters_ext"
    traffic: dict[str, int] = {}
    for key, (plain, wide, scale) in IB_TRAFFIC_COUNTERS.items():
        value = read_counter(ext / wide)
        if value is None:
            # The plain file is 64-bit on current drivers (mlx5) and a saturating 32-bit PMA
            # counter on old ones; exactly 2**32 - 1 is the latter's ceiling.
            value = read_counter(counters / plain, SATURATED_32)
        if value is not None:
            traffic[key] = value * scale
    errors: dict[str, int] = {}
    for name in IB_ERROR_COUNTERS.values():
        value = read_counter(counters / name, IB_ERROR_CEILING[name])
        if value is not None:
            errors[name] = value
    return IbPort(
        parse_ib_state(_text(port / "state")),
        parse_ib_rate(_text(port / "rate")),
        _text(port / "link_layer"),
        traffic,
        errors,
    )


def read_ib_ports(sys_root: Path | None) -> dict[str, IbPort]:
    """Every port of every HCA under ``/sys/class/infiniband``, keyed ``<hca>/<port>``."""
    if sys_root is None:
        return {}
    base = sys_root / "class" / "infiniband"
    if not base.is_dir():
        return {}
    out: dict[str, IbPort] = {}
    for hca in sorted(base.iterdir()):
        ports = hca / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: p.name):
            if port.is_dir():
                out[f"{hca.name}/{port.name}"] = read_ib_port(port)
    return out


def read_link_speeds(sys_root: Path | None, names: list[str]) -> dict[str, float]:
    """Link speed (bytes/s) of each named interface that reports one; a link down reports none."""
    if sys_root is None:
        return {}
    out: dict[str, float] = {}
    for name in names:
        d = sys_root / "class" / "net" / name
        if _text(d / "operstate") not in (None, "up", "unknown"):
            continue
        text = _text(d / "speed")
        try:
            mbit = int(text) if text is not None else -1
        except ValueError:
            continue
        if mbit > 0:
            out[name] = mbit * 1e6 / 8.0
    return out


def ib_rates(
    prev: Mapping[str, IbPort], curr: Mapping[str, IbPort], interval_s: float
) -> dict[str, float | int | None]:
    """The host row's ``ib_*`` fields between two readings of the ports.

    Traffic and utilisation count active ports only; a counter that went
    backwards (driver reload, port reset) leaves that port out of the
    interval.  Error counts are the increases over the interval, summed.
    Every field is None on a node without InfiniBand/RoCE ports.
    """
    row: dict[str, float | int | None] = {
        k: None
        for k in (
            "ib_rx_bytes_s",
            "ib_tx_bytes_s",
            "ib_rx_packets_s",
            "ib_tx_packets_s",
            "ib_link_bytes_s",
            "ib_util_pct",
            "ib_ports_down",
            *IB_ERROR_COUNTERS,
        )
    }
    if not curr:
        return row
    row["ib_ports_down"] = sum(1 for p in curr.values() if p.state is not None and not p.active)
    active = {k: p for k, p in curr.items() if p.active}
    row["ib_link_bytes_s"] = sum(p.rate_bytes_s for p in active.values() if p.rate_bytes_s) if active else 0.0
    if interval_s <= 0:
        return row
    sums = {"rx_bytes": 0.0, "tx_bytes": 0.0, "rx_packets": 0.0, "tx_packets": 0.0}
    seen = dict.fromkeys(sums, False)
    busiest: float | None = None
    for key, port in active.items():
        before = prev.get(key)
        if before is None:
            continue
        deltas: dict[str, int] = {}
        for name, value in port.traffic.items():
            old = before.traffic.get(name)
            if old is not None and value >= old:
                deltas[name] = value - old
        for name, d in deltas.items():
            sums[name] += d
            seen[name] = True
        if port.rate_bytes_s and ("rx_bytes" in deltas or "tx_bytes" in deltas):
            share = (
                100.0
                * max(deltas.get("rx_bytes", 0), deltas.get("tx_bytes", 0))
                / interval_s
                / port.rate_bytes_s
            )
            busiest = max(busiest or 0.0, min(share, 100.0))
    for name, field_name in (
        ("rx_bytes", "ib_rx_bytes_s"),
        ("tx_bytes", "ib_tx_bytes_s"),
        ("rx_packets", "ib_rx_packets_s"),
        ("tx_packets", "ib_tx_packets_s"),
    ):
        row[field_name] = sums[name] / interval_s if seen[name] else None
    row["ib_util_pct"] = busiest
    for field_name, counter in IB_ERROR_COUNTERS.items():
        total, known = 0, False
        for key, port in curr.items():
            before = prev.get(key)
            now, old = port.errors.get(counter), before.errors.get(counter) if before else None
            if now is None or old is None or now < old:
                continue
            total += now - old
            known = True
        row[field_name] = total if known else None
    return row
