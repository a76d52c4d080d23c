"""Power caps applied through the agent's NVML seam, to every GPU of a run on the node or none, and restored.

The fake NVML behaves as the driver does: limits only within the board's
constraints, only for root (``may_set_power_limit``), a GPU may refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.sources.nvml_power_cap import Plan, PlanFollower, PowerCapper, parse_plans
from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml


def node(n: int = 4) -> FakeNvml:
    fake = FakeNvml([H100_SXM] * n)
    fake.init()
    return fake


def limits(fake: FakeNvml) -> list[float]:
    return [g.power_limit_w for g in fake.gpus]


class Plans:
    """What the API answers, as the test sets it."""

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        self.error: Exception | None = None

    def __call__(self) -> list[Plan]:
        if self.error is not None:
            raise self.error
        return list(self.plans)


def test_apply_to_every_gpu_of_the_run_and_restore_at_its_end(tmp_path: Path) -> None:
    fake, api = node(), Plans()
    f = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    api.plans = [Plan("job-7", 1, 450.0, (0, 1, 2))]
    f.sync()
    assert limits(fake) == [450.0, 450.0, 450.0, 700.0]
    report = f.facts()["power_caps"]["job-7"]
    assert report["state"] == "applied" and report["previous_w"] == {"0": 700.0, "1": 700.0, "2": 700.0}
    assert json.loads((tmp_path / "caps.json").read_text())["job-7"]["previous_mw"] == {
        "0": 700000,
        "1": 700000,
        "2": 700000,
    }
    f.sync()  # nothing new: nothing touched
    assert fake.calls["set_power_management_limit_mw"] == 3
    api.plans = []  # the run ended (or the plan was withdrawn)
    f.sync()
    assert limits(fake) == [700.0] * 4 and f.facts()["power_caps"]["job-7"]["state"] == "restored"
    assert json.loads((tmp_path / "caps.json").read_text()) == {}


def test_a_limit_outside_the_boards_range_changes_nothing(tmp_path: Path) -> None:
    fake, api = node(), Plans()
    f = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    api.plans = [Plan("job-7", 1, 150.0, (0, 1))]
    f.sync()
    report = f.facts()["power_caps"]["job-7"]
    assert report["state"] == "failed" and "accepts 210-700 W, not 150 W" in report["detail"]
    assert limits(fake) == [700.0] * 4 and fake.calls["set_power_management_limit_mw"] == 0
    f.sync()  # failed at this revision: not retried until the plan changes
    assert fake.calls["power_limit_constraints_mw"] == 1
    api.plans = [Plan("job-7", 2, 400.0, (0, 1))]
    f.sync()
    assert limits(fake) == [400.0, 400.0, 700.0, 700.0]


def test_a_gpu_that_refuses_puts_the_others_back(tmp_path: Path) -> None:
    fake, api = node(), Plans()
    fake.gpu(2).unsupported.add("set_power_management_limit_mw")
    f = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    api.plans = [Plan("job-7", 1, 450.0, (0, 1, 2, 3))]
    f.sync()
    report = f.facts()["power_caps"]["job-7"]
    assert report["state"] == "failed" and report["detail"].startswith("GPU 2:")
    assert "the 2 GPU(s) set before were put back" in report["detail"]
    assert limits(fake) == [700.0] * 4
    assert json.loads((tmp_path / "caps.json").read_text()) == {}


def test_without_root_nothing_is_set(tmp_path: Path) -> None:
    fake, api = node(2), Plans()
    fake.may_set_power_limit = False
    f = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    api.plans = [Plan("job-7", 1, 450.0, (0, 1))]
    f.sync()
    assert (
        f.facts()["power_caps"]["job-7"]["state"] == "failed"
        and "no permission" in f.facts()["power_caps"]["job-7"]["detail"]
    )
    assert limits(fake) == [700.0, 700.0]


def test_a_restarted_agent_restores_what_it_set(tmp_path: Path) -> None:
    fake, api = node(2), Plans()
    api.plans = [Plan("job-7", 1, 450.0, (0, 1))]
    PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api).sync()
    assert limits(fake) == [450.0, 450.0]
    api.plans = [Plan("job-7", 2, 400.0, (0, 1))]  # changed while the agent was down
    again = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    again.sync()
    assert limits(fake) == [400.0, 400.0]
    api.plans = []
    again.sync()
    assert limits(fake) == [700.0, 700.0]  # the limit from before the first cap, not 450 W


def test_an_unreachable_api_leaves_the_gpus_alone(tmp_path: Path) -> None:
    fake, api = node(2), Plans()
    f = PlanFollower(PowerCapper(fake, tmp_path / "caps.json"), api)
    api.plans = [Plan("job-7", 1, 450.0, (0, 1))]
    f.sync()
    api.error = httpx.ConnectError("refused")
    f.sync()
    assert limits(fake) == [450.0, 450.0]


def test_plans_are_checked() -> None:
    assert parse_plans({"plans": [{"run_id": "r", "revision": 3, "limit_w": 450, "gpus": [0, 1]}]}) == [
        Plan("r", 3, 450.0, (0, 1))
    ]
    for bad in (
        {},
        {"plans": [{"run_id": "r"}]},
        {"plans": [{"run_id": "r", "revision": 1, "limit_w": 0, "gpus": [0]}]},
    ):
        with pytest.raises(ValueError, match="power-cap plans"):
            parse_plans(bad)
