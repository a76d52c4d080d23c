"""Hung collectives: every working rank spins at idle power with no progress; the dead rank is named."""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors import DetectorConfig, run_detectors
from gpufleet.collector.detectors.hung_collective import detect
from tests.detectors.builders import T0, GpuSpec, run_window, steady, switch, times

CFG = DetectorConfig()
NVSMI_DROP = (
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "throttle_reasons",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
)


def rank(hang_at: float | None, *, dead: bool = False, **kw: object) -> GpuSpec:
    """A rank that trains, then from ``hang_at`` spins in the collective (GPU-Util 100 %, SM activity
    and power at their idle levels) or, ``dead``, runs nothing."""
    after = steady(0.0) if dead else steady(0.08)
    act = steady(0.9) if hang_at is None else switch(hang_at, steady(0.9), after)
    util = steady(100.0) if dead is False else (lambda t: np.where(t < (hang_at or np.inf), 100.0, 0.0))
    return GpuSpec(act, extra={"util_pct": util}, **kw)  # type: ignore[arg-type]


def test_fifteen_ranks_spinning_while_one_is_dead_is_a_hang_naming_the_dead_rank() -> None:
    specs = [rank(T0 + 300, dead=(i == 11)) for i in range(16)]
    w = run_window(specs, t=times(900))
    (f,) = detect(w, CFG)
    assert f.kind == "hung_collective" and f.severity == "critical" and f.run_id == "r1"
    ev = f.evidence
    assert ev["dead_gpus"] == ["n1/3"] and len(ev["spinning_gpus"]) == 15 and ev["gpu_count"] == 16
    assert abs(f.start - (T0 + 300)) <= 2.0 and ev["hung_s"] >= 590
    assert all(
        g["util_pct"] == 100.0 and g["power_frac"] is not None and g["power_frac"] <= 0.3
        for g in ev["spinning_gpus"]
    )
    assert ev["power_basis"] == "power_frac" and ev["progress_tokens"] is None
    # nothing else is said of these seconds: not an idle allocation, not a straggler, not starvation
    assert [x.kind for x in run_detectors(w, CFG).findings] == ["hung_collective"]


def test_four_minutes_of_spinning_is_not_yet_a_hang() -> None:
    w = run_window([rank(T0 + 660, dead=(i == 0)) for i in range(8)], t=times(900))
    assert detect(w, CFG) == []


def test_a_checkpoint_whose_ranks_wait_two_minutes_is_not_a_hang() -> None:
    # rank 0 writes for 120 s twice; the others spin meanwhile
    def writer(t: np.ndarray) -> np.ndarray:
        return np.where(((t - T0) % 400) < 280, 0.9, 0.0)

    def peer(t: np.ndarray) -> np.ndarray:
        return np.where(((t - T0) % 400) < 280, 0.9, 0.12)

    def util0(t: np.ndarray) -> np.ndarray:
        return np.where(((t - T0) % 400) < 280, 100.0, 0.0)

    specs = [GpuSpec(writer, extra={"util_pct": util0})] + [
        GpuSpec(peer, extra={"util_pct": steady(100.0)}) for _ in range(7)
    ]
    assert detect(run_window(specs, t=times(1200)), CFG) == []


def test_busy_ranks_at_full_power_are_working_not_spinning() -> None:
    assert detect(run_window([rank(None) for _ in range(8)], t=times(900)), CFG) == []


def test_a_run_whose_gpus_all_run_nothing_is_idle_not_hung() -> None:
    w = run_window([GpuSpec(switch(T0 + 100, steady(0.9), steady(0.0))) for _ in range(8)], t=times(900))
    assert detect(w, CFG) == []


def test_progress_reported_over_the_stretch_rules_a_hang_out_and_none_confirms_it() -> None:
    w = run_window([rank(T0 + 300, dead=(i == 0)) for i in range(8)], t=times(900))
    run = w.runs[0]
    run.progress_t = np.array([T0 + 100.0, T0 + 400.0, T0 + 800.0])
    run.progress_tokens = np.array([1e6, 2e6, 3e6])
    assert detect(w, CFG) == []
    run.progress_tokens = np.array([1e6, 2e6, 2e6])
    run.progress_t = np.array([T0 + 100.0, T0 + 290.0, T0 + 800.0])
    (f,) = detect(w, CFG)
    assert f.evidence["progress_tokens"] == 0.0


def test_nvidia_smi_fields_only_judge_spinners_by_the_dead_ranks_idle_power() -> None:
    """No limit, no model, no busy history in view: the spinners draw idle-level power next to the dead rank."""
    specs = [rank(T0 - 100, dead=(i == 3), dcgm=False, drop=NVSMI_DROP) for i in range(16)]
    w = run_window(specs, t=times(900), no_host=True)
    (f,) = detect(w, CFG)
    assert f.evidence["power_basis"] == "dead_rank_power" and f.evidence["dead_gpus"] == ["n0/3"]
    # with every rank spinning and nothing to compare their power with, a hang cannot be told from work
    specs = [rank(T0 - 100, dcgm=False, drop=NVSMI_DROP) for _ in range(8)]
    assert detect(run_window(specs, t=times(900), no_host=True), CFG) == []


def test_a_dcgm_profile_without_gpu_util_reads_the_spin_from_sm_activity() -> None:
    specs = [rank(T0 + 200, dead=(i == 5), drop=("util_pct",)) for i in range(8)]
    (f,) = detect(run_window(specs, t=times(900)), CFG)
    assert f.evidence["dead_gpus"] == ["n0/5"]
