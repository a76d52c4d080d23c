"""A process's own cgroup (v1 and v2): what CPU it may use, what it used, how often it was held back.

A data loader starving eight GPUs on a 192-core host saturates its cgroup,
not the host: the host's CPU stays low while the job sits at its quota.  So
the starvation cause is read from the job's cgroup, found from the
processes on each GPU.  This module is the one reader of cgroups for the
agent's per-tick ``job_*`` columns (:mod:`gpufleet.agent.jobstats`) and for
``gpufleet diagnose``.

Where things are (both given as parameters, so a DaemonSet that mounts the
host's ``/proc`` at ``/host/proc`` and ``/sys`` at ``/host/sys``, and tests
with recorded trees, use the same code):

* ``<proc_root>/<pid>/cgroup``: ``hierarchy:controllers:path`` lines; v2 is
  the line ``0::<path>``.  Seen from inside a cgroup namespace (a container
  on cgroup v2), the path of a process outside it is relative to the
  namespace's root: ``0::/../../kubepods.slice/.../cri-containerd-<id>.scope``.
  The leading ``..`` steps cannot be resolved without knowing where that
  root is, so the rest of the path is looked for below the hierarchy's root,
  shallowest first, and used only where exactly one directory matches (a
  container's leaf name is unique); otherwise the cgroup is reported as not
  found, never guessed.
* ``<sys_root>/fs/cgroup``: the unified (v2) hierarchy when it holds
  ``cgroup.controllers``, else v1 controllers (``cpu,cpuacct``, or ``cpu``
  and ``cpuacct`` apart) with the unified one, if any, at ``unified``.

What is read:

* v2: ``cpu.stat`` (``usage_usec``, ``nr_periods``, ``nr_throttled``,
  ``throttled_usec``), ``cpu.max`` of the cgroup and of every ancestor (the
  tightest quota binds), ``cpuset.cpus.effective``, ``cpu.pressure`` and
  ``io.pressure`` (``some``/``full`` ``total=`` in µs), ``io.stat``
  (``rbytes``/``wbytes``).
* v1: ``cpuacct.usage`` (ns), ``cpu.stat`` (``nr_periods``,
  ``nr_throttled``, ``throttled_time`` in ns), ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us`` along the path, ``cpuset.effective_cpus``,
  ``blkio.throttle.io_service_bytes``; no pressure files.

The CPU the job may use is the tightest of its CFS quota and the CPUs its
cpuset allows (Slurm confines jobs with cpusets, Kubernetes with quotas);
``None`` when neither is narrower than the host.  Usage and throttling are
read where the binding quota is set (a pod-level quota covers all its
containers), else at the process's own cgroup.  A file that is absent (no
PSI, no cpu controller enabled) is ``None``: a gap, never a zero.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.sources.facts import parse_cpu_list

log = logging.getLogger(__name__)

#: How deep below a hierarchy's root a namespace-relative path is looked for.
MAX_SEARCH_DEPTH = 6
#: Names of cgroup v1 hierarchies (a directory named ``cpu,cpuacct`` mounts two).
V1_CONTROLLERS = frozenset(
    {
        "cpu",
        "cpuacct",
        "cpuset",
        "memory",
        "blkio",
        "io",
        "pids",
        "devices",
        "freezer",
        "net_cls",
        "net_prio",
        "perf_event",
        "hugetlb",
        "rdma",
        "misc",
        "systemd",
        "name=systemd",
        "elogind",
    }
)
#: Counters above this are not counts but a kernel's negative value printed unsigned.
_SANE_MAX = 2**62


@dataclass(frozen=True)
class CgroupLine:
    """One line of ``/proc/<pid>/cgroup``."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


def parse_proc_cgroup(text: str) -> list[CgroupLine]:
    """The lines of a ``/proc/<pid>/cgroup`` file (malformed lines are skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        try:
            hid = int(parts[0])
        except ValueError:
            continue
        ctrls = tuple(c for c in parts[1].split(",") if c)
        out.append(CgroupLine(hid, ctrls, parts[2].strip() or "/"))
    return out


@dataclass(frozen=True)
class CgroupPlace:
    """Where one process's cgroup lives on this host."""

    version: int
    #: The path as ``/proc/<pid>/cgroup`` printed it (of the CPU hierarchy).
    path: str
    #: The process's own cgroup directory: v2 the unified one, v1 the ``cpu`` controller's.
    cpu_dir: Path
    #: Root of that hierarchy (ancestors are walked up to here).
    root: Path
    #: v1 only: the ``cpuacct``, ``cpuset`` and ``blkio`` directories, where found.
    cpuacct_dir: Path | None = None
    cpuset_dir: Path | None = None
    blkio_dir: Path | None = None
    cpuacct_root: Path | None = None

    @property
    def key(self) -> str:
        """Identifies the cgroup (the same directory is the same job)."""
        return f"v{self.version}:{self.cpu_dir}"

    @property
    def name(self) -> str:
        """The cgroup path below its hierarchy's root, as an operator would look for it."""
        rel = _relative(self.cpu_dir, self.root)
        if rel is None:
            return self.path
        return "/" if rel == Path(".") else "/" + rel.as_posix()


@dataclass(frozen=True)
class Quota:
    """The CPU a cgroup may use and where the binding limit is set."""

    #: Cores, None when nothing narrower than the host applies.
    cores: float | None
    #: ``cfs`` (cpu.max / cfs_quota_us), ``cpuset`` or None.
    kind: str | None = None
    #: Directory holding the binding CFS quota (None: no CFS quota anywhere on the path).
    cfs_dir: Path | None = None
    cfs_cores: float | None = None
    cpuset_cpus: int | None = None


@dataclass(frozen=True)
class CgroupStats:
    """One reading of a cgroup's cumulative counters (µs and bytes); None where not offered."""

    place: CgroupPlace
    quota: Quota
    usage_usec: int | None = None
    nr_periods: int | None = None
    nr_throttled: int | None = None
    throttled_usec: int | None = None
    cpu_some_usec: int | None = None
    cpu_full_usec: int | None = None
    io_some_usec: int | None = None
    io_full_usec: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    #: The PSI ten-second averages the kernel keeps, %: a rate on the first reading too.
    cpu_some_avg10: float | None = None
    io_some_avg10: float | None = None


@dataclass(frozen=True)
class CgroupRates:
    """A cgroup over an interval: the ``job_*`` catalog fields plus I/O rates."""

    cpu_cores: float | None = None
    cpu_quota_cores: float | None = None
    cpu_throttled_share: float | None = None
    cpu_pressure_pct: float | None = None
    io_pressure_pct: float | None = None
    io_read_bytes_s: float | None = None
    io_write_bytes_s: float | None = None
    interval_s: float | None = None

    def catalog(self) -> dict[str, float | None]:
        """The GPU-row fields of the metric catalog."""
        return {
            "job_cpu_cores": self.cpu_cores,
            "job_cpu_quota_cores": self.cpu_quota_cores,
            "job_cpu_throttled_share": self.cpu_throttled_share,
            "job_cpu_pressure_pct": self.cpu_pressure_pct,
            "job_io_pressure_pct": self.io_pressure_pct,
        }


# --------------------------------------------------------------------------- file parsers


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
        return None
    except OSError as e:
        log.debug("cgroup: cannot read %s: %s", path, e)
        return None


def _count(text: str) -> int | None:
    try:
        v = int(text)
    except ValueError:
        return None
    return v if 0 <= v < _SANE_MAX else None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``cpu.stat``); values that are not sane counts are left out."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and (v := _count(parts[1])) is not None:
            out[parts[0]] = v
    return out


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """PSI lines: ``{"some": {"avg10": 4.3, ..., "total": 1676316.0}, "full": {...}}``."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        vals: dict[str, float] = {}
        for kv in parts[1:]:
            k, _, v = kv.partition("=")
            try:
                vals[k] = float(v)
            except ValueError:
                continue
        out[parts[0]] = vals
    return out


def parse_cpu_max(text: str) -> float | None:
    """``cpu.max`` (``"200000 100000"`` or ``"max 100000"``) as cores; None when unlimited or malformed."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_io_stat(text: str) -> tuple[int, int]:
    """Read and written bytes summed over devices from v2 ``io.stat``."""
    rd = wr = 0
    for line in text.splitlines():
        for kv in line.split()[1:]:
            k, _, v = kv.partition("=")
            n = _count(v)
            if n is None:
                continue
            if k == "rbytes":
                rd += n
            elif k == "wbytes":
                wr += n
    return rd, wr


def parse_blkio_bytes(text: str) -> tuple[int, int]:
    """Read and written bytes from v1 ``blkio.throttle.io_service_bytes`` (``MAJ:MIN Read N`` lines)."""
    rd = wr = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or (n := _count(parts[2])) is None:
            continue
        if parts[1] == "Read":
            rd += n
        elif parts[1] == "Write":
            wr += n
    return rd, wr


# --------------------------------------------------------------------------- the reader


@dataclass
class _Layout:
    unified: Path | None
    v1: dict[frozenset[str], Path] = field(default_factory=dict)


class CgroupReader:
    """Finds and reads processes' cgroups under ``proc_root`` and ``sys_root``."""

    def __init__(self, proc_root: Path | str = "/proc", sys_root: Path | str = "/sys") -> None:
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.root = self.sys_root / "fs" / "cgroup"
        self._layout: _Layout | None = None
        self._online_cpus: int | None = None

    # -- layout ------------------------------------------------------------------------

    @property
    def layout(self) -> _Layout:
        if self._layout is None:
            self._layout = self._discover()
        return self._layout

    def _discover(self) -> _Layout:
        root = self.root
        try:
            entries = sorted(d for d in root.iterdir() if d.is_dir())
        except OSError:
            return _Layout(unified=None)
        v1 = {
            frozenset(d.name.split(",")): d
            for d in entries
            if d.name != "unified" and set(d.name.split(",")) <= V1_CONTROLLERS
        }
        # A v2 host has cgroup.controllers at the root; a root that holds no
        # v1 controller directory at all is taken as unified too.
        if (root / "cgroup.controllers").exists() or not v1:
            return _Layout(unified=root)
        unified = root / "unified"
        return _Layout(unified=unified if unified.is_dir() else None, v1=v1)

    def _v1_dir(self, controller: str, lines: list[CgroupLine]) -> tuple[Path, Path] | None:
        """(root, directory) of the v1 hierarchy holding ``controller`` for this process."""
        for line in lines:
            if line.hierarchy == 0 or controller not in line.controllers:
                continue
            candidates = [frozenset(line.controllers), frozenset([controller])]
            for key in candidates:
                base = self.layout.v1.get(key)
                if base is None:
                    continue
                d = resolve_path(base, line.path)
                if d is not None:
                    return base, d
        return None

    def online_cpus(self) -> int | None:
        if self._online_cpus is None:
            text = _read(self.sys_root / "devices" / "system" / "cpu" / "online")
            try:
                self._online_cpus = len(parse_cpu_list(text.strip())) if text else None
            except ValueError:
                self._online_cpus = None
        return self._online_cpus

    # -- locating ------------------------------------------------------------------------

    def locate(self, pid: int | str) -> CgroupPlace | None:
        """The cgroup of process ``pid`` (``"self"`` allowed); None when it exited or cannot be found."""
        text = _read(self.proc_root / str(pid) / "cgroup")
        if text is None:
            return None
        return self.locate_lines(parse_proc_cgroup(text))

    def locate_lines(self, lines: list[CgroupLine]) -> CgroupPlace | None:
        cpu = self._v1_dir("cpu", lines)
        if cpu is not None:
            root, d = cpu
            path = next(x.path for x in lines if "cpu" in x.controllers)
            acct = self._v1_dir("cpuacct", lines)
            cset = self._v1_dir("cpuset", lines)
            blk = self._v1_dir("blkio", lines)
            return CgroupPlace(
                1,
                path,
                d,
                root,
                acct[1] if acct else None,
                cset[1] if cset else None,
                blk[1] if blk else None,
                acct[0] if acct else None,
            )
        unified = self.layout.unified
        v2 = next((x for x in lines if x.hierarchy == 0 and not x.controllers), None)
        if unified is None or v2 is None:
            return None
        leaf = resolve_path(unified, v2.path)
        if leaf is None:
            return None
        return CgroupPlace(2, v2.path, leaf, unified)

    # -- reading -------------------------------------------------------------------------

    def quota(self, place: CgroupPlace) -> Quota:
        """The tightest CFS quota on the path to the root, and the cpuset's CPU count."""
        best: float | None = None
        best_dir: Path | None = None
        for d in _up(place.cpu_dir, place.root):
            if place.version == 2:
                text = _read(d / "cpu.max")
                cores = parse_cpu_max(text) if text is not None else None
            else:
                q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                cores = None
                if q is not None and p is not None and q.strip() != "-1":
                    cores = parse_cpu_max(f"{q.strip()} {p.strip()}")
            if cores is not None and (best is None or cores < best):
                best, best_dir = cores, d
        ncpu = self._cpuset_cpus(place)
        online = self.online_cpus()
        if ncpu is not None and (online is None or ncpu >= online):
            ncpu = None  # the cpuset allows the whole host (or the host's size is unknown): no restriction
        if best is not None and (ncpu is None or best <= ncpu):
            return Quota(best, "cfs", best_dir, best, ncpu)
        if ncpu is not None:
            return Quota(float(ncpu), "cpuset", best_dir, best, ncpu)
        return Quota(None)

    def _cpuset_cpus(self, place: CgroupPlace) -> int | None:
        files = ("cpuset.cpus.effective",) if place.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
        d = place.cpu_dir if place.version == 2 else place.cpuset_dir
        if d is None:
            return None
        for name in files:
            text = _read(d / name)
            if text is not None and text.strip():
                try:
                    return len(parse_cpu_list(text.strip()))
                except ValueError:
                    return None
        return None

    def read(self, place: CgroupPlace) -> CgroupStats:
        """One reading of the cgroup's counters (absent files: None)."""
        quota = self.quota(place)
        usage_dir = quota.cfs_dir if quota.kind == "cfs" and quota.cfs_dir is not None else place.cpu_dir
        stats: dict[str, object] = {}
        if place.version == 2:
            cs = parse_flat_keyed(_read(usage_dir / "cpu.stat") or "")
            stats.update(
                usage_usec=cs.get("usage_usec"),
                nr_periods=cs.get("nr_periods"),
                nr_throttled=cs.get("nr_throttled"),
                throttled_usec=cs.get("throttled_usec"),
            )
            io = _read(place.cpu_dir / "io.stat")
            if io is not None:
                stats["io_read_bytes"], stats["io_write_bytes"] = parse_io_stat(io)
            psi_dir = place.cpu_dir
        else:
            acct_dir = place.cpuacct_dir or place.cpu_dir
            if quota.kind == "cfs" and quota.cfs_dir is not None and place.cpuacct_root is not None:
                # The binding quota's cgroup, in the cpuacct hierarchy (same relative path).
                rel = _relative(quota.cfs_dir, place.root)
                if rel is not None and (place.cpuacct_root / rel).is_dir():
                    acct_dir = place.cpuacct_root / rel
            usage = _read(acct_dir / "cpuacct.usage")
            ns = _count(usage.strip()) if usage is not None else None
            cs = parse_flat_keyed(_read(usage_dir / "cpu.stat") or "")
            tt = cs.get("throttled_time")
            stats.update(
                usage_usec=ns // 1000 if ns is not None else None,
                nr_periods=cs.get("nr_periods"),
                nr_throttled=cs.get("nr_throttled"),
                throttled_usec=tt // 1000 if tt is not None else None,
            )
            if place.blkio_dir is not None:
                blk = _read(place.blkio_dir / "blkio.throttle.io_service_bytes")
                if blk is not None:
                    stats["io_read_bytes"], stats["io_write_bytes"] = parse_blkio_bytes(blk)
            psi_dir = acct_dir
        for res in ("cpu", "io"):
            text = _read(psi_dir / f"{res}.pressure")
            if text is None:
                continue
            p = parse_pressure(text)
            for kind in ("some", "full"):
                tot = p.get(kind, {}).get("total")
                if tot is not None and 0 <= tot < _SANE_MAX:
                    stats[f"{res}_{kind}_usec"] = int(tot)
            stats[f"{res}_some_avg10"] = p.get("some", {}).get("avg10")
        return CgroupStats(place, quota, **stats)  # type: ignore[arg-type]

    def pids(self, place: CgroupPlace) -> list[int]:
        """Processes in the cgroup itself (``cgroup.procs``; not its children)."""
        text = _read(place.cpu_dir / "cgroup.procs") or ""
        return [int(x) for x in text.split() if x.isdigit()]


def rates(prev: CgroupStats | None, curr: CgroupStats, interval_s: float | None) -> CgroupRates:
    """The cgroup's figures between two readings of the same cgroup (rates None without ``prev``).

    A counter that went backwards (the cgroup was re-created under the same
    name) leaves its rate None for this interval.  The throttled share is 0
    over an interval with a quota but no CFS period (the job did not run), and
    None without a quota.
    """
    quota = curr.quota.cores
    out: dict[str, float | None] = {"cpu_quota_cores": quota}
    if prev is None or interval_s is None or interval_s <= 0 or prev.place.key != curr.place.key:
        return CgroupRates(**out)

    def delta(name: str) -> int | None:
        a, b = getattr(prev, name), getattr(curr, name)
        if a is None or b is None or b < a:
            return None
        return int(b - a)

    du = delta("usage_usec")
    out["cpu_cores"] = du / 1e6 / interval_s if du is not None else None
    if curr.quota.cfs_cores is not None:
        dp, dt = delta("nr_periods"), delta("nr_throttled")
        if dp is not None and dt is not None:
            out["cpu_throttled_share"] = min(1.0, dt / dp) if dp > 0 else 0.0
    for res in ("cpu", "io"):
        d = delta(f"{res}_some_usec")
        if d is not None:
            out[f"{res}_pressure_pct"] = min(100.0, 100.0 * d / 1e6 / interval_s)
    for way in ("read", "write"):
        d = delta(f"io_{way}_bytes")
        if d is not None:
            out[f"io_{way}_bytes_s"] = d / interval_s
    return CgroupRates(**out, interval_s=interval_s)


# --------------------------------------------------------------------------- paths


def resolve_path(base: Path, path: str) -> Path | None:
    """The directory of cgroup ``path`` under hierarchy root ``base`` (see the module doc), or None."""
    parts = [p for p in path.split("/") if p and p != "."]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    rest = parts[ups:]
    if ".." in rest:
        return None
    if ups == 0:
        d = base.joinpath(*rest)
        return d if d.is_dir() else None
    if not rest:
        return None
    return _search(base, rest)


def _search(base: Path, rest: list[str]) -> Path | None:
    """The one directory ``<base>/<any levels>/<rest>``, shallowest level first."""
    level = [base]
    for _ in range(MAX_SEARCH_DEPTH + 1):
        hits = [d.joinpath(*rest) for d in level if d.joinpath(*rest).is_dir()]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            log.debug(
                "cgroup: %s matches %d directories under %s; not guessing", "/".join(rest), len(hits), base
            )
            return None
        level = [c for d in level for c in _subdirs(d)]
        if not level:
            return None
    return None


def _subdirs(d: Path) -> Iterable[Path]:
    try:
        with os.scandir(d) as it:
            return [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _up(d: Path, root: Path) -> Iterable[Path]:
    """``d`` and its ancestors up to and including ``root``."""
    cur = d
    while True:
        yield cur
        if cur == root or root not in cur.parents:
            return
        cur = cur.parent


def _relative(d: Path, root: Path) -> Path | None:
    try:
        return d.relative_to(root)
    except ValueError:
        return None
