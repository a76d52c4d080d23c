"""Stragglers: the GPU holding a synchronous run back, and why."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.straggler import detect
from tests.detectors.builders import T0, GpuSpec, noisy, run_window, steady, times

CFG = DetectorConfig()
#: Peers waiting at the barrier: activity down (collectives keep util up).
PEER = 0.6
SLOW = 0.9


def peers(n: int = 8, **kw: object) -> list[GpuSpec]:
    return [GpuSpec(noisy(steady(PEER), sd=0.02, seed=i), **kw) for i in range(n)]  # type: ignore[arg-type]


CASES = {
    "power_cap": dict(power_limit_w=400.0, throttle=0x4, throttle_clock=0.75),
    "thermal": dict(throttle=0x20, throttle_clock=0.7, temp_busy_c=92.0),
    "pcie_degraded": dict(pcie_width=8),
    "clocks": dict(clock_busy=0.7),
}


@pytest.mark.parametrize("cause", sorted(CASES))
@pytest.mark.parametrize("dcgm", [True, False])
def test_straggler_and_its_cause(cause: str, dcgm: bool) -> None:
    specs = peers(8, dcgm=dcgm)
    specs[5] = GpuSpec(steady(SLOW), dcgm=dcgm, **CASES[cause])  # type: ignore[arg-type]
    fs = detect(run_window(specs), CFG)
    assert len(fs) == 1, fs
    f = fs[0]
    assert (f.kind, f.node, f.gpu, f.run_id, f.cause) == ("straggler", "n0", 5, "r1", cause)
    ev = f.evidence
    assert ev["peers"] == 7
    assert ev["activity"] > ev["peer_activity"]


def test_power_cap_evidence_names_the_limits() -> None:
    specs = peers()
    specs[2] = GpuSpec(steady(SLOW), **CASES["power_cap"])  # type: ignore[arg-type]
    f = detect(run_window(specs), CFG)[0]
    assert f.evidence["power_limit_w"] == pytest.approx(400)
    assert f.evidence["peer_power_limit_w"] == pytest.approx(700)
    assert f.evidence["z"] < -CFG.straggler_z
    assert f.evidence["feature"] == "power_limit_w"


def test_uniform_power_cap_is_not_a_straggler() -> None:
    specs = [GpuSpec(noisy(steady(SLOW), seed=i), **CASES["power_cap"]) for i in range(8)]  # type: ignore[arg-type]
    assert detect(run_window(specs), CFG) == []


def test_identical_healthy_gpus_have_no_straggler() -> None:
    assert detect(run_window(peers(16)), CFG) == []


def test_slow_hardware_without_waiting_peers_is_not_a_straggler() -> None:
    # Lower power limit, but the job never hits it and nobody waits.
    specs = peers()
    specs[1] = GpuSpec(noisy(steady(PEER), seed=9), power_limit_w=400.0)
    assert detect(run_window(specs), CFG) == []


def test_two_gpu_run_compares_each_with_the_other() -> None:
    specs = [GpuSpec(steady(PEER)), GpuSpec(steady(SLOW), **CASES["power_cap"])]  # type: ignore[arg-type]
    fs = detect(run_window(specs), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(1, "power_cap")]


def test_single_gpu_runs_have_no_peers() -> None:
    w = run_window([GpuSpec(steady(SLOW), **CASES["power_cap"])])  # type: ignore[arg-type]
    assert detect(w, CFG) == []


def test_straggler_across_nodes() -> None:
    specs = peers(16)
    specs[12] = GpuSpec(steady(SLOW), **CASES["thermal"])  # type: ignore[arg-type]
    f = detect(run_window(specs, gpus_per_node=8), CFG)[0]
    assert (f.node, f.gpu, f.cause) == ("n1", 4, "thermal")


def slowed_from(at: float, until: float = float("inf")) -> GpuSpec:
    """Application clocks lowered (reason 0x2, not a throttle) from ``at``."""
    during = lambda t: (t >= at) & (t < until)  # noqa: E731
    return GpuSpec(
        lambda t: np.where(during(t), SLOW, PEER), throttle=0x2, throttle_when=during, throttle_clock=0.7
    )


def test_onset_is_dated_from_when_the_clocks_dropped() -> None:
    specs = peers()
    specs[3] = slowed_from(T0 + 420)
    fs = detect(run_window(specs), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(3, "clocks")]
    assert fs[0].start == pytest.approx(T0 + 420, abs=2)


def test_unexplained_straggler_has_cause_unknown() -> None:
    specs = peers()
    specs[6] = GpuSpec(steady(0.95))
    fs = detect(run_window(specs), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(6, "unknown")]


def test_a_straggler_whose_node_loses_packets_has_the_network_as_its_cause() -> None:
    """Nothing on the GPU explains it; its node's InfiniBand port logs symbol errors and link
    recoveries that the peers' nodes do not."""
    specs = peers(16)
    specs[11] = GpuSpec(steady(0.95))
    w = run_window(specs)
    for node, host in w.hosts.items():
        bad = node == "n1"
        host.cols["ib_symbol_errors"] = np.full(host.t.shape, 40.0 if bad else 0.0)
        host.cols["ib_link_error_recovery"] = np.where(
            np.arange(host.t.size) % 20 == 0, 1.0 if bad else 0.0, 0.0
        )
        host.cols["ib_util_pct"] = np.full(host.t.shape, 30.0)
    (f,) = detect(w, CFG)
    assert (f.node, f.gpu, f.cause) == ("n1", 3, "network")
    assert f.evidence["network_reason"] == "link_errors" and f.evidence["network_nodes"] == ["n1"]
    # the same counters on every node implicate no one node
    for host in w.hosts.values():
        host.cols["ib_symbol_errors"] = np.full(host.t.shape, 40.0)
    assert [x.cause for x in detect(w, CFG)] == ["unknown"]


@pytest.mark.parametrize("dt", [0.1, 30.0])
def test_sampling_rates(dt: float) -> None:
    specs = peers()
    specs[4] = GpuSpec(steady(SLOW), **CASES["clocks"])  # type: ignore[arg-type]
    fs = detect(run_window(specs, t=times(600, dt, jitter=0.05)), CFG)
    assert [(f.gpu, f.cause) for f in fs] == [(4, "clocks")]


def test_recovered_straggler_is_no_longer_reported() -> None:
    specs = peers()
    specs[4] = slowed_from(T0 - 100, until=T0 + 300)
    assert detect(run_window(specs), CFG) == []
    # Still averaged into the comparison span, but not seen for 100 s.
    specs[4] = slowed_from(T0 - 100, until=T0 + 500)
    assert detect(run_window(specs), CFG) == []
    specs[4] = slowed_from(T0 - 100, until=T0 + 560)
    fs = detect(run_window(specs), CFG)
    assert [f.gpu for f in fs] == [4]
    assert fs[0].last_active == pytest.approx(T0 + 559, abs=1)


def test_power_capped_straggler_from_util_and_power_alone() -> None:
    """nvidia-smi fields only, 1 s samples averaging the steps: every GPU at
    ~100 % GPU-Util, the capped one at a lower power plateau."""

    keep = ("util_pct", "power_w", "mem_used_mib")
    specs = [GpuSpec(steady(0.62 + 0.01 * (i % 3)), dcgm=False) for i in range(8)]
    specs[5] = GpuSpec(steady(0.5), dcgm=False)
    w = run_window(specs, no_host=True)
    for s in w.gpus.values():
        s.cols = {k: v for k, v in s.cols.items() if k in keep}
        s.cols["util_pct"] = s.cols["util_pct"] * 0 + 99.0
    fs = detect(w, CFG)
    assert [(f.node, f.gpu, f.cause) for f in fs] == [("n0", 5, "power_cap")]
    assert fs[0].evidence["feature"] == "power_plateau_w"


def test_many_gpus_at_a_lower_plateau_are_the_runs_spread_not_a_capped_straggler() -> None:
    """A node throttled as a whole leaves several GPUs of the run at lower
    plateaus than the rest: no one of them holds the job back alone."""
    keep = ("util_pct", "power_w", "mem_used_mib")
    specs = [GpuSpec(steady(0.62 + 0.01 * (i % 3)), dcgm=False) for i in range(16)]
    for i in (2, 5, 9, 13):
        specs[i] = GpuSpec(steady(0.5), dcgm=False)
    w = run_window(specs, no_host=True)
    for s in w.gpus.values():
        s.cols = {k: v for k, v in s.cols.items() if k in keep}
        s.cols["util_pct"] = s.cols["util_pct"] * 0 + 99.0
    assert detect(w, CFG) == []


def test_silicon_spread_of_power_is_no_straggler() -> None:

    specs = [GpuSpec(steady(0.6 + 0.015 * (i % 4)), dcgm=False) for i in range(8)]
    w = run_window(specs, no_host=True)
    for s in w.gpus.values():
        s.cols = {k: v for k, v in s.cols.items() if k in ("util_pct", "power_w")}
        s.cols["util_pct"] = s.cols["util_pct"] * 0 + 99.0
    assert detect(w, CFG) == []


def _rhythm_run(
    straggler: int | None, common_sd: float, own_sd: float, eff: dict[int, float], n: int = 16, seed: int = 4
) -> list[GpuSpec]:
    """1 s samples of util and power only, every GPU at ~100 % GPU-Util.

    Each sample, the peers computed for a share of it set by how long the
    step waited for the straggler (``common_sd``: the same for every peer),
    their own jitter on top (``own_sd``); the straggler computed throughout.
    ``eff``: silicon efficiency of some GPUs (dynamic power x eff)."""
    rng = np.random.default_rng(seed)
    t = times(600, 1.0)
    common = 0.88 + common_sd * rng.standard_normal(t.size)
    specs = []
    for i in range(n):
        share = np.ones(t.size) if i == straggler else common + own_sd * rng.standard_normal(t.size)
        e = eff.get(i, 1.0 + 0.01 * ((i * 7) % 5 - 2))
        power = 70.0 + 560.0 * e * np.clip(share, 0.0, 1.0) + 3.0 * rng.standard_normal(t.size)
        specs.append(
            GpuSpec(
                steady(0.9),
                dcgm=False,
                extra={"power_w": lambda _t, p=power: p, "util_pct": lambda tt: np.full(tt.shape, 100.0)},
            )
        )
    return specs


def _nvsmi(specs: list[GpuSpec]) -> list:
    w = run_window(specs, no_host=True)
    for s in w.gpus.values():
        s.cols = {k: v for k, v in s.cols.items() if k in ("util_pct", "power_w", "mem_used_mib")}
    return detect(w, CFG)


def test_straggler_out_of_its_peers_wait_rhythm() -> None:
    """Its mean power only ~8 % above the peers' (within reach of silicon
    spread), but the peers' power moves together, waiting on it, and its
    own does not."""
    fs = _nvsmi(_rhythm_run(straggler=9, common_sd=0.01, own_sd=0.002, eff={9: 0.96}))
    assert [(f.node, f.gpu, f.cause) for f in fs] == [("n1", 1, "unknown")]
    ev = fs[0].evidence
    assert ev["feature"] == "power_w"
    assert ev["power_correlation"] < 0.15 < ev["peer_power_correlation"]


def test_high_power_silicon_without_a_wait_rhythm_is_no_straggler() -> None:
    # Who waits varies from step to step: no common rhythm among the others.
    assert _nvsmi(_rhythm_run(straggler=None, common_sd=0.0, own_sd=0.01, eff={9: 1.08})) == []


def test_a_gpu_that_swings_with_the_run_is_not_out_of_its_rhythm() -> None:
    # Every GPU moves with the run's common rhythm, one at higher power (more work per step): no straggler.
    specs = _rhythm_run(straggler=None, common_sd=0.01, own_sd=0.002, eff={9: 1.08})
    assert _nvsmi(specs) == []
