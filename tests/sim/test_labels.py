"""Ground truth: every injected fault is labelled, with the contract's kinds and causes."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.sim import Fleet, scenario_names
from gpufleet.sim.labels import CAUSES, KINDS

GPU_SCOPED = {"straggler", "throttling", "pcie_degraded"}
RUN_SCOPED = {"starvation", "checkpoint_stall"}


@pytest.mark.parametrize("name", scenario_names())
def test_every_fault_has_a_label_with_a_valid_kind_and_cause(name: str) -> None:
    fleet = Fleet.from_scenario(name)
    lab = fleet.labels()
    for i in lab.incidents:
        assert i.kind in KINDS, i
        assert i.cause in CAUSES[i.kind], i
        assert i.end is not None and fleet.t0 <= i.start < i.end <= fleet.t_end, i
        if i.kind in GPU_SCOPED:
            assert i.node is not None and i.gpu is not None and i.run_id is not None, i
        if i.kind in RUN_SCOPED:
            assert i.run_id is not None and i.node is None and i.gpu is None, i
    labelled = {i.fault_index for i in lab.incidents if i.fault_index is not None}
    labelled |= {
        f.index
        for f in fleet.plan.gpu_faults
        for h in lab.hard_negatives
        if h.detail.get("fault_index") == f.index
    }
    for k, f in enumerate(fleet.scenario.faults):
        if f.kind in ("starvation_cpu", "starvation_io", "checkpoint_stall"):
            assert any(i.run_id == f.run_id and i.fault == f.kind for i in lab.incidents), (name, k)
        elif f.kind in ("counter_reset", "sample_gap"):
            assert any(e.type == f.kind and e.node == getattr(f, "node", None) for e in lab.events), (name, k)
        else:
            assert k in labelled, (name, k, f.kind)
    for h in lab.hard_negatives:
        assert set(h.not_kinds) <= set(KINDS) and h.end is not None and h.start < h.end


def test_straggler_is_the_capped_gpu_and_only_it() -> None:
    lab = Fleet.from_scenario("straggler_power_cap").labels()
    (s,) = lab.of_kind("straggler")
    (t,) = lab.of_kind("throttling")
    assert (s.cause, t.cause) == ("power_cap", "power_cap")
    assert (s.node, s.gpu, s.run_id) == (t.node, t.gpu, t.run_id) == (s.node, s.gpu, "pc-straggler")
    assert s.evidence["slowdown"] >= 0.05


def test_picked_gpu_changes_with_the_seed() -> None:
    picks = set()
    for seed in range(8):
        (s,) = Fleet.from_scenario("straggler_power_cap", seed=seed).labels().of_kind("straggler")
        picks.add((s.node, s.gpu))
    assert len(picks) >= 4


def test_causes_per_scenario() -> None:
    def kinds(name: str) -> Counter[tuple[str, str | None]]:
        return Counter((i.kind, i.cause) for i in Fleet.from_scenario(name).labels().incidents)

    assert kinds("healthy") == Counter()
    assert kinds("idle_unallocated") == Counter()
    assert kinds("starvation_cpu") == Counter({("starvation", "cpu"): 1})
    assert kinds("starvation_io") == Counter({("starvation", "io"): 1})
    assert kinds("straggler_thermal") == Counter({("straggler", "thermal"): 1, ("throttling", "thermal"): 1})
    assert kinds("straggler_pcie") == Counter({("straggler", "pcie_degraded"): 1, ("pcie_degraded", None): 1})
    assert kinds("uniform_power_cap") == Counter({("throttling", "power_cap"): 16})
    assert kinds("checkpoint_stalls") == Counter({("checkpoint_stall", None): 1})
    # The repeated XIDs include 48 (a double-bit ECC error): the GPU's memory health is a finding too.
    assert kinds("host_misconfig") == Counter(
        {
            ("host_misconfig", "cpu_governor"): 1,
            ("host_misconfig", "cpu_quota"): 1,
            ("host_misconfig", "repeated_xid"): 1,
            ("gpu_health", "uncorrectable_ecc"): 1,
        }
    )
    assert kinds("gpu_health") == Counter(
        {
            ("gpu_health", "correctable_ecc"): 1,
            ("gpu_health", "uncorrectable_ecc"): 1,
            ("gpu_health", "pcie_replay"): 1,
            ("gpu_health", "row_remap_failed"): 1,
            ("host_misconfig", "repeated_xid"): 1,
        }
    )
    assert kinds("pcie_box") == Counter()
    hw = kinds("hw_throttling")
    assert hw[("throttling", "power_brake")] == 8 and hw[("throttling", "hw_slowdown")] == 1
    assert hw[("straggler", "clocks")] == 1


def test_hard_negatives() -> None:
    lab = Fleet.from_scenario("starvation_io").labels()
    reasons = Counter(h.reason for h in lab.hard_negatives)
    assert reasons["steady_low_utilisation"] == 1 and reasons["warmup"] == 2
    assert reasons["idle_unallocated"] == 8  # h100-04 is never allocated
    serving = next(h for h in lab.hard_negatives if h.reason == "steady_low_utilisation")
    assert "starvation" in serving.not_kinds and serving.run_id == "io-serving"
    ev = Fleet.from_scenario("checkpoint_stalls").labels()
    (pauses,) = [h for h in ev.hard_negatives if h.reason == "eval_pause"]
    assert pauses.run_id == "evals" and len(pauses.detail["pauses"]) >= 3
    assert set(pauses.not_kinds) >= {"starvation", "checkpoint_stall"}
    uni = Fleet.from_scenario("uniform_power_cap").labels()
    assert any(h.reason == "uniform_power_cap" and h.not_kinds == ["straggler"] for h in uni.hard_negatives)


def test_checkpoint_label_lists_each_stall() -> None:
    fleet = Fleet.from_scenario("checkpoint_stalls")
    (c,) = fleet.labels().of_kind("checkpoint_stall")
    plan = fleet.plan.checkpoints[0]
    assert len(c.evidence["stalls"]) == len(plan.stalls)
    assert c.evidence["period_s"] == plan.period_s
    assert c.start == plan.stalls.pairs()[0][0] and c.end == plan.stalls.pairs()[-1][1]
