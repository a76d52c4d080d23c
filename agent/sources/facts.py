"""Node facts that do not need NVML: CPU governor, container CPU quota, CPU count, kernel, hostname.

Starvation findings ("the GPUs waited on the CPU") are only actionable when the
operator can see why the CPU side was short: a ``powersave`` governor, or a
container limited to a few cores on a 128-core host.  These facts change rarely,
so the agent reports them once at start and on change, not every sample.

Everything is read from a sysfs root given as a parameter so tests build a tree
in a temporary directory.
"""

from __future__ import annotations

import os
import platform
import socket
from collections import Counter
from pathlib import Path
from typing import Any


def cpu_governors(sys_root: Path) -> dict[str, int]:
    """How many CPUs run each cpufreq governor, e.g. ``{"performance": 64}``.

    Empty when cpufreq is absent (VMs, containers without /sys access).
    """
    counts: Counter[str] = Counter()
    for path in sorted((sys_root / "devices" / "system" / "cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        try:
            counts[path.read_text().strip()] += 1
        except OSError:
            continue
    return dict(counts)


def summarise_governors(counts: dict[str, int]) -> str | None:
    """One word when all CPUs agree (``performance``), else ``"mixed: ondemand=2,performance=6"``."""
    if not counts:
        return None
    if len(counts) == 1:
        return next(iter(counts))
    return "mixed: " + ",".join(f"{g}={n}" for g, n in sorted(counts.items()))


def _parse_quota(quota: str, period: str) -> float | None:
    if quota in ("max", "-1"):
        return None
    q, p = int(quota), int(period)
    if q <= 0 or p <= 0:
        return None
    return q / p


def cpu_quota_cores(sys_root: Path, cgroup_path: str = "/") -> float | None:
    """CPU cores the container may use per the CFS quota, None when unlimited.

    cgroup v2 (``cpu.max``: ``"<quota> <period>"`` or ``"max <period>"``) first,
    then cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).
    ``cgroup_path`` is the process's cgroup relative to the hierarchy root
    (from /proc/self/cgroup); inside a container namespace it is ``/``.
    """
    rel = cgroup_path.strip("/")
    v2 = sys_root / "fs" / "cgroup" / rel / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        return _parse_quota(quota, period)
    except (OSError, ValueError):
        pass
    for v1_dir in ("cpu,cpuacct", "cpu"):
        base = sys_root / "fs" / "cgroup" / v1_dir / rel
        try:
            return _parse_quota(
                (base / "cpu.cfs_quota_us").read_text().strip(),
                (base / "cpu.cfs_period_us").read_text().strip(),
            )
        except (OSError, ValueError):
            continue
    return None


def online_cpu_count(sys_root: Path) -> int | None:
    """Logical CPUs online per ``/sys/devices/system/cpu/online`` (``"0-7,16-23"``)."""
    try:
        text = (sys_root / "devices" / "system" / "cpu" / "online").read_text().strip()
    except OSError:
        return None
    return len(parse_cpu_list(text))


def parse_cpu_list(text: str) -> list[int]:
    """Expand a kernel CPU list such as ``"0-3,8,10-11"`` into CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def node_facts(sys_root: Path | str = "/sys", cgroup_path: str = "/") -> dict[str, Any]:
    """The NVML-independent facts of this node, for the agent's facts report."""
    root = Path(sys_root)
    governors = cpu_governors(root)
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "cpu_count": online_cpu_count(root) or os.cpu_count(),
        "cpu_governor": summarise_governors(governors),
        "cpu_governors": governors,
        "cpu_quota_cores": cpu_quota_cores(root, cgroup_path),
    }
