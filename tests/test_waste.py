"""The one rule that says which incident explains a lost GPU-second."""

from __future__ import annotations

import pytest

from gpufleet.waste import PRECEDENCE, STATE_OF_KIND, STATES, explaining_kind, outranks, state_of


def test_every_lost_state_is_ranked_once_and_productive_is_what_is_left() -> None:
    assert sorted(PRECEDENCE) == sorted(s for s in STATES if s != "productive")
    assert set(STATE_OF_KIND.values()) == set(PRECEDENCE)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["starvation", "checkpoint_stall"], "checkpoint_stall"),
        (["straggler", "checkpoint_stall"], "checkpoint_stall"),
        (["throttling", "straggler"], "straggler"),
        (["hung_collective", "starvation", "idle_allocation"], "idle_allocation"),
        (["pcie_degraded", "throttling"], "throttling"),
        (["pcie_degraded", "nvlink_degraded"], None),
        ([], None),
    ],
)
def test_the_most_specific_kind_explains_shared_seconds(kinds: list[str], expected: str | None) -> None:
    assert explaining_kind(kinds) == expected


def test_a_checkpointing_job_is_never_starvation() -> None:
    assert outranks("checkpoint_stall", "starvation")
    assert not outranks("starvation", "checkpoint_stall")
    assert not outranks("pcie_degraded", "starvation")
    assert state_of("pcie_degraded") is None
