"""Host counters (CPU, disks, network, optional power) as ``mpstat`` and ``iostat -x`` compute them.

The host row of ``host.csv`` promises numbers an operator can check against the
tools they already trust, so this module reads the same kernel counters those
tools read (``/proc/stat``, ``/proc/diskstats``, ``/proc/net/dev``,
``/proc/uptime``) and follows sysstat's arithmetic:

* CPU: ``mpstat`` "all" is the sum of the per-CPU lines, each CPU's interval
  being its own jiffy delta; ``%usr`` excludes guest time, ``%sys`` excludes
  irq/softirq; an offline CPU keeps its last values; a CPU whose iowait went
  backwards while idle grew is corrected the way sysstat does.
* Disks: ``iostat -x`` per whole device: ``%util`` = busy-time delta over the
  interval, ``await`` = (read + write + discard ticks) delta over the I/O count
  delta.  The interval is the ``/proc/uptime`` delta, exactly like sysstat.

The fabric (NIC errors, drops and link utilisation, InfiniBand/RoCE ports) is
read by :mod:`gpufleet.agent.sources.fabric` and folded into the same row.

Where sysstat would print made-up numbers we return NULL instead: a counter
that went backwards (device re-registered, interface re-created, CPU hot-plug,
VM restore) is a reset, so that device (or CPU) sits out this interval and
restarts from the new reading.  32-bit counters that wrap (diskstats tick
fields, old NIC byte counters) are recognised because their companions kept
growing.  The first reading has nothing to subtract from, so every rate is
``None`` rather than 0.

Hardware sits behind two parameters, ``proc_root`` and ``sys_root``, so tests
feed recorded ``/proc`` snapshots through the very same code.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.sources.base import HostRow, Reading, SourceError
from gpufleet.agent.sources.fabric import IbPort, ib_rates, read_ib_ports, read_link_speeds

log = logging.getLogger(__name__)

#: Bytes per diskstats sector: the kernel always counts 512-byte units here,
#: whatever the device's real sector size.
SECTOR_BYTES = 512
_U32 = 2**32

#: Block devices that are not disks: their I/O is memory (ram, zram) or is
#: counted again on the device holding the backing file (loop).
_NOT_A_DISK = re.compile(r"^(ram|zram|loop)\d+$")
#: Partition names, for when no /sys/block is at hand to tell.
_PARTITION = re.compile(
    r"^((sd|hd|vd|xvd)[a-z]+\d+|(nvme\d+n\d+|mmcblk\d+|md\d+|nbd\d+|rbd\d+|loop\d+)p\d+|cciss/c\d+d\d+p\d+)$"
)
#: Stacked block devices whose I/O is also counted on their member disks.
_STACKED = re.compile(r"^(dm-\d+|md\d+)$")
#: Virtual network interfaces, for when /sys/class/net is not at hand.
_VIRTUAL_NIC = re.compile(
    r"^(lo|virbr|veth|docker|br-|cni|flannel|cali|vxlan|tun|tap|bond|team|dummy|kube|weave|genev|"
    r"vnet|tailscale|wg|ifb|nlmon|gre|sit|ip6tnl|ip_vti|erspan|nodelocaldns|lxc|lxdbr|ovs|podman)"
)


@dataclass(frozen=True)
class CpuTimes:
    """One ``/proc/stat`` cpu line, in jiffies (USER_HZ ticks)."""

    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0
    guest: int = 0
    guest_nice: int = 0

    @property
    def total(self) -> int:
        """Jiffies spent in any state; guest time is already inside user/nice."""
        return (
            self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
        )


@dataclass(frozen=True)
class DiskCounters:
    """One ``/proc/diskstats`` line: I/O counts, 512-byte sectors, ticks in ms."""

    rd_ios: int
    rd_sectors: int
    rd_ticks_ms: int
    wr_ios: int
    wr_sectors: int
    wr_ticks_ms: int
    io_ticks_ms: int
    dc_ios: int = 0
    dc_sectors: int = 0
    dc_ticks_ms: int = 0

    @property
    def ios(self) -> int:
        return self.rd_ios + self.wr_ios + self.dc_ios


@dataclass(frozen=True)
class NetCounters:
    """One ``/proc/net/dev`` line: cumulative bytes, packets, errors and drops."""

    rx_bytes: int
    rx_packets: int
    tx_bytes: int
    tx_packets: int
    rx_errs: int = 0
    rx_drop: int = 0
    tx_errs: int = 0
    tx_drop: int = 0


@dataclass(frozen=True)
class RaplZone:
    """A powercap zone: cumulative energy and the value it wraps at, in µJ."""

    energy_uj: int
    max_energy_range_uj: int


@dataclass(frozen=True)
class HostSnapshot:
    """Everything one read of the host's counters produced."""

    #: Seconds since boot (``/proc/uptime``): the clock sysstat divides by.
    uptime_s: float
    #: Online CPUs by number; offline ones are absent, as in /proc/stat.
    cpus: Mapping[int, CpuTimes]
    #: Whole block devices (partitions, ram and loop devices left out).
    disks: Mapping[str, DiskCounters] = field(default_factory=dict)
    #: Names of disks whose I/O is also counted on their members (dm, md).
    stacked_disks: frozenset[str] = frozenset()
    #: Physical network interfaces by name.
    nets: Mapping[str, NetCounters] = field(default_factory=dict)
    #: RAPL zones by sysfs name; empty when unreadable or absent.
    rapl: Mapping[str, RaplZone] = field(default_factory=dict)
    #: Link speed (bytes/s) of the physical interfaces whose link is up and reports one.
    links: Mapping[str, float] = field(default_factory=dict)
    #: InfiniBand/RoCE ports, ``<hca>/<port>``: None when not read (the fabric is off).
    ib: Mapping[str, IbPort] | None = None


# --------------------------------------------------------------------------- parsing


def parse_uptime(text: str) -> float:
    """Seconds since boot: the first number of ``/proc/uptime``."""
    return float(text.split()[0])


def parse_proc_stat(text: str) -> dict[int, CpuTimes]:
    """Per-CPU jiffies from ``/proc/stat`` (``cpuN`` lines; the ``cpu`` sum line is ignored).

    Old kernels print fewer columns; missing ones are 0.
    """
    cpus: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        parts = line.split()
        try:
            num = int(parts[0][3:])
            values = [int(v) for v in parts[1:11]]
        except ValueError:
            continue
        cpus[num] = CpuTimes(*values)
    return cpus


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    """Every device line of ``/proc/diskstats`` with extended statistics.

    Accepts the 14-field (kernel < 4.18), 18-field (+discard) and 20-field
    (+flush) layouts; the 7-field layout of old partitions carries no ticks and
    is skipped, as ``iostat -x`` does.
    """
    disks: dict[str, DiskCounters] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 14:
            continue
        try:
            v = [int(x) for x in parts[3:]]
        except ValueError:
            continue
        # v: rd_ios rd_merges rd_sectors rd_ticks wr_ios wr_merges wr_sectors wr_ticks
        #    in_flight io_ticks time_in_queue [dc_ios dc_merges dc_sectors dc_ticks [fl_ios fl_ticks]]
        discard = v[11:15] if len(v) >= 15 else [0, 0, 0, 0]
        disks[parts[2]] = DiskCounters(
            rd_ios=v[0],
            rd_sectors=v[2],
            rd_ticks_ms=v[3],
            wr_ios=v[4],
            wr_sectors=v[6],
            wr_ticks_ms=v[7],
            io_ticks_ms=v[9],
            dc_ios=discard[0],
            dc_sectors=discard[2],
            dc_ticks_ms=discard[3],
        )
    return disks


def parse_net_dev(text: str) -> dict[str, NetCounters]:
    """Cumulative byte and packet counters per interface from ``/proc/net/dev``."""
    nets: dict[str, NetCounters] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue
        v = rest.split()
        if len(v) < 10:
            continue
        try:
            nets[name.strip()] = NetCounters(
                int(v[0]),
                int(v[1]),
                int(v[8]),
                int(v[9]),
                rx_errs=int(v[2]),
                rx_drop=int(v[3]),
                tx_errs=int(v[10]),
                tx_drop=int(v[11]),
            )
        except (ValueError, IndexError):
            continue
    return nets


# --------------------------------------------------------------------------- device selection


def is_whole_disk(name: str, sys_root: Path | None) -> bool:
    """True for a whole block device worth counting (not a partition, ram or loop device).

    With sysfs, a whole device is one listed in ``/sys/block`` (how iostat
    tells them apart); without it, partition names are recognised by pattern.
    """
    if _NOT_A_DISK.match(name):
        return False
    block = sys_root / "block" if sys_root is not None else None
    if block is not None and block.is_dir():
        return (block / name.replace("/", "!")).exists()
    return not _PARTITION.match(name)


def is_stacked_disk(name: str, sys_root: Path | None) -> bool:
    """True for a device built on other disks (LVM, dm-crypt, md RAID).

    Its traffic reaches the member disks too, so summing it would count bytes
    twice; it still competes for "busiest device".
    """
    block = sys_root / "block" if sys_root is not None else None
    if block is not None and block.is_dir():
        slaves = block / name.replace("/", "!") / "slaves"
        return slaves.is_dir() and any(slaves.iterdir())
    return bool(_STACKED.match(name))


def is_physical_nic(name: str, sys_root: Path | None) -> bool:
    """True for an interface backed by a device (``/sys/class/net/<if>/device`` exists).

    Without sysfs, well-known virtual name prefixes (lo, veth, docker, virbr,
    bridges, tunnels, bonds...) are left out instead.
    """
    net = sys_root / "class" / "net" if sys_root is not None else None
    if net is not None and net.is_dir():
        return (net / name / "device").exists()
    return not _VIRTUAL_NIC.match(name)


def read_rapl(sys_root: Path | None) -> dict[str, RaplZone]:
    """RAPL energy counters that together cover the host's CPUs and memory.

    Package zones (``intel-rapl:N``) plus their ``dram`` sub-zones; a ``psys``
    zone, where present, already covers the whole platform and is used alone.
    Unreadable counters (recent kernels restrict ``energy_uj`` to root) give
    an empty result.
    """
    if sys_root is None:
        return {}
    base = sys_root / "class" / "powercap"
    if not base.is_dir():
        return {}
    zones: dict[str, RaplZone] = {}
    psys: dict[str, RaplZone] = {}
    for zone in sorted(base.glob("intel-rapl:*")):
        name_file = zone / "name"
        try:
            kind = name_file.read_text().strip()
            depth = zone.name.count(":")
            if depth == 1 or (depth == 2 and kind == "dram"):
                reading = RaplZone(
                    int((zone / "energy_uj").read_text()), int((zone / "max_energy_range_uj").read_text())
                )
            else:
                continue
        except (OSError, ValueError):
            continue
        (psys if kind == "psys" else zones)[zone.name] = reading
    return psys or zones


# --------------------------------------------------------------------------- arithmetic


def cpu_percentages(prev: Mapping[int, CpuTimes], curr: Mapping[int, CpuTimes]) -> dict[str, float] | None:
    """``mpstat`` "all" %usr, %sys, %iowait, %idle between two per-CPU readings.

    ``curr`` should already carry offline CPUs' previous values (see
    :func:`carry_offline_cpus`).  A CPU absent from ``prev`` just came online
    and sits out, as does one whose total went backwards (counters restarted).
    Returns None when no CPU contributed a tick.
    """
    user = system = iowait = idle = 0.0
    interval = 0
    for num, c in curr.items():
        p = prev.get(num)
        if p is None or c.total < p.total:
            continue
        # sysstat: iowait may go backwards (accounted as idle afterwards); if
        # idle grew, trust the new iowait, otherwise the CPU restarted from 0.
        p_iowait, p_idle = p.iowait, p.idle
        if c.iowait < p_iowait:
            p_iowait = c.iowait if c.idle > p_idle else 0
        if c.idle < p_idle:
            p_idle = 0
        shift = 0
        if c.user >= p.user and (c.user - c.guest) < (p.user - p.guest):
            shift += (p.user - p.guest) - (c.user - c.guest)
        if c.nice >= p.nice and (c.nice - c.guest_nice) < (p.nice - p.guest_nice):
            shift += (p.nice - p.guest_nice) - (c.nice - c.guest_nice)
        interval += shift + sum(
            max(0, b - a)
            for a, b in (
                (p.user, c.user),
                (p.nice, c.nice),
                (p.system, c.system),
                (p_iowait, c.iowait),
                (p_idle, c.idle),
                (p.steal, c.steal),
                (p.irq, c.irq),
                (p.softirq, c.softirq),
            )
        )
        user += max(0, (c.user - c.guest) - (p.user - p.guest))
        system += max(0, c.system - p.system)
        iowait += max(0, c.iowait - p_iowait)
        idle += max(0, c.idle - p_idle)
    if interval <= 0:
        return None
    return {
        "cpu_user_pct": 100.0 * user / interval,
        "cpu_system_pct": 100.0 * system / interval,
        "cpu_iowait_pct": 100.0 * iowait / interval,
        "cpu_idle_pct": 100.0 * idle / interval,
    }


def carry_offline_cpus(prev: Mapping[int, CpuTimes], curr: Mapping[int, CpuTimes]) -> dict[int, CpuTimes]:
    """Current per-CPU times plus the last known times of CPUs that went offline.

    mpstat keeps an offline CPU's values so that, when it comes back, its
    counters are compared with what it had rather than with nothing.
    """
    return {**{n: t for n, t in prev.items() if n not in curr}, **curr}


def _tick_delta(prev: int, curr: int) -> int:
    """Delta of a 32-bit millisecond counter that may have wrapped once."""
    return curr - prev if curr >= prev else curr + _U32 - prev


def disk_reset(prev: DiskCounters, curr: DiskCounters) -> bool:
    """True when the device's counters restarted (re-registered, driver reload).

    I/O counts and sector counts are 64-bit on any current kernel, so one of
    them going backwards is a reset; tick fields alone may just have wrapped.
    """
    pairs = (
        (prev.rd_ios, curr.rd_ios),
        (prev.wr_ios, curr.wr_ios),
        (prev.dc_ios, curr.dc_ios),
        (prev.rd_sectors, curr.rd_sectors),
        (prev.wr_sectors, curr.wr_sectors),
        (prev.dc_sectors, curr.dc_sectors),
    )
    return any(c < p for p, c in pairs)


@dataclass(frozen=True)
class DiskRates:
    """One device's ``iostat -x`` figures over an interval."""

    read_bytes_s: float
    write_bytes_s: float
    util_pct: float
    await_ms: float


def disk_rates(prev: DiskCounters, curr: DiskCounters, interval_s: float) -> DiskRates | None:
    """``iostat -x`` rkB/s, wkB/s (as bytes/s), %util and await; None after a reset."""
    if interval_s <= 0 or disk_reset(prev, curr):
        return None
    ios = curr.ios - prev.ios
    ticks = (
        _tick_delta(prev.rd_ticks_ms, curr.rd_ticks_ms)
        + _tick_delta(prev.wr_ticks_ms, curr.wr_ticks_ms)
        + _tick_delta(prev.dc_ticks_ms, curr.dc_ticks_ms)
    )
    busy_ms = _tick_delta(prev.io_ticks_ms, curr.io_ticks_ms)
    return DiskRates(
        read_bytes_s=(curr.rd_sectors - prev.rd_sectors) * SECTOR_BYTES / interval_s,
        write_bytes_s=(curr.wr_sectors - prev.wr_sectors) * SECTOR_BYTES / interval_s,
        # iostat can print a little over 100 from tick rounding; the catalog
        # bounds %util to 0-100, so clamp rather than have the row refused.
        util_pct=min(100.0, 100.0 * busy_ms / (interval_s * 1000.0)),
        await_ms=ticks / ios if ios > 0 else 0.0,
    )


def _net_delta(prev: int, curr: int, prev_packets: int, curr_packets: int) -> int | None:
    """Byte delta, allowing one wrap of a 32-bit counter; None for a reset."""
    if curr >= prev:
        return curr - prev
    if prev < _U32 and curr_packets >= prev_packets:
        return curr + _U32 - prev
    return None


def rapl_power_w(
    prev: Mapping[str, RaplZone], curr: Mapping[str, RaplZone], interval_s: float
) -> float | None:
    """Average power of the RAPL zones over the interval, W; counters wrap at max_energy_range_uj."""
    if interval_s <= 0:
        return None
    total_uj = 0
    seen = False
    for name, c in curr.items():
        p = prev.get(name)
        if p is None:
            continue
        delta = c.energy_uj - p.energy_uj
        if delta < 0:
            delta += c.max_energy_range_uj
            if delta < 0:
                continue
        total_uj += delta
        seen = True
    return total_uj / 1e6 / interval_s if seen else None


def host_rates(prev: HostSnapshot | None, curr: HostSnapshot) -> HostRow:
    """The catalog's host fields between two snapshots (rates None when ``prev`` is None)."""
    row: HostRow = {
        "cpu_user_pct": None,
        "cpu_system_pct": None,
        "cpu_iowait_pct": None,
        "cpu_idle_pct": None,
        "cpu_count": len(curr.cpus),
        "disk_read_bytes_s": None,
        "disk_write_bytes_s": None,
        "disk_util_pct": None,
        "disk_await_ms": None,
        "net_rx_bytes_s": None,
        "net_tx_bytes_s": None,
        "host_power_w": None,
    }
    fabric = curr.ib is not None
    if fabric:
        row.update(
            net_errors=None,
            net_drops=None,
            net_util_pct=None,
            net_link_bytes_s=sum(curr.links.values()) if curr.links else None,
        )
        row.update(ib_rates({}, curr.ib or {}, 0.0))
    if prev is None:
        return row
    interval = curr.uptime_s - prev.uptime_s
    if interval <= 0:
        # The uptime went backwards: a reboot between readings; nothing to compare.
        return row
    cpu = cpu_percentages(prev.cpus, curr.cpus)
    if cpu is not None:
        row.update(cpu)

    per_disk = {}
    for name, c in curr.disks.items():
        p = prev.disks.get(name)
        if p is not None and (r := disk_rates(p, c, interval)) is not None:
            per_disk[name] = r
    if per_disk:
        leaves = [r for n, r in per_disk.items() if n not in curr.stacked_disks] or list(per_disk.values())
        row["disk_read_bytes_s"] = sum(r.read_bytes_s for r in leaves)
        row["disk_write_bytes_s"] = sum(r.write_bytes_s for r in leaves)
        busiest = max(per_disk.values(), key=lambda r: (r.util_pct, r.await_ms))
        row["disk_util_pct"] = busiest.util_pct
        row["disk_await_ms"] = busiest.await_ms

    rx = tx = errors = drops = 0
    counted = False
    busiest_nic: float | None = None
    for nic, now in curr.nets.items():
        before = prev.nets.get(nic)
        if before is None:
            continue
        drx = _net_delta(before.rx_bytes, now.rx_bytes, before.rx_packets, now.rx_packets)
        dtx = _net_delta(before.tx_bytes, now.tx_bytes, before.tx_packets, now.tx_packets)
        if drx is None or dtx is None:
            continue
        rx += drx
        tx += dtx
        counted = True
        # Error and drop counters are unsigned long like the byte counters; one that went
        # backwards while the bytes did not is a 32-bit wrap, counted as none rather than guessed.
        errors += max(0, now.rx_errs - before.rx_errs) + max(0, now.tx_errs - before.tx_errs)
        drops += max(0, now.rx_drop - before.rx_drop) + max(0, now.tx_drop - before.tx_drop)
        speed = curr.links.get(nic)
        if speed:
            busiest_nic = max(busiest_nic or 0.0, min(100.0, 100.0 * max(drx, dtx) / interval / speed))
    if counted:
        row["net_rx_bytes_s"] = rx / interval
        row["net_tx_bytes_s"] = tx / interval
        if fabric:
            row["net_errors"] = errors
            row["net_drops"] = drops
            row["net_util_pct"] = busiest_nic
    if fabric and prev.ib is not None:
        row.update(ib_rates(prev.ib, curr.ib or {}, interval))

    row["host_power_w"] = rapl_power_w(prev.rapl, curr.rapl, interval)
    return row


# --------------------------------------------------------------------------- the source


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SourceError(f"host: cannot read {path}: {e}") from e


def read_snapshot(
    proc_root: Path, sys_root: Path | None, rapl: bool = True, fabric: bool = False
) -> HostSnapshot:
    """Read one :class:`HostSnapshot` from a ``/proc`` tree (and ``/sys`` when given); ``fabric``
    adds the link speeds and InfiniBand/RoCE ports (:mod:`gpufleet.agent.sources.fabric`)."""
    stat = _read(proc_root / "stat")
    uptime = _read(proc_root / "uptime")
    if stat is None or uptime is None:
        raise SourceError(f"host: {proc_root}/stat or {proc_root}/uptime missing")
    try:
        uptime_s = parse_uptime(uptime)
    except (ValueError, IndexError) as e:
        raise SourceError(f"host: malformed {proc_root}/uptime: {uptime!r}") from e
    cpus = parse_proc_stat(stat)
    if not cpus:
        raise SourceError(f"host: no cpuN lines in {proc_root}/stat")

    diskstats = _read(proc_root / "diskstats") or ""
    disks = {n: d for n, d in parse_diskstats(diskstats).items() if is_whole_disk(n, sys_root)}
    stacked = frozenset(n for n in disks if is_stacked_disk(n, sys_root))
    netdev = _read(proc_root / "net" / "dev") or ""
    nets = {n: c for n, c in parse_net_dev(netdev).items() if is_physical_nic(n, sys_root)}
    return HostSnapshot(
        uptime_s=uptime_s,
        cpus=cpus,
        disks=disks,
        stacked_disks=stacked,
        nets=nets,
        rapl=read_rapl(sys_root) if rapl else {},
        links=read_link_speeds(sys_root, sorted(nets)) if fabric else {},
        ib=read_ib_ports(sys_root) if fabric else None,
    )


class HostSource:
    """The ``host`` source: one ``host.csv`` row per collect, rates over the time since the last one.

    ``host_power_w`` is a configured constant (watts, excluding GPUs) that wins
    over RAPL, for hosts whose BMC figure is known; without it RAPL package and
    DRAM energy is used where readable (an under-estimate: fans, NICs and
    drives are not in it).
    """

    name = "host"

    def __init__(
        self,
        proc_root: Path | str = "/proc",
        sys_root: Path | str | None = "/sys",
        host_power_w: float | None = None,
        rapl: bool = True,
        fabric: bool = True,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root) if sys_root is not None else None
        self.host_power_w = host_power_w
        self.rapl = rapl and host_power_w is None
        self.fabric = fabric
        self._prev: HostSnapshot | None = None

    def collect(self) -> Reading:
        snap = read_snapshot(self.proc_root, self.sys_root, rapl=self.rapl, fabric=self.fabric)
        return Reading(host=self.update(snap))

    def update(self, snap: HostSnapshot) -> HostRow:
        """Fold in a snapshot read elsewhere (replay, tests) and return the row."""
        row = host_rates(self._prev, snap)
        if self.host_power_w is not None:
            row["host_power_w"] = self.host_power_w
        prev_cpus = self._prev.cpus if self._prev is not None else {}
        self._prev = HostSnapshot(
            uptime_s=snap.uptime_s,
            cpus=carry_offline_cpus(prev_cpus, snap.cpus),
            disks=snap.disks,
            stacked_disks=snap.stacked_disks,
            nets=snap.nets,
            rapl=snap.rapl,
            links=snap.links,
            ib=snap.ib,
        )
        return row
