"""Node facts from a sysfs tree built in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.sources.facts import (
    cpu_governors,
    cpu_quota_cores,
    node_facts,
    online_cpu_count,
    parse_cpu_list,
    summarise_governors,
)


def make_cpus(sys_root: Path, governors: list[str], online: str) -> None:
    base = sys_root / "devices" / "system" / "cpu"
    for i, gov in enumerate(governors):
        d = base / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    (base / "cpufreq").mkdir(parents=True, exist_ok=True)  # not a cpuN directory: ignored
    (base / "online").write_text(online + "\n")


def test_uniform_governor_is_one_word(tmp_path: Path) -> None:
    make_cpus(tmp_path, ["performance"] * 4, "0-3")
    assert cpu_governors(tmp_path) == {"performance": 4}
    assert summarise_governors(cpu_governors(tmp_path)) == "performance"


def test_mixed_governors_are_summarised_with_counts(tmp_path: Path) -> None:
    make_cpus(tmp_path, ["powersave", "performance", "powersave"], "0-2")
    assert summarise_governors(cpu_governors(tmp_path)) == "mixed: performance=1,powersave=2"


def test_no_cpufreq_means_unknown_governor(tmp_path: Path) -> None:
    assert summarise_governors(cpu_governors(tmp_path)) is None


@pytest.mark.parametrize(
    ("content", "cores"),
    [("200000 100000\n", 2.0), ("50000 100000\n", 0.5), ("max 100000\n", None)],
)
def test_cgroup_v2_cpu_max(tmp_path: Path, content: str, cores: float | None) -> None:
    (tmp_path / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "fs" / "cgroup" / "cpu.max").write_text(content)
    assert cpu_quota_cores(tmp_path) == cores


def test_cgroup_v1_quota_and_unlimited(tmp_path: Path) -> None:
    d = tmp_path / "fs" / "cgroup" / "cpu,cpuacct"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("400000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota_cores(tmp_path) == 4.0
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota_cores(tmp_path) is None


def test_nested_cgroup_path(tmp_path: Path) -> None:
    d = tmp_path / "fs" / "cgroup" / "kubepods.slice" / "pod1"
    d.mkdir(parents=True)
    (d / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota_cores(tmp_path, "/kubepods.slice/pod1") == 1.5
    assert cpu_quota_cores(tmp_path) is None


def test_cpu_list_parsing_and_online_count(tmp_path: Path) -> None:
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    make_cpus(tmp_path, ["performance"] * 2, "0-7,16-23")
    assert online_cpu_count(tmp_path) == 16


def test_node_facts_bundle(tmp_path: Path) -> None:
    make_cpus(tmp_path, ["ondemand"] * 2, "0-1")
    facts = node_facts(tmp_path)
    assert facts["cpu_count"] == 2
    assert facts["cpu_governor"] == "ondemand"
    assert facts["cpu_quota_cores"] is None
    assert facts["hostname"] and facts["kernel"]


# -- what the agent sends fits the collector's facts schema -----------------------------


def test_node_facts_fit_the_schema(tmp_path: Path) -> None:
    from gpufleet.facts import NodeFacts, check_facts

    make_cpus(tmp_path, ["powersave"] * 2, "0-1")
    (tmp_path / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "fs" / "cgroup" / "cpu.max").write_text("150000 100000\n")
    facts = node_facts(tmp_path)
    assert check_facts(facts) is facts
    f = NodeFacts.read(facts)
    assert f.cpu_quota_cores == 1.5 and f.cpu_governors == {"powersave": 2} and f.cpu_count == 2
    # and the machine's own
    assert check_facts(node_facts()) is not None


@pytest.mark.parametrize("profiles", [("h100",) * 8, ("h100-mig", "h200", "l40s")])
def test_nvml_facts_fit_the_schema(profiles: tuple[str, ...]) -> None:
    from gpufleet.agent.sources.nvml import NvmlSource
    from gpufleet.facts import NodeFacts, check_facts
    from gpufleet.sim.nvml_fake import PROFILES, FakeNvml

    src = NvmlSource(FakeNvml([PROFILES[k] for k in profiles]), sys_root="/nonexistent")
    facts = src.facts()
    check_facts(facts)
    f = NodeFacts.read(facts)
    assert f.gpu_count == len(profiles) and f.gpus is not None
    assert f.gpu_model_of(0) == facts["gpus"][0]["name"]


def test_dcgm_exporter_facts_fit_the_schema() -> None:
    from gpufleet.agent.sources.dcgm_exporter import parse_exposition
    from gpufleet.facts import check_facts
    from tests.agent.test_dcgm_exporter_source import real_lines

    parsed = parse_exposition("\n".join(real_lines()) + "\n")
    check_facts(
        {
            "dcgm_exporter_url": "http://127.0.0.1:9400/metrics",
            "gpus": [parsed.gpus[g] for g in sorted(parsed.gpus)],
        }
    )


def test_simulated_fleet_facts_fit_the_schema() -> None:
    from gpufleet.facts import check_facts
    from gpufleet.sim.fleet import Fleet

    fleet = Fleet.from_scenario("mixed_fleet")
    for node in fleet.nodes:
        check_facts(fleet.facts(node))
