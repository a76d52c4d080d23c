"""Where things sit on the host: NUMA nodes' CPUs, a PCI device's node and link, a process's CPUs.

A GPU fed by a data loader on the other socket moves every batch across the
inter-socket link, and a PCIe link that trained below its generation or width
halves the host-to-GPU bandwidth.  The kernel says both in sysfs and procfs:

* ``/sys/devices/system/node/node<N>/cpulist``: the CPUs of each NUMA node;
* ``/sys/bus/pci/devices/<domain:bus:dev.fn>/``: ``numa_node`` (-1: the
  platform does not say), ``local_cpulist``, ``current_link_speed`` /
  ``current_link_width`` against ``max_link_speed`` / ``max_link_width``
  (``"16.0 GT/s PCIe"``: the transfer rate names the generation);
* ``/proc/<pid>/status`` ``Cpus_allowed_list``: the CPUs a process may run on
  (its affinity and cpuset), and ``/proc/<pid>/stat`` field 39: the CPU it
  last ran on.

Both roots are parameters; a missing or unreadable file is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.sources.facts import parse_cpu_list

#: PCIe transfer rate (GT/s) of each generation.
GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError:
        return None


def numa_nodes(sys_root: Path | str) -> dict[int, list[int]]:
    """NUMA node -> its CPUs; empty when the host exposes no NUMA topology."""
    base = Path(sys_root) / "devices" / "system" / "node"
    out: dict[int, list[int]] = {}
    try:
        entries = sorted(base.glob("node[0-9]*"))
    except OSError:
        return out
    for d in entries:
        cpus = _cpus(_read(d / "cpulist"))
        if cpus is not None and d.name[4:].isdigit():
            out[int(d.name[4:])] = cpus
    return out


def nodes_of(cpus: list[int], nodes: dict[int, list[int]]) -> list[int]:
    """The NUMA nodes ``cpus`` fall on, sorted."""
    have = set(cpus)
    return sorted(n for n, c in nodes.items() if have & set(c))


def pcie_gen(speed: str | None) -> int | None:
    """Generation from a sysfs link speed (``"8.0 GT/s PCIe"``, ``"2.5 GT/s"``); None when unknown."""
    if not speed:
        return None
    try:
        gts = float(speed.split()[0])
    except (ValueError, IndexError):
        return None
    return GEN_OF_GTS.get(gts)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class PciDevice:
    bus_id: str
    numa_node: int | None
    local_cpus: list[int] | None
    link_speed: str | None
    link_width: int | None
    max_link_speed: str | None
    max_link_width: int | None

    @property
    def link_gen(self) -> int | None:
        return pcie_gen(self.link_speed)

    @property
    def max_link_gen(self) -> int | None:
        return pcie_gen(self.max_link_speed)


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:83:00.0`` as sysfs names it, ``0000:83:00.0``; sysfs names pass unchanged."""
    domain, _, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}"
    except ValueError:
        return bus_id.lower()


def pci_device(sys_root: Path | str, bus_id: str) -> PciDevice | None:
    """The sysfs view of a PCI device; None when it is not there."""
    d = Path(sys_root) / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id)
    if not d.exists():
        return None
    numa = _int(_read(d / "numa_node"))
    return PciDevice(
        bus_id=sysfs_bus_id(bus_id),
        numa_node=numa if numa is not None and numa >= 0 else None,
        local_cpus=_cpus(_read(d / "local_cpulist")),
        link_speed=_read(d / "current_link_speed"),
        link_width=_int(_read(d / "current_link_width")),
        max_link_speed=_read(d / "max_link_speed"),
        max_link_width=_int(_read(d / "max_link_width")),
    )


def cpus_allowed(proc_root: Path | str, pid: int | str) -> list[int] | None:
    """``Cpus_allowed_list`` of ``/proc/<pid>/status``: where the process may run."""
    text = _read(Path(proc_root) / str(pid) / "status")
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            return _cpus(value.strip())
    return None


def last_cpu(proc_root: Path | str, pid: int | str) -> int | None:
    """The CPU the process last ran on (``/proc/<pid>/stat`` field 39)."""
    text = _read(Path(proc_root) / str(pid) / "stat")
    if text is None or ")" not in text:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    rest = text.rsplit(")", 1)[1].split()
    return _int(rest[36]) if len(rest) > 36 else None
