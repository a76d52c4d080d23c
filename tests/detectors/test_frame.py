"""The shared sample frame: time weights and gaps, activity, hysteresis, episodes."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig, RunInfo, Series, Window
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import group_loo_median, group_median, robust_z, trailing_onset
from tests.detectors.builders import T0, GpuSpec, gpu_series, run_window, square, steady, times

CFG = DetectorConfig()


def _window(*series: Series) -> Window:
    w = Window(t_start=min(float(s.t[0]) for s in series), t_end=max(float(s.t[-1]) for s in series) + 1)
    for s in series:
        w.gpus[(s.node, int(s.gpu or 0))] = s
    return w


def test_weights_are_seconds_and_gaps_count_as_nothing() -> None:
    t = np.concatenate([T0 + np.arange(0, 100.0), T0 + np.arange(400.0, 500.0)])
    s = Series("n0", 0, t, {"sm_active": np.full(t.size, 0.9)})
    fr = Frame(_window(s), CFG)
    assert fr.dt[0] == pytest.approx(1.0)
    # 200 samples of 1 s each: the 300 s gap is not counted as either state.
    assert float(fr.w.sum()) == pytest.approx(200.0)
    assert fr.seg_start[100] and not fr.seg_start[99]
    ph = fr.phases
    assert ph.t0.tolist() == [T0, T0 + 400]
    assert ph.open_end[0] and ph.open_start[1]


@pytest.mark.parametrize("dt", [0.1, 1.0, 30.0])
def test_typical_interval_follows_the_sampling_rate(dt: float) -> None:
    t = times(600, dt, jitter=0.1)
    s = Series("n0", 0, t, {"util_pct": np.full(t.size, 50.0)})
    fr = Frame(_window(s), CFG)
    assert fr.dt[0] == pytest.approx(dt, rel=0.05)
    assert float(fr.w.sum()) == pytest.approx(600.0, rel=0.05)
    assert not fr.gap[1:].any()


def test_activity_prefers_profiling_fields_and_caps_util_by_power() -> None:
    t = times(10)
    dcgm = Series(
        "n0",
        0,
        t,
        {"sm_active": np.full(10, 0.2), "dram_active": np.full(10, 0.7), "util_pct": np.full(10, 100.0)},
    )
    # NVML only: GPU-Util 100 % but power at 30 % of the limit (spinning).
    nvml = Series(
        "n0",
        1,
        t,
        {"util_pct": np.full(10, 100.0), "power_w": np.full(10, 210.0), "power_limit_w": np.full(10, 700.0)},
    )
    util_only = Series("n0", 2, t, {"util_pct": np.full(10, 40.0)})
    nothing = Series("n0", 3, t, {"temp_c": np.full(10, 40.0)})
    fr = Frame(_window(dcgm, nvml, util_only, nothing), CFG)
    act = fr.activity.reshape(4, 10)[:, 0]
    assert act[0] == pytest.approx(0.7)
    assert act[1] == pytest.approx(
        (0.3 - CFG.power_idle_frac) / (CFG.power_busy_frac - CFG.power_idle_frac), rel=1e-3
    )
    assert act[2] == pytest.approx(0.4)
    assert np.isnan(act[3])
    assert fr.activity_source == ["dcgm", "nvml", "nvml", "none"]


def test_hysteresis_holds_state_between_thresholds() -> None:
    t = times(8)
    act = np.array([0.9, 0.2, 0.2, 0.05, 0.2, 0.2, 0.9, 0.2])
    fr = Frame(_window(Series("n0", 0, t, {"sm_active": act})), CFG)
    assert fr.state.tolist() == [True, True, True, False, False, False, True, True]


def test_trailing_episode_dates_a_recent_condition_from_its_start() -> None:
    t = times(600)
    ind_a = t >= T0 + 450  # began 150 s before the end
    ind_b = t < T0 + 200  # ended long ago
    sa = Series("n0", 0, t, {"sm_active": np.full(t.size, 0.9), "x": ind_a.astype(float)})
    sb = Series("n0", 1, t, {"sm_active": np.full(t.size, 0.9), "x": ind_b.astype(float)})
    fr = Frame(_window(sa, sb), CFG)
    ep = fr.trailing_episode(fr.w, fr.col("x") > 0, 0.5)
    assert ep.onset[0] == pytest.approx(T0 + 450, abs=0.01)
    assert ep.seconds[0] == pytest.approx(150)
    assert ep.share[0] == pytest.approx(1.0)
    # 200 s of condition then 400 s without: diluted below half.
    assert np.isnan(ep.onset[1])
    assert ep.last[1] == pytest.approx(T0 + 199, abs=0.01)
    assert not fr.recent_enough(ep.last)[1]
    # The one-series version agrees.
    assert trailing_onset(t, np.ones(t.size), ind_a, 0.5) == pytest.approx(T0 + 450, abs=0.01)


def test_index_at_finds_each_rows_own_position() -> None:
    t = times(100)
    fr = Frame(_window(Series("n0", 0, t, {"x": t}), Series("n0", 1, t + 0.5, {"x": t})), CFG)
    at = np.array([T0 + 10.0, T0 + 10.0])
    assert fr.index_at(at, "left").tolist() == [10, 100 + 10]
    assert fr.index_at(at, "right").tolist() == [11, 100 + 10]
    assert fr.index_at(np.array([np.nan, T0 - 5]), "left").tolist() == [100, 100]


def test_region_skips_warmup_until_the_gpus_get_busy() -> None:
    t = times(600)
    prof = lambda x: np.where(x < T0 + 100, 0.0, 0.9)  # noqa: E731
    w = run_window([GpuSpec(prof)], t=t, run_start=T0)
    fr = Frame(w, CFG)
    lo, hi = fr.region
    assert lo[0] == pytest.approx(T0 + 100, abs=0.01)
    assert hi[0] == pytest.approx(w.t_end, abs=0.01)
    # A run without any sustained busy stretch: warm-up lasts warmup_max_s.
    w2 = run_window([GpuSpec(square(10, 0.5))], t=t, run_start=T0)
    assert Frame(w2, CFG).region[0][0] == pytest.approx(T0 + CFG.warmup_max_s, abs=0.01)


def test_gpu_of_a_later_run_is_attributed_to_it() -> None:
    t = times(600)
    w = _window(gpu_series("n0", 0, t, GpuSpec(steady(0.9))))
    w.runs = [RunInfo("old", T0 - 1000, T0 + 100, [("n0", 0)]), RunInfo("new", T0 + 200, None, [("n0", 0)])]
    fr = Frame(w, CFG)
    assert w.runs[int(fr.run_of_row[0])].run_id == "new"
    assert fr.run_id_at(0, T0 + 50) == "old"
    assert fr.run_id_at(0, T0 + 150) is None


def test_group_statistics() -> None:
    v = np.array([1.0, 2.0, 3.0, 10.0, 5.0, 7.0, np.nan])
    g = np.array([0, 0, 0, 0, 1, 1, 1])
    assert group_median(v, g, 2).tolist() == [2.5, 6.0]
    loo = group_loo_median(v, g, 2)
    assert loo[:6].tolist() == [3.0, 3.0, 2.0, 2.0, 7.0, 5.0]
    assert np.isnan(loo[6])
    # Identical peers: the floor keeps the score finite, the outlier stands out.
    z, ref = robust_z(
        np.array([700.0, 700, 700, 400]), np.zeros(4, dtype=np.int64), 1, rel_floor=0.02, abs_floor=1
    )
    assert ref.tolist() == [700.0, 700.0, 700.0, 700.0]
    assert z[3] == pytest.approx(-300 / 14)
    assert np.all(z[:3] == 0)
