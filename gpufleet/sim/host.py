"""Host-side metrics of each node from what its runs asked of it.

Values follow what ``mpstat``, ``iostat -x`` and ``/proc/net/dev`` would
print: CPU shares of all CPUs summing to 100, the busiest disk's %util and
await, network bytes/s.  A CPU-bound data loader saturates user time; an
I/O-bound one leaves the CPUs in iowait with the disk at ~100 % and long
awaits.  A container CPU quota caps what the loader can use, however many
CPUs the host has.
"""

from __future__ import annotations

import numpy as np

from gpufleet.sim.plan import NodePlan
from gpufleet.sim.workload import HostLoad

#: OS background load, % of all CPUs.
BASE_USER_PCT = 1.0
BASE_SYSTEM_PCT = 0.6
BASE_IOWAIT_PCT = 0.1
#: Disk await with a lightly loaded NVMe device, ms.
BASE_AWAIT_MS = 0.6
#: Share of host CPU power saved by the powersave governor.
POWERSAVE_SAVING = 0.15


class HostModel:
    """The static per-node numbers, gathered once into arrays."""

    def __init__(self, nodes: list[NodePlan]) -> None:
        self.nodes = nodes
        self.disk_max = np.array([n.disk_read_bytes_s_max for n in nodes])
        self.net_rx = np.array([n.net_rx_bytes_s for n in nodes])
        self.net_tx = np.array([n.net_tx_bytes_s for n in nodes])
        self.host_idle = np.array([n.host_idle_w for n in nodes])
        self.host_cpu = np.array([n.host_cpu_w for n in nodes])
        self.cpu_count = np.array([n.cpu_count for n in nodes], dtype=np.float64)
        self.governor = np.array(
            [1.0 - POWERSAVE_SAVING if n.cpu_governor == "powersave" else 1.0 for n in nodes]
        )

    def metrics(self, load: HostLoad, z: np.ndarray) -> dict[str, np.ndarray]:
        return host_metrics(self, load, z)


def host_metrics(model: HostModel, load: HostLoad, z: np.ndarray) -> dict[str, np.ndarray]:
    """Host columns over nodes; ``z`` is (N, 8) standard normal noise."""
    nodes = model.nodes
    user = BASE_USER_PCT + load.user_pct + 0.3 * np.abs(z[:, 0])
    system = BASE_SYSTEM_PCT + load.system_pct + 0.1 * np.abs(z[:, 1])
    iowait = BASE_IOWAIT_PCT + load.iowait_pct + 0.05 * np.abs(z[:, 2])
    disk_max = model.disk_max
    read = load.disk_read_bytes_s * (1.0 + 0.03 * z[:, 3])
    write = load.disk_write_bytes_s * (1.0 + 0.03 * z[:, 4]) + 2e5 * np.abs(z[:, 4])
    util = np.clip(100.0 * (read / disk_max + write / (0.8 * disk_max)), 0.0, 100.0)
    awaits = BASE_AWAIT_MS + 0.04 * util + 25.0 * load.ckpt_share
    net_rx = model.net_rx * (1.0 + 0.1 * z[:, 5])
    net_tx = model.net_tx * (1.0 + 0.1 * z[:, 6]) + load.net_tx_bytes_s
    net_rx = net_rx + load.net_rx_bytes_s
    for k, s in load.starving.items():
        quota = nodes[k].cpu_quota_cores
        if s.cause == "cpu":
            target = s.params["cpu_user_pct"] + 0.3 * z[k, 0]
            if quota is not None:
                # The loader is held to its quota: host-wide CPU stays low.
                target = min(target, 100.0 * quota / nodes[k].cpu_count + BASE_USER_PCT)
            user[k] = max(user[k], target)
            system[k] = min(max(system[k], 2.0 + 0.3 * abs(z[k, 1])), max(0.0, 100.0 - user[k] - iowait[k]))
        else:
            # Small random reads keep the device busy: %util near 100 and long
            # queues at modest throughput (what the GPUs end up consuming).
            iowait[k] = s.params["cpu_iowait_pct"] * (1.0 + 0.05 * z[k, 2])
            user[k] = min(max(user[k], 8.0), max(0.0, 100.0 - iowait[k] - system[k]))
            util[k] = min(100.0, s.params["disk_util_pct"] + 0.5 * z[k, 3])
            awaits[k] = s.params["disk_await_ms"] * (1.0 + 0.08 * z[k, 7])
    user, system, iowait = _fit_100(np.maximum(user, 0), np.maximum(system, 0), np.maximum(iowait, 0))
    idle = np.clip(100.0 - user - system - iowait, 0.0, 100.0)
    power = model.host_idle + model.host_cpu * model.governor * (user + system) / 100.0 + 4.0 * z[:, 7]
    return {
        "cpu_user_pct": user,
        "cpu_system_pct": system,
        "cpu_iowait_pct": iowait,
        "cpu_idle_pct": idle,
        "cpu_count": model.cpu_count,
        "disk_read_bytes_s": np.maximum(read, 0.0),
        "disk_write_bytes_s": np.maximum(write, 0.0),
        "disk_util_pct": np.clip(util, 0.0, 100.0),
        "disk_await_ms": np.maximum(awaits, 0.05),
        "net_rx_bytes_s": np.maximum(net_rx, 0.0),
        "net_tx_bytes_s": np.maximum(net_tx, 0.0),
        "host_power_w": np.maximum(power, 0.0),
    }


def _fit_100(user: np.ndarray, system: np.ndarray, iowait: np.ndarray) -> tuple[np.ndarray, ...]:
    """Scale the busy shares down where they exceed 100 % together."""
    total = user + system + iowait
    scale = np.where(total > 100.0, 100.0 / np.maximum(total, 1e-9), 1.0)
    return user * scale, system * scale, iowait * scale
