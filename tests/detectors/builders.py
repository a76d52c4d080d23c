"""Small synthetic windows for detector tests.

Each GPU is built from an activity profile (0-1 over time) and turned into the
columns real agents report: DCGM profiling fields, or NVML-only ones (util,
power, clocks, throttle reasons, PCIe link).  Idle GPUs behave as real ones
do: clocks drop, the idle reason bit (0x1) is set and the PCIe link may
downshift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.collector.detectors.window import RunInfo, Series, Window

T0 = 1_800_000_000.0
Profile = Callable[[np.ndarray], np.ndarray]


def times(
    duration: float = 600.0, dt: float = 1.0, t0: float = T0, jitter: float = 0.0, seed: int = 0
) -> np.ndarray:
    t = t0 + np.arange(0.0, duration, dt)
    if jitter:
        t = t + np.random.default_rng(seed).uniform(-jitter, jitter, t.size) * dt
    return t


def steady(level: float) -> Profile:
    return lambda t: np.full(t.shape, level)


def square(period: float, duty: float, hi: float = 0.9, lo: float = 0.0, start: float = T0) -> Profile:
    """Busy for ``duty * period`` then idle, repeating from ``start``; busy before."""

    def f(t: np.ndarray) -> np.ndarray:
        ph = np.mod(t - start, period)
        out = np.where(ph < duty * period, hi, lo)
        return np.where(t < start, hi, out)

    return f


def pauses(period: float, pause: float, hi: float = 0.9, lo: float = 0.0, start: float = T0) -> Profile:
    """Busy with a ``pause``-long idle stretch every ``period``, starting at ``start``."""

    def f(t: np.ndarray) -> np.ndarray:
        ph = np.mod(t - start, period)
        out = np.where((ph >= period - pause) & (t >= start), lo, hi)
        return out

    return f


def ramp_after(warmup: float, level: float = 0.9, start: float = T0) -> Profile:
    return lambda t: np.where(t < start + warmup, 0.02, level)


def switch(at: float, before: Profile, after: Profile) -> Profile:
    return lambda t: np.where(t < at, before(t), after(t))


def averaged(p: Profile, dt: float, steps: int = 50) -> Profile:
    """What an averaging counter (DCGM, NVML power) reports every ``dt``: the
    mean of ``p`` over the interval ending at each sample."""
    return lambda t: np.mean([p(t - dt * k / steps) for k in range(steps)], axis=0)


def noisy(p: Profile, sd: float = 0.03, seed: int = 1) -> Profile:
    rng = np.random.default_rng(seed)
    return lambda t: np.clip(p(t) + rng.normal(0.0, sd, t.shape), 0.0, 1.0)


@dataclass
class GpuSpec:
    profile: Profile
    dcgm: bool = True
    power_limit_w: float = 700.0
    idle_w: float = 70.0
    clock_max: float = 1980.0
    #: SM clock while busy as a fraction of max (when no throttle is applied).
    clock_busy: float = 1.0
    throttle: int = 0
    #: Where the throttle (bits and clock ratio) applies: a function of time.
    throttle_when: Callable[[np.ndarray], np.ndarray] | None = None
    throttle_clock: float = 0.7
    temp_busy_c: float = 65.0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max: tuple[int, int] = (5, 16)
    #: Link downshifts to gen 1 when idle (real GPUs do).
    pcie_idle_downshift: bool = True
    xid: dict[float, int] = field(default_factory=dict)
    extra: dict[str, Profile] = field(default_factory=dict)
    #: Columns to drop (reported NULL).
    drop: tuple[str, ...] = ()


def gpu_series(node: str, gpu: int, t: np.ndarray, spec: GpuSpec) -> Series:
    act = spec.profile(t)
    busy = act >= 0.2
    lim = np.full(t.shape, spec.power_limit_w)
    power = spec.idle_w + (spec.power_limit_w - spec.idle_w) * 0.95 * act
    clock = np.where(busy, spec.clock_max * spec.clock_busy, 345.0)
    bits = np.where(busy, 0, 0x1).astype(float)
    if spec.throttle:
        on = np.ones(t.shape, dtype=bool) if spec.throttle_when is None else spec.throttle_when(t)
        hit = on & busy
        bits = np.where(hit, bits.astype(np.int64) | spec.throttle, bits)
        clock = np.where(hit, spec.clock_max * spec.throttle_clock, clock)
        if spec.throttle & 0x4:
            power = np.where(hit, spec.power_limit_w * 0.99, power)
    gen = np.where(busy | ~spec.pcie_idle_downshift, spec.pcie_gen, 1)
    width = np.full(t.shape, float(spec.pcie_width))
    cols: dict[str, np.ndarray] = {
        "util_pct": np.where(act > 0.02, np.clip(act * 110, 0, 100), 0.0),
        "power_w": power,
        "power_limit_w": lim,
        "sm_clock_mhz": clock,
        "sm_clock_max_mhz": np.full(t.shape, spec.clock_max),
        "temp_c": 35.0 + (spec.temp_busy_c - 35.0) * act,
        "throttle_reasons": bits.astype(float),
        "pcie_gen": gen.astype(float),
        "pcie_gen_max": np.full(t.shape, float(spec.pcie_max[0])),
        "pcie_width": width,
        "pcie_width_max": np.full(t.shape, float(spec.pcie_max[1])),
        "mem_used_mib": np.full(t.shape, 40000.0),
        "xid": np.zeros(t.shape),
    }
    for at, code in spec.xid.items():
        cols["xid"][np.argmin(np.abs(t - at))] = code
    if spec.dcgm:
        cols["sm_active"] = act
        cols["tensor_active"] = act * 0.6
        cols["dram_active"] = act * 0.4
    for name, prof in spec.extra.items():
        cols[name] = prof(t)
    for name in spec.drop:
        cols.pop(name, None)
    return Series(node, gpu, t, cols)


def host_series(node: str, t: np.ndarray, **profiles: Profile | float) -> Series:
    base: dict[str, Any] = {
        "cpu_user_pct": 10.0,
        "cpu_system_pct": 3.0,
        "cpu_iowait_pct": 0.5,
        "cpu_count": 64.0,
        "disk_read_bytes_s": 1e6,
        "disk_write_bytes_s": 1e6,
        "disk_util_pct": 5.0,
        "disk_await_ms": 1.0,
        "net_rx_bytes_s": 1e6,
        "net_tx_bytes_s": 1e6,
    }
    base.update(profiles)
    cols = {}
    for k, v in base.items():
        cols[k] = v(t) if callable(v) else np.full(t.shape, float(v))
    cols["cpu_idle_pct"] = np.clip(
        100 - cols["cpu_user_pct"] - cols["cpu_system_pct"] - cols["cpu_iowait_pct"], 0, 100
    )
    return Series(node, None, t, cols)


def run_window(
    specs: list[GpuSpec],
    *,
    t: np.ndarray | None = None,
    gpus_per_node: int = 8,
    run_start: float | None = None,
    run_id: str = "r1",
    host: dict[str, Profile | float] | None = None,
    host_dt: float = 5.0,
    no_host: bool = False,
    facts: dict[str, dict[str, Any]] | None = None,
) -> Window:
    """One run over ``specs`` (GPU i on node ``n{i // gpus_per_node}``)."""
    t = times() if t is None else t
    w = Window(t_start=float(t[0]), t_end=float(t[-1]) + (float(t[1] - t[0]) if t.size > 1 else 0.0))
    allocs = []
    for i, spec in enumerate(specs):
        node = f"n{i // gpus_per_node}"
        key = (node, i % gpus_per_node)
        w.gpus[key] = gpu_series(node, key[1], t, spec)
        allocs.append(key)
    if not no_host:
        ht = np.arange(w.t_start, w.t_end, host_dt)
        for node in sorted({k[0] for k in allocs}):
            w.hosts[node] = host_series(node, ht, **(host or {}))
    start = w.t_start - 3600.0 if run_start is None else run_start
    w.runs.append(RunInfo(run_id, start, None, allocs))
    w.node_facts = facts or {}
    return w


def kinds(findings: list) -> list[str]:
    return sorted(f.kind for f in findings)
