"""The sweep over every detector: isolation, robustness, output shape, cost."""

from __future__ import annotations

import json
import sys
from types import FrameType
from typing import Any

import numpy as np
import pytest

from gpufleet.collector.detectors import (
    DETECTORS,
    DetectorConfig,
    RunInfo,
    Series,
    Window,
    detect_all,
    run_detectors,
)
from gpufleet.collector.detectors.frame import Frame
from tests.detectors.builders import GpuSpec, run_window, square, steady, times

CFG = DetectorConfig()
CONTRACT_CAUSES = {
    "starvation": {"cpu", "io", "unknown"},
    "throttling": {"power_cap", "thermal", "hw_slowdown", "power_brake"},
    "straggler": {"power_cap", "thermal", "pcie_degraded", "clocks", "unknown"},
    "checkpoint_stall": {None},
    "pcie_degraded": {None},
    "host_misconfig": {"cpu_governor", "cpu_quota", "repeated_xid"},
}


def mixed(dt: float = 1.0) -> Window:
    """Two runs: one with a power-capped and a PCIe-degraded straggler, one starving."""
    specs = [GpuSpec(steady(0.6)) for _ in range(16)]
    specs[3] = GpuSpec(steady(0.9), power_limit_w=400, throttle=0x4, throttle_clock=0.75)
    specs[9] = GpuSpec(steady(0.9), pcie_width=8)
    w = run_window(specs, t=times(600, dt))
    other = run_window(
        [GpuSpec(square(20, 0.5)) for _ in range(8)], t=times(600, dt), host={"cpu_user_pct": 95.0}
    )
    for (node, gpu), s in other.gpus.items():
        w.gpus[("m" + node, gpu)] = Series("m" + node, gpu, s.t, s.cols)
    w.hosts["mn0"] = other.hosts["n0"]
    w.runs.append(RunInfo("r2", other.runs[0].start, None, [("mn0", i) for i in range(8)]))
    w.node_facts = {"mn0": {"cpu_governor": "powersave"}}
    return w


def test_every_detector_runs_and_findings_follow_the_contract() -> None:
    fs = detect_all(mixed(), CFG)
    got = sorted((f.kind, f.cause, f.run_id, f.node, f.gpu) for f in fs)
    assert got == [
        ("host_misconfig", "cpu_governor", None, "mn0", None),
        ("pcie_degraded", None, "r1", "n1", 1),
        ("starvation", "cpu", "r2", None, None),
        ("straggler", "pcie_degraded", "r1", "n1", 1),
        ("straggler", "power_cap", "r1", "n0", 3),
        ("throttling", "power_cap", "r1", "n0", None),  # a run's throttle lists its GPUs
    ]
    (th,) = (f for f in fs if f.kind == "throttling")
    assert [(g["node"], g["gpu"]) for g in th.evidence["gpus"]] == [("n0", 3)]
    for f in fs:
        assert f.cause in CONTRACT_CAUSES[f.kind]
        assert f.severity in ("warning", "critical")
        json.dumps(f.evidence, allow_nan=False)
        assert all(not isinstance(v, np.generic) for v in f.evidence.values())
        assert 1_800_000_000 <= f.start <= (f.last_active or f.start)


def test_float32_and_integer_columns_give_the_same_findings() -> None:
    """The window cache hands over float32 columns; bundles may carry integers."""
    w = mixed()
    ref = sorted((f.kind, f.cause, f.node, f.gpu) for f in detect_all(w, CFG))
    for s in w.gpus.values():
        s.cols = {k: v.astype(np.float32) for k, v in s.cols.items()}
        for k in ("throttle_reasons", "pcie_gen", "pcie_width", "xid"):
            s.cols[k] = s.cols[k].astype(np.int64)
    assert sorted((f.kind, f.cause, f.node, f.gpu) for f in detect_all(w, CFG)) == ref


def test_a_failing_detector_is_reported_and_the_others_still_run() -> None:
    def broken(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list:
        raise RuntimeError("boom")

    res = run_detectors(mixed(), CFG, {"broken": broken, "throttling": DETECTORS["throttling"]})
    assert [f.detector for f in res.failures] == ["broken"]
    assert "boom" in res.failures[0].error
    assert [f.kind for f in res.findings] == ["throttling"]
    # each is timed, the failing one too, and the frame they share
    assert list(res.seconds) == ["frame", "broken", "throttling"] and all(
        v >= 0 for v in res.seconds.values()
    )


def test_empty_window() -> None:
    assert run_detectors(Window(t_start=0.0, t_end=600.0), CFG).findings == []
    w = Window(t_start=0.0, t_end=600.0)
    w.gpus[("n0", 0)] = Series("n0", 0, np.zeros(0), {})
    w.runs.append(RunInfo("r", 0.0, None, [("n0", 0), ("n9", 3)]))
    res = run_detectors(w, CFG)
    assert res.failures == [] and res.findings == []


def test_ragged_odd_windows_never_break_a_detector() -> None:
    rng = np.random.default_rng(7)
    cols = [
        "util_pct",
        "sm_active",
        "dram_active",
        "power_w",
        "power_limit_w",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "temp_c",
        "throttle_reasons",
        "pcie_gen",
        "pcie_gen_max",
        "pcie_width",
        "pcie_width_max",
        "xid",
    ]
    for trial in range(25):
        w = Window(t_start=1e9, t_end=1e9 + 600)
        keys = []
        for g in range(int(rng.integers(1, 12))):
            n = int(rng.integers(1, 400))
            t = np.sort(1e9 + rng.uniform(0, 600, n))
            if trial % 3 == 0:
                t = np.round(t)  # duplicate timestamps
            data: dict[str, Any] = {}
            for c in cols:
                if rng.random() < 0.3:
                    continue
                x = rng.uniform(0, 1, n) * {
                    "util_pct": 100,
                    "power_w": 700,
                    "power_limit_w": 700,
                    "sm_clock_mhz": 2000,
                    "sm_clock_max_mhz": 2000,
                    "temp_c": 90,
                    "throttle_reasons": 255,
                    "pcie_gen": 5,
                    "pcie_gen_max": 5,
                    "pcie_width": 16,
                    "pcie_width_max": 16,
                    "xid": 2,
                }.get(c, 1)
                x[rng.random(n) < 0.2] = np.nan
                data[c] = np.round(x) if c in ("throttle_reasons", "xid", "pcie_gen", "pcie_width") else x
            node = f"n{g % 3}"
            keys.append((node, g))
            w.gpus[(node, g)] = Series(node, g, t, data)
        for node in ("n0", "n2"):
            ht = np.sort(1e9 + rng.uniform(0, 600, 50))
            w.hosts[node] = Series(
                node,
                None,
                ht,
                {"cpu_user_pct": rng.uniform(0, 100, 50), "disk_write_bytes_s": rng.uniform(0, 1e9, 50)},
            )
        w.runs.append(RunInfo("a", 1e9 - 50, None, keys[: len(keys) // 2 + 1]))
        w.runs.append(RunInfo("b", 1e9 + 300, 1e9 + 500, keys[len(keys) // 2 :]))
        w.node_facts = {"n1": {"cpu_governor": "powersave", "cpu_quota_cores": 0.5}}
        res = run_detectors(w, CFG)
        assert res.failures == [], res.failures
        for f in res.findings:
            json.dumps(f.evidence, allow_nan=False)


def _python_steps(fn: Any) -> int:
    """Python calls and executed lines (a loop iteration is a line event)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("detector", sorted(DETECTORS))
def test_python_work_does_not_grow_with_samples(detector: str) -> None:
    """Ten times the samples, same findings, and (almost) the same number of
    Python steps: nothing loops over samples in Python.  A per-sample loop
    would add over a hundred thousand steps here."""
    det = {detector: DETECTORS[detector]}
    run_detectors(mixed(1.0), CFG, det)  # warm caches and lazy imports
    coarse, fine = mixed(1.0), mixed(0.1)
    extra_samples = sum(len(s) for s in fine.gpus.values()) - sum(len(s) for s in coarse.gpus.values())
    assert extra_samples > 100_000
    a = _python_steps(lambda: run_detectors(coarse, CFG, det))
    b = _python_steps(lambda: run_detectors(fine, CFG, det))
    assert abs(b - a) < 1000, (a, b)
    got = lambda w: sorted((f.kind, f.cause, f.node, f.gpu) for f in run_detectors(w, CFG, det).findings)  # noqa: E731
    assert got(coarse) == got(fine)
