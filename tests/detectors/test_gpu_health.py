"""GPU memory and bus health: rises and flags now are findings, old counts are not."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.gpu_health import detect
from gpufleet.collector.detectors.host_misconfig import detect as misconfig
from gpufleet.collector.detectors.registry import DETECTORS
from tests.detectors.builders import T0, GpuSpec, run_window, steady, times

CFG = DetectorConfig()


def const(v: float):  # type: ignore[no-untyped-def]
    return lambda t: np.full(t.shape, float(v))


def board(**cols) -> GpuSpec:  # type: ignore[no-untyped-def]
    """A GPU with a board's history: lifetime counts that stand still."""
    base = {
        "ecc_sbe_vol": const(0),
        "ecc_dbe_vol": const(0),
        "remapped_rows_uncorrectable": const(0),
        "remapped_rows_pending": const(0),
        "remapped_rows_failed": const(0),
        "pcie_replay_count": const(9),
        "ecc_sbe_agg": const(37),
        "remapped_rows_correctable": const(2),
    }
    base.update(cols)
    return GpuSpec(steady(0.8), extra=base)


def test_registered() -> None:
    assert DETECTORS["gpu_health"] is detect


def test_static_history_is_not_a_finding() -> None:
    assert detect(run_window([board() for _ in range(4)]), CFG) == []


def test_uncorrectable_error_with_its_pending_remap_and_xids_decoded() -> None:
    at = T0 + 200
    spec = board(
        ecc_dbe_vol=lambda t: np.where(t >= at, 1.0, 0.0),
        remapped_rows_uncorrectable=lambda t: np.where(t >= at, 1.0, 0.0),
        remapped_rows_pending=lambda t: np.where(t >= at + 2, 1.0, 0.0),
    )
    spec.xid = {at: 48, at + 2: 63}
    (f,) = detect(run_window([board(), spec]), CFG)
    assert (f.kind, f.cause, f.severity, f.gpu, f.run_id) == (
        "gpu_health",
        "uncorrectable_ecc",
        "critical",
        1,
        "r1",
    )
    assert f.start == pytest.approx(at, abs=1)
    assert f.evidence["issues"] == ["uncorrectable_ecc", "row_remap_pending"]
    assert f.evidence["dbe_errors"] == 1 and f.evidence["uncorrectable_remaps"] == 1
    assert f.evidence["xid_codes"] == [48, 63]
    assert f.evidence["xid_meanings"]["63"]["name"] == "row remap or page retirement recorded"
    assert f.hold_s == CFG.uncorrectable_hold_s


def test_pending_remap_alone_is_a_warning_dated_from_when_it_was_set() -> None:
    spec = board(remapped_rows_pending=lambda t: np.where(t >= T0 + 100, 1.0, 0.0))
    (f,) = detect(run_window([spec]), CFG)
    assert (f.cause, f.severity) == ("row_remap_pending", "warning")
    assert f.start == pytest.approx(T0 + 100, abs=1)
    # a GPU reset (driver reload) applies the remap: the flag clears and so does the finding
    spec = board(remapped_rows_pending=lambda t: np.where(t >= T0 + 400, 0.0, 1.0))
    assert detect(run_window([spec]), CFG) == []


def test_remap_failure_is_critical_and_comes_first() -> None:
    spec = board(remapped_rows_failed=const(1), remapped_rows_pending=const(1))
    (f,) = detect(run_window([spec]), CFG)
    assert (f.cause, f.severity, f.evidence["issues"]) == (
        "row_remap_failed",
        "critical",
        ["row_remap_failed", "row_remap_pending"],
    )


def test_correctable_error_rate() -> None:
    fast = board(ecc_sbe_vol=lambda t: np.floor((t - T0) / 20.0))  # 180/h
    slow = board(ecc_sbe_vol=lambda t: np.floor((t - T0) / 120.0))  # 30/h: below the bar
    fs = detect(run_window([fast, slow]), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(0, "correctable_ecc")]
    assert fs[0].evidence["sbe_per_h"] == pytest.approx(180, rel=0.05)


def test_pcie_replay_rate_and_counter_restarts() -> None:
    busy = board(pcie_replay_count=lambda t: 9 + np.floor((t - T0) * 0.5))  # 30/min
    reload = board(pcie_replay_count=lambda t: np.where(t < T0 + 300, 5000.0, 2.0))
    fs = detect(run_window([busy, reload]), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(0, "pcie_replay")]
    assert fs[0].evidence["pcie_replays_per_min"] == pytest.approx(30, rel=0.05)


def test_sparse_readings_every_ten_seconds() -> None:
    w = run_window([board(ecc_sbe_vol=lambda t: np.floor((t - T0) / 10.0))], t=times(600, 1.0))
    s = w.gpus[("n0", 0)]
    for name in list(s.cols):
        if name.startswith(("ecc_", "remapped_", "pcie_replay")):
            s.cols[name] = np.where(np.arange(s.t.size) % 10 == 0, s.cols[name], np.nan)
    (f,) = detect(w, CFG)
    assert f.cause == "correctable_ecc"


def test_no_health_columns_no_findings() -> None:
    assert detect(run_window([GpuSpec(steady(0.9))]), CFG) == []


def test_repeated_xid_evidence_is_decoded() -> None:
    spec = GpuSpec(steady(0.8), xid={T0 + 100: 79, T0 + 200: 79})
    (f,) = [f for f in misconfig(run_window([spec]), CFG) if f.cause == "repeated_xid"]
    assert f.evidence["xid_meanings"]["79"]["name"] == "GPU has fallen off the bus"
    assert f.evidence["xid_meanings"]["79"]["action"] == "drain_node"
