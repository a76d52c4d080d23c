"""NVLink and memory/bus faults in the simulator: their physics and their ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.sim import Fleet, record
from gpufleet.sim.labels import GPU_HEALTH, NVLINK_DEGRADED
from gpufleet.sim.profiles import PROFILES
from gpufleet.sim.scenario import ScenarioError, parse_scenario
from gpufleet.sim.workload import NVLINK_COMM_SHARE


def _scenario(faults: list[dict], model: str = "h100_sxm_80gb", runs: list[dict] | None = None) -> dict:
    return {
        "name": "t",
        "seed": 5,
        "duration_s": 900,
        "sample_interval_s": 1.0,
        "sites": [{"site": "s"}],
        "nodes": [{"prefix": "n", "count": 2, "gpus": 4, "gpu_model": model, "site": "s"}],
        "runs": runs
        or [
            {"run_id": "r", "nodes": ["n01"], "workload": {"warmup_s": [30, 30]}},
            {"run_id": "c", "nodes": ["n02"], "workload": {"warmup_s": [30, 30]}},
        ],
        "faults": faults,
    }


def _trace(raw: dict, seconds: float = 600.0):  # type: ignore[no-untyped-def]
    return record(Fleet.from_scenario(parse_scenario(raw)), seconds)


def test_healthy_nvlink_traffic_and_the_columns_a_board_has() -> None:
    tr = _trace(_scenario([]))
    late = tr.t >= tr.t[0] + 300
    nvl = tr.gpu["nvlink_tx_bytes_s"][late]
    assert np.all(nvl > 5e9)
    h100 = PROFILES["h100_sxm_80gb"]
    assert np.all(tr.gpu["nvlink_links_up"] == h100.nvlink_links)
    assert np.all(tr.gpu["nvlink_crc_errors"] == 0) and np.all(tr.gpu["ecc_sbe_vol"] == 0)
    assert NVLINK_COMM_SHARE * h100.nvlink_bytes_s_max > nvl.max()  # averaged over compute and communication
    tr = _trace(_scenario([], model="l40s_pcie_48gb"))
    assert np.isnan(tr.gpu["nvlink_links_up"]).all() and np.isnan(tr.gpu["nvlink_crc_errors"]).all()
    assert (tr.gpu["nvlink_tx_bytes_s"] == 0).all()
    assert np.nanmedian(tr.gpu["pcie_tx_bytes_s"][tr.t >= tr.t[0] + 300]) > 1e9  # collectives over PCIe


def test_links_down_slow_every_step_of_the_run_and_all_down_moves_it_to_pcie() -> None:
    base = Fleet.from_scenario(parse_scenario(_scenario([])))
    part = Fleet.from_scenario(
        parse_scenario(_scenario([{"kind": "nvlink_down", "node": "n01", "gpus": [1], "links_down": [9, 9]}]))
    )
    dead = Fleet.from_scenario(
        parse_scenario(
            _scenario([{"kind": "nvlink_down", "node": "n01", "gpus": [1], "links_down": [18, 18]}])
        )
    )
    steps = {}
    for name, f in (("base", base), ("part", part), ("dead", dead)):
        f.advance_to(f.t0 + 400)
        steps[name] = f.step_timing("r").step_s  # type: ignore[union-attr]
        assert f.step_timing("c").step_s == pytest.approx(base.step_timing("c").step_s)  # type: ignore[union-attr]
    assert steps["base"] < steps["part"] < steps["dead"]
    tr = record(
        Fleet.from_scenario(
            parse_scenario(
                _scenario([{"kind": "nvlink_down", "node": "n01", "gpus": [1], "links_down": [18, 18]}])
            )
        ),
        400,
    )
    late = tr.t >= tr.t[0] + 300
    assert (tr.col("nvlink_links_up", "n01", 1) == 0).all()
    assert (tr.col("nvlink_tx_bytes_s", "n01", 1)[late] == 0).all()
    assert np.median(tr.col("nvlink_tx_bytes_s", "n01", 0)[late]) > 1e9  # its peers still use NVLink
    assert np.median(tr.col("pcie_rx_bytes_s", "n01", 1)[late]) > 5 * np.median(
        tr.col("pcie_rx_bytes_s", "n01", 0)[late]
    )


def test_fallback_keeps_links_up_and_moves_every_collective_to_pcie() -> None:
    tr = _trace(_scenario([{"kind": "nvlink_fallback", "node": "n01"}]), 400)
    late = tr.t >= tr.t[0] + 300
    for g in range(4):
        assert (tr.col("nvlink_links_up", "n01", g) == 18).all()
        assert (tr.col("nvlink_tx_bytes_s", "n01", g)[late] == 0).all()
        tx, rx = tr.col("pcie_tx_bytes_s", "n01", g)[late], tr.col("pcie_rx_bytes_s", "n01", g)[late]
        assert np.median(tx) > 1e9 and np.median(rx) > 1e9


def test_error_counters_rise_at_the_drawn_rates_and_a_reload_restarts_them() -> None:
    raw = _scenario(
        [
            {
                "kind": "nvlink_errors",
                "node": "n02",
                "gpus": [2],
                "crc_per_s": [4, 4],
                "replay_per_s": [1, 1],
                "recovery_per_h": [0, 0],
            },
            {"kind": "ecc_sbe", "node": "n02", "gpus": [3], "sbe_per_h": [3600, 3600]},
            {"kind": "pcie_replay", "node": "n02", "gpus": [0], "replays_per_min": [120, 120]},
            {"kind": "counter_reset", "node": "n02", "gpus": [2, 3], "start_s": 500, "gap_s": [5, 5]},
        ]
    )
    tr = _trace(raw, 700)
    at = np.searchsorted(tr.t, tr.t[0] + 450)
    crc = tr.col("nvlink_crc_errors", "n02", 2)
    assert crc[at] == pytest.approx(4 * 450, rel=0.1)
    assert tr.col("ecc_sbe_vol", "n02", 3)[at] == pytest.approx(450, rel=0.15)
    rep = tr.col("pcie_replay_count", "n02", 0)
    assert rep[at] - rep[0] == pytest.approx(120 * 450 / 60, rel=0.1)
    after = tr.t >= tr.t[0] + 520
    assert np.nanmax(crc[after]) < crc[at]  # volatile counters restart at the reload
    agg = tr.col("ecc_sbe_agg", "n02", 3)
    assert np.nanmin(agg[after]) >= agg[at]  # the lifetime counter does not


def test_uncorrectable_errors_remap_a_row_pending_a_reset() -> None:
    raw = _scenario(
        [{"kind": "ecc_dbe", "node": "n01", "gpus": [0], "start_s": 100, "end_s": 200, "count": [1, 1]}]
    )
    f = Fleet.from_scenario(parse_scenario(raw))
    (t48, t63) = [x.time for x in f.plan.xids]
    assert [x.code for x in f.plan.xids] == [48, 63] and t63 - t48 == pytest.approx(2.0)
    tr = record(f, 400)
    before, after = tr.t < t48 - 1, tr.t > t63 + 1
    for col in ("ecc_dbe_vol", "ecc_dbe_agg", "remapped_rows_uncorrectable", "remapped_rows_pending"):
        c = tr.col(col, "n01", 0)
        assert (c[before] == 0).all() and (c[after] == 1).all(), col
    lab = f.labels()
    (health,) = [i for i in lab.incidents if i.kind == GPU_HEALTH]
    assert (health.cause, health.node, health.gpu) == ("uncorrectable_ecc", "n01", 0)
    assert health.start == pytest.approx(t48) and health.end == pytest.approx(lab.end)
    assert [i.cause for i in lab.incidents if i.kind == "host_misconfig"] == ["repeated_xid"]
    # A bundle that ends between the two XIDs holds the error only as far as its data shows.
    cut = lab.clip(lab.start, t48 + 1.0)
    assert [i.cause for i in cut.incidents if i.kind == GPU_HEALTH] == ["uncorrectable_ecc"]


def test_labels_and_hard_negatives_of_the_nvlink_scenarios() -> None:
    lab = Fleet.from_scenario("nvlink_degraded").labels()
    causes = sorted((i.cause, i.node, i.gpu) for i in lab.incidents if i.kind == NVLINK_DEGRADED)
    assert [c for c, _, _ in causes] == ["link_errors", "links_down", "links_down"]
    lab = Fleet.from_scenario("nvlink_fallback").labels()
    assert {(i.cause, i.node) for i in lab.incidents if i.kind == NVLINK_DEGRADED} == {
        ("pcie_fallback", "h100-01")
    }
    assert {h.reason for h in lab.hard_negatives if NVLINK_DEGRADED in h.not_kinds} == {"no_collectives"}
    lab = Fleet.from_scenario("pcie_box").labels()
    assert lab.incidents == [] and {h.run_id for h in lab.hard_negatives if h.reason == "no_nvlink"} == {
        "pcie-ddp",
        "pcie-single",
    }


def test_nvlink_faults_on_a_board_without_nvlink_are_refused() -> None:
    with pytest.raises(ScenarioError, match=r"faults\[0\].kind: n01's l40s_pcie_48gb has no NVLink"):
        parse_scenario(_scenario([{"kind": "nvlink_fallback", "node": "n01"}], model="l40s_pcie_48gb"))
