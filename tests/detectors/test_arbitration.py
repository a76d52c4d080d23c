"""One explanation per lost GPU-second: the rule of gpufleet.waste decides between kinds."""

from __future__ import annotations

from gpufleet.collector.detectors.arbitration import arbitrate
from gpufleet.collector.detectors.window import Finding

T = 1_800_000_000.0


def f(
    kind: str,
    start: float = T,
    last: float = T + 300,
    run: str | None = "r1",
    node: str | None = None,
    gpu: int | None = None,
    **ev: object,
) -> Finding:
    return Finding(
        kind,
        None,
        "warning",
        start,
        dict(ev),
        run_id=run,
        node=node,
        gpu=gpu,  # type: ignore[arg-type]
        last_active=last,
    )


def kinds(fs: list[Finding]) -> list[str]:
    return sorted(x.kind for x in fs)


def test_a_checkpointing_run_is_never_starving_over_the_same_seconds() -> None:
    assert kinds(arbitrate([f("starvation"), f("checkpoint_stall")], T + 300)) == ["checkpoint_stall"]
    # ... but starvation at other times of the run stands
    assert kinds(
        arbitrate([f("starvation", T + 400, T + 900), f("checkpoint_stall", T, T + 300)], T + 900)
    ) == ["checkpoint_stall", "starvation"]
    # ... and another run's starvation is that run's
    assert kinds(arbitrate([f("starvation", run="r2"), f("checkpoint_stall")], T + 300)) == [
        "checkpoint_stall",
        "starvation",
    ]


def test_a_checkpoint_writer_is_not_a_straggler_but_another_gpu_may_be() -> None:
    ckpt = f("checkpoint_stall", writer_gpu="n0/0", blocking_gpus=["n0/0"])
    assert kinds(arbitrate([ckpt, f("straggler", node="n0", gpu=0)], T + 300)) == ["checkpoint_stall"]
    assert kinds(arbitrate([ckpt, f("straggler", node="n0", gpu=5)], T + 300)) == [
        "checkpoint_stall",
        "straggler",
    ]


def test_idle_and_hung_runs_explain_everything_else_of_the_run() -> None:
    found = [
        f("hung_collective"),
        f("checkpoint_stall"),
        f("straggler", node="n0", gpu=1),
        f("starvation"),
        f("pcie_degraded", node="n0", gpu=2),
    ]
    assert kinds(arbitrate(found, T + 300)) == ["hung_collective", "pcie_degraded"]
    some = f("idle_allocation", scope="some", gpus=[{"node": "n0", "gpu": 7}])
    assert kinds(
        arbitrate([some, f("straggler", node="n0", gpu=7), f("straggler", node="n0", gpu=3)], T + 300)
    ) == ["idle_allocation", "straggler"]


def test_a_straggler_and_its_own_throttling_are_different_seconds() -> None:
    found = [f("straggler", node="n0", gpu=4), f("throttling", node="n0", gpu=4)]
    assert kinds(arbitrate(found, T + 300)) == ["straggler", "throttling"]
