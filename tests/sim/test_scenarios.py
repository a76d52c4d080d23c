"""Scenario files: every shipped one loads, and every mistake names the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.sim import Fleet, ScenarioError, load_scenario, scenario_names

REQUIRED = {
    "healthy",
    "starvation_cpu",
    "starvation_io",
    "straggler_power_cap",
    "straggler_thermal",
    "straggler_pcie",
    "uniform_power_cap",
    "checkpoint_stalls",
    "thermal_throttling",
    "idle_unallocated",
    "mixed_fleet",
    "demo",
}

BASE: dict[str, Any] = {
    "duration_s": 600,
    "sites": [{"site": "s1"}],
    "nodes": [{"prefix": "n", "count": 2, "gpu_model": "h100_sxm_80gb", "site": "s1"}],
    "runs": [{"run_id": "r1", "nodes": ["n01", "n02"]}],
    "faults": [
        {"kind": "starvation_cpu", "run_id": "r1", "start_s": 100},
        {"kind": "power_cap", "run_id": "r1", "pick": 1},
    ],
}


def write(tmp_path: Path, data: dict[str, Any], name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def mutate(**changes: Any) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        node = data
        parts = dotted.split("__")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        last = parts[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def test_the_required_scenarios_are_shipped() -> None:
    assert set(scenario_names()) >= REQUIRED


@pytest.mark.parametrize("name", scenario_names())
def test_shipped_scenario_loads_and_builds(name: str) -> None:
    sc = load_scenario(name)
    assert sc.name == name and sc.description
    fleet = Fleet.from_scenario(name)
    assert fleet.nodes and fleet.t == fleet.t0


def test_demo_is_big_enough_and_has_every_kind_of_fault() -> None:
    fleet = Fleet.from_scenario("demo")
    assert len(fleet.nodes) >= 4 and all(len(fleet.plan.nodes[n].gpu_idx) == 8 for n in fleet.nodes)
    starts = sorted(r.start for r in fleet.plan.runs)
    assert sum(1 for s in starts if s < fleet.t0 + 120) >= 4, "several runs at once from the start"
    lab = fleet.labels()
    found = {(i.kind, i.cause) for i in lab.incidents}
    for need in [
        ("starvation", "cpu"),
        ("starvation", "io"),
        ("checkpoint_stall", None),
        ("pcie_degraded", None),
    ]:
        assert need in found
    assert {k for k, _ in found} >= {"straggler", "throttling", "host_misconfig"}
    # Findings show up early in a live demo.
    assert min(i.start for i in lab.incidents if i.kind != "host_misconfig") < fleet.t0 + 600


def test_good_base_is_valid(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, BASE, "ok.yaml"))
    assert sc.name == "ok"


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        (mutate(sampel_interval_s=1.0), "sampel_interval_s", "Extra inputs"),
        (mutate(faults__1__limt_w=300), "faults[1].limt_w", "Extra inputs"),
        (mutate(faults__0__period_s=[40, 8]), "faults[0].period_s", "range low"),
        (mutate(faults__0__duty=[0.1, 0.2, 0.3]), "faults[0].duty", "3 items"),
        (mutate(faults__0__kind="starvaton_cpu"), "faults[0]", "starvaton_cpu"),
        (mutate(faults__0__run_id="r9"), "faults[0].run_id", "unknown run 'r9'"),
        (mutate(faults__1__pick=99), "faults[1].pick", "picks 99"),
        (mutate(runs__0__nodes=["n01", "n03"]), "runs[0].nodes[1]", "unknown node 'n03'"),
        (mutate(runs__0__gpus=[0, 8]), "runs[0].gpus", "GPU 8 does not exist"),
        (mutate(nodes__0__gpu_model="h800"), "nodes[0].gpu_model", "unknown GPU model"),
        (mutate(nodes__0__site="nowhere"), "nodes[0].site", "unknown site"),
        (mutate(sample_interval_s=0.01), "sample_interval_s", "greater than or equal to 0.1"),
        (mutate(sample_interval_s=60), "sample_interval_s", "less than or equal to 30"),
        (mutate(faults__0__end_s=50), "faults[0]", "must be after start_s"),
        (mutate(faults__1__gpus=[1]), "faults[1]", "gpus needs node"),
        (
            mutate(
                runs=[{"run_id": "r1", "nodes": ["n01"]}, {"run_id": "r2", "nodes": ["n01"], "gpus": [3]}]
            ),
            "runs[1].nodes[0]",
            "already held by run 'r1'",
        ),
        (mutate(faults=[{"kind": "pcie_degraded", "node": "n01", "gen": 5}]), "faults[0].gen", "not below"),
        (
            mutate(faults=[{"kind": "sample_gap", "node": "n09", "start_s": 10, "end_s": 20}]),
            "faults[0].node",
            "unknown node",
        ),
        (mutate(start_time="2026-12-01T10:00:00"), "start_time", "UTC offset"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, data: dict[str, Any], key: str, words: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert f"{path}: {key}" in msg, msg
    assert words in msg, msg


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario"):
        load_scenario("no-such-scenario")
    with pytest.raises(ScenarioError, match=r"absent\.yaml: no such scenario file"):
        load_scenario(tmp_path / "absent.yaml")
    bad = tmp_path / "broken.yaml"
    bad.write_text("runs: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml: not valid YAML"):
        load_scenario(bad)
    seq = tmp_path / "list.yaml"
    seq.write_text("- a\n- b\n")
    with pytest.raises(ScenarioError, match=r"list\.yaml: top level must be a mapping"):
        load_scenario(seq)


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    data = mutate(runs__0__nodes=["n01", "n07"], faults__0__run_id="r9")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(write(tmp_path, data))
    msg = str(exc.value)
    assert "runs[0].nodes[1]" in msg and "faults[0].run_id" in msg
