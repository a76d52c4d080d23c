"""Sources by name from the agent's settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.sources import registry
from gpufleet.agent.sources.base import Reading, Source
from gpufleet.agent.sources.dcgm import DcgmSource
from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource
from gpufleet.agent.sources.host import HostSource
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.config import AgentSettings
from tests.conftest import realdata


def agent_settings(**values: object) -> AgentSettings:
    """Settings validated the way the config loader does (defaults filled by pydantic)."""
    return AgentSettings.model_validate(values)


@pytest.fixture
def scratch_name() -> Iterator[str]:
    yield "test_only_source"
    registry.unregister("test_only_source")


def test_builtins_are_registered() -> None:
    assert {"nvml", "dcgm", "dcgm_exporter", "host"} <= set(registry.registered())


def test_default_settings_build_nvml_and_host_without_touching_hardware() -> None:
    sources = registry.build_sources(agent_settings())
    assert [type(s) for s in sources] == [NvmlSource, HostSource]
    assert all(isinstance(s, Source) for s in sources)


def test_settings_reach_the_sources() -> None:
    settings = agent_settings(
        sources=["dcgm_exporter", "host", "dcgm"],
        host_power_w=420.0,
        dcgm_exporter_url="http://10.0.0.1:9400/metrics",
        interval_s=2.0,
    )
    exporter, host, dcgm = registry.build_sources(settings)
    assert isinstance(exporter, DcgmExporterSource) and exporter.url == "http://10.0.0.1:9400/metrics"
    assert isinstance(host, HostSource) and host.host_power_w == 420.0
    assert isinstance(dcgm, DcgmSource) and dcgm.update_interval_s == 2.0
    exporter.close()


def test_unknown_and_duplicate_names_fail_loudly(scratch_name: str) -> None:
    with pytest.raises(registry.UnknownSource, match="nvml"):
        registry.build_source("nvlm", agent_settings())
    with pytest.raises(registry.DuplicateSource):
        registry.build_sources(agent_settings(sources=["host", "host"]))
    with pytest.raises(registry.DuplicateSource):
        registry.register("host", lambda s: HostSource())


def test_plugins_register_themselves(scratch_name: str) -> None:
    class Dummy:
        name = scratch_name

        def collect(self) -> Reading:
            return Reading()

    registry.register(scratch_name, lambda settings: Dummy())
    built = registry.build_sources(agent_settings(sources=[scratch_name]))
    assert isinstance(built[0], Dummy)


def test_plugin_module_that_does_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.PLUGIN_MODULES, "ghost", "gpufleet.agent.no_such_module")
    with pytest.raises(registry.UnknownSource, match="cannot import"):
        registry.build_source("ghost", agent_settings())


def test_host_source_reads_the_configured_proc_root(tmp_path: Path) -> None:
    # A checked-in /proc tree (sysstat's test root1: 9 CPU lines, up 7192.55 s) given as proc_root,
    # as the DaemonSet gives /host/proc: the registry's HostSource must read it, not this machine's.
    proc = realdata("sysstat", "root1", "proc")
    sys_root = tmp_path / "sys"
    sys_root.mkdir()
    (host,) = registry.build_sources(
        agent_settings(sources=["host"], proc_root=str(proc), sys_root=str(sys_root))
    )
    assert isinstance(host, HostSource)
    assert host.proc_root == proc and host.sys_root == sys_root
    row = host.collect().host
    assert row is not None and row["cpu_count"] == 9
    assert host._prev is not None and host._prev.uptime_s == 7192.55
    assert len(host._prev.cpus) == 9


def test_nvml_source_gets_the_configured_sys_root(tmp_path: Path) -> None:
    (nvml,) = registry.build_sources(agent_settings(sources=["nvml"], sys_root=str(tmp_path)))
    assert isinstance(nvml, NvmlSource) and nvml.sys_root == tmp_path


def test_simulator_sources_come_from_entry_points_and_the_sim_settings() -> None:
    # the agent names them only: the installed gpufleet.sources entry points say which module registers them
    assert {"sim", "fake-nvml"} <= set(registry.plugin_modules())
    (fake,) = registry.build_sources(agent_settings(sources=["fake-nvml"], sim={"fake_nvml_gpus": 3}))
    assert isinstance(fake, NvmlSource)
    assert sorted(r["gpu"] for r in fake.collect().gpus) == [0, 1, 2]


def test_sim_settings_are_checked_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"sim\.speed"):
        AgentSettings.model_validate({"sim": {"speed": 0}})
    with pytest.raises(ValueError, match=r"sim\.scenery"):
        AgentSettings.model_validate({"sim": {"scenery": "demo"}})
