"""The agent loop without a collector: source isolation, merging, facts, sanitising, sealing, /metrics."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zstandard

from gpufleet.agent import scheduler as scheduler_mod
from gpufleet.agent.merge import merge_readings
from gpufleet.agent.metrics import AgentMetrics
from gpufleet.agent.runtime import Agent
from gpufleet.agent.scheduler import Scheduler
from gpufleet.agent.sources.base import Reading, SourceError
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.config import AgentSettings, SourceSchedule
from gpufleet.serverthread import free_port
from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml
from gpufleet.wire import as_lists


class Steady:
    """A source that answers at once with one row per GPU."""

    def __init__(self, name: str = "steady", gpus: int = 2, **fields: Any) -> None:
        self.name = name
        self.gpus = gpus
        self.fields = fields or {"power_w": 100.0}
        self.calls = 0

    def collect(self) -> Reading:
        self.calls += 1
        return Reading(gpus=[{"gpu": g, "mig_instance": None, **self.fields} for g in range(self.gpus)])


class Failing:
    name = "failing"

    def __init__(self, exc: Exception | None = None) -> None:
        self.exc = exc or SourceError("dcgm: hostengine not reachable")
        self.calls = 0

    def collect(self) -> Reading:
        self.calls += 1
        raise self.exc


class Hanging:
    """Blocks in ``collect`` until released; records how many reads ever ran at once."""

    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = 0
        self.max_running = 0
        self.calls = 0
        self._lock = threading.Lock()

    def collect(self) -> Reading:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            self.release.wait(30)
            return Reading(gpus=[{"gpu": 0, "mig_instance": None, "sm_active": 0.5}])
        finally:
            with self._lock:
                self.running -= 1


class WithFacts(Steady):
    def __init__(self) -> None:
        super().__init__("withfacts")
        self.facts_value: dict[str, Any] = {"driver_version": "590.48.01", "gpu_count": 2}

    def facts(self) -> dict[str, Any]:
        return dict(self.facts_value)


def build(sources: list[Any], interval_s: float = 0.1, **kw: Any) -> Scheduler:
    sched = Scheduler.build(
        sources,
        interval_s=interval_s,
        schedules=kw.pop("schedules", {}),
        default_timeout_s=kw.pop("timeout_s", None),
        metrics=AgentMetrics(),
        want_processes=False,
        rng=random.Random(0),
    )
    sched.start()
    return sched


@pytest.fixture(autouse=True)
def no_first_read_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_mod, "FIRST_READ_TIMEOUT_S", 0.0)


# --------------------------------------------------------------------------- scheduler


def test_a_failing_source_never_stops_the_others() -> None:
    good, bad, buggy = Steady(), Failing(), Failing(ZeroDivisionError("plug-in bug"))
    sched = build([good, bad, buggy])
    for n in range(5):
        result = sched.tick(n)
        assert [o.source for o in result.outcomes if o.reading] == ["steady"]
    w_good, w_bad, w_buggy = sched.workers
    assert w_good.stats.reads == 5 and w_good.stats.samples == 10 and w_good.stats.errors == 0
    assert w_bad.stats.errors == 5 and w_buggy.stats.errors == 5
    m = w_bad.metrics
    assert m.value("gpufleet_agent_source_errors_total", source="failing", kind="error") == 10
    assert m.value("gpufleet_agent_samples_collected_total", source="steady") == 10
    assert sched.stop() == []


def test_a_hanging_source_is_timed_out_skipped_and_never_overlapped() -> None:
    good, hang = Steady(), Hanging()
    sched = build([good, hang], interval_s=0.2, timeout_s=0.05)
    durations = []
    for n in range(6):
        t0 = time.monotonic()
        result = sched.tick(n)
        durations.append(time.monotonic() - t0)
        assert [o.source for o in result.outcomes if o.reading] == ["steady"]
        time.sleep(0.02)
    # Ticks wait for the hung source only up to its timeout.
    assert max(durations) < 0.15
    w_hang = sched.workers[1]
    assert hang.calls == 1 and hang.max_running == 1
    assert w_hang.stats.timeouts == 1 and w_hang.stats.skipped == 5
    # Released late: that result is discarded; the next tick starts a fresh read,
    # which (no longer blocked) makes it in time.
    hang.release.set()
    deadline = time.monotonic() + 2
    while w_hang.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    late = sched.tick(6)
    assert [o.source for o in late.outcomes if o.reading] == ["steady", "hanging"]
    assert hang.calls == 2 and w_hang.stats.timeouts == 1
    assert good.calls == 7
    assert sched.stop() == []


def test_slow_source_within_its_timeout_joins_the_next_tick() -> None:
    class Slow(Steady):
        def collect(self) -> Reading:
            time.sleep(0.12)
            return super().collect()

    slow = Slow("slow", gpus=1)
    sched = build(
        [Steady(), slow], interval_s=0.1, schedules={"slow": SourceSchedule(interval_s=0.3, timeout_s=0.25)}
    )
    seen = []
    for n in range(7):
        seen.append([o.source for o in sched.tick(n).outcomes if o.reading])
        time.sleep(0.1)
    w_slow = sched.workers[1]
    deadline = time.monotonic() + 2
    while w_slow.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    leftover = w_slow.harvest()
    assert w_slow.every_ticks == 3 and w_slow.stats.timeouts == 0 and w_slow.stats.skipped == 0
    # Each read outlasts its own tick's gathering (0.05 s) and lands in a later tick; none is lost.
    assert slow.calls >= 2 and sum("slow" in s for s in seen) + len(leftover) == slow.calls
    assert all("steady" in s for s in seen)
    sched.stop()


def test_facts_are_read_on_the_source_thread_when_requested() -> None:
    src = WithFacts()
    sched = build([src, Steady("other")])
    assert sched.facts() == (False, {})
    sched.request_facts()
    sched.tick(0)
    deadline = time.monotonic() + 2
    while not sched.facts()[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sched.facts() == (True, {"driver_version": "590.48.01", "gpu_count": 2})
    sched.stop()


class SlowFacts(WithFacts):
    def __init__(self, facts_s: float) -> None:
        super().__init__()
        self.facts_s = facts_s

    def facts(self) -> dict[str, Any]:
        time.sleep(self.facts_s)
        return super().facts()


@pytest.mark.parametrize("due", [True, False], ids=["with-a-reading", "facts-only"])
def test_the_tick_that_asks_for_facts_gathers_them_within_its_window(due: bool) -> None:
    # The facts are read after the reading, on the source's thread: the tick waits for them too,
    # or the first batch goes out without them on a busy host.
    src = SlowFacts(0.05)
    sched = build(
        [src], interval_s=0.6, schedules={} if due else {"withfacts": SourceSchedule(interval_s=1.2)}
    )
    worker = sched.workers[0]
    tick = worker.phase if due else 1 - worker.phase
    sched.request_facts()
    result = sched.tick(tick)
    assert [o.source for o in result.outcomes if o.reading] == (["withfacts"] if due else [])
    assert sched.facts() == (True, {"driver_version": "590.48.01", "gpu_count": 2})
    sched.stop()


def test_facts_slower_than_the_window_do_not_hold_the_tick() -> None:
    src = SlowFacts(0.6)
    sched = build([src], interval_s=0.2)  # gathers for 0.1 s
    sched.request_facts()
    t0 = time.monotonic()
    result = sched.tick(0)
    took = time.monotonic() - t0
    assert took < 0.4 and [o.source for o in result.outcomes if o.reading] == ["withfacts"]
    assert sched.facts() == (False, {})
    deadline = time.monotonic() + 3
    while not sched.facts()[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sched.facts()[0] is True
    sched.stop()


# --------------------------------------------------------------------------- merging


def test_later_sources_fill_only_what_earlier_ones_left_empty() -> None:
    nvml = Reading(
        gpus=[
            {"gpu": 0, "mig_instance": None, "power_w": 300.0, "util_pct": None, "uuid": "GPU-0"},
            {"gpu": 0, "mig_instance": 3, "mem_used_mib": 10.0},
            {"gpu": 1, "mig_instance": None, "power_w": 310.0},
        ],
        host={"cpu_user_pct": 5.0, "host_power_w": None},
    )
    dcgm = Reading(
        gpus=[
            {"gpu": 0, "mig_instance": None, "power_w": 999.0, "util_pct": 87.0, "sm_active": 0.7},
            {"gpu": 0, "mig_instance": 3, "sm_active": 0.2},
            {"gpu": 2, "sm_active": 0.1},
        ],
        host={"cpu_user_pct": 99.0, "host_power_w": 450.0},
    )
    rows, host = merge_readings([nvml, dcgm])
    assert [(r["gpu"], r.get("mig_instance")) for r in rows] == [(0, None), (0, 3), (1, None), (2, None)]
    assert rows[0] == {
        "gpu": 0,
        "mig_instance": None,
        "power_w": 300.0,
        "util_pct": 87.0,
        "uuid": "GPU-0",
        "sm_active": 0.7,
    }
    assert rows[1]["sm_active"] == 0.2 and rows[1]["mem_used_mib"] == 10.0
    assert host == {"cpu_user_pct": 5.0, "host_power_w": 450.0}
    # Order matters: the first source wins.
    rows2, _ = merge_readings([dcgm, nvml])
    assert rows2[0]["power_w"] == 999.0


# --------------------------------------------------------------------------- the agent, step by step


def settings(**kw: Any) -> AgentSettings:
    base: dict[str, Any] = {
        "interval_s": 0.1,
        "ship_interval_s": 0.3,
        "metrics_port": 0,
        "token": "t",
        "collector_url": "http://127.0.0.1:9",
        "attribute_processes": False,
        "start_jitter_s": 0.0,
    }
    return AgentSettings.model_validate({**base, **kw})


def decode_segments(spool_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(spool_dir.glob("*.seg")):
        body = path.read_bytes()[12:]
        out.append(
            as_lists(
                msgpack.unpackb(zstandard.ZstdDecompressor().decompressobj().decompress(body), raw=False)
            )
        )
    return out


def test_agent_ticks_merge_stamp_and_seal(tmp_path: Path) -> None:
    fake = FakeNvml([H100_SXM, H100_SXM])
    for g in fake.gpus:
        g.load()
    dcgm_like = Steady("dcgm", gpus=2, sm_active=0.9, power_w=1.0)
    host = Steady("hostish", gpus=0)
    host.collect = lambda: Reading(host={"cpu_user_pct": 12.5, "cpu_count": 64})  # type: ignore[method-assign]
    node_facts = {"hostname": "n1", "cpu_governor": "performance"}
    clock = iter(1_700_000_000.0 + i for i in range(1000))
    agent = Agent(
        settings(ship_interval_s=60),
        [NvmlSource(fake, sys_root="/nonexistent"), dcgm_like, host],
        node="node-a",
        spool_dir=tmp_path,
        wall=lambda: next(clock),
        facts_of_node=lambda: dict(node_facts),
    )
    agent.start(ship=False, serve_metrics=False)
    for _ in range(4):
        agent.tick()
        time.sleep(0.1)
    agent.seal()
    (batch,) = decode_segments(tmp_path)
    agent.shutdown(ship_s=0)
    g = batch["gpu"]
    assert batch["batch_id"].endswith(":1") and batch["node"] == "node-a"
    n = len(g["time"])
    assert n == 8 and g["gpu"] == [0, 1] * 4
    assert g["time"][0::2] == g["time"][1::2]  # one stamp per tick
    assert g["power_w"] == [pytest.approx(588.39)] * n  # NVML first...
    assert (
        g["sm_active"] == [pytest.approx(0.9)] * n
    )  # ...DCGM fills what NVML cannot measure (float4 on the wire)
    assert batch["host"]["cpu_user_pct"] == [12.5] * 4
    facts = batch["facts"]
    assert facts["hostname"] == "n1" and facts["driver_version"] == "590.48.01" and facts["gpu_count"] == 2
    assert batch["agent"]["id"] == agent.spool.agent_id


def test_facts_go_in_the_first_batch_and_again_only_on_change(tmp_path: Path) -> None:
    node_facts = {"hostname": "n1", "cpu_governor": "performance"}
    # Node checks off: they read this machine's live counters, which change between refreshes
    # (tests/agent/test_agentfacts.py covers them on a fixed tree).
    agent = Agent(
        settings(facts_interval_s=0.25, node_checks=False),
        [Steady()],
        node="node-a",
        spool_dir=tmp_path,
        facts_of_node=lambda: dict(node_facts),
    )
    agent.start(ship=False, serve_metrics=False)
    with_facts = []
    for i in range(12):
        if i == 6:
            node_facts["cpu_governor"] = "powersave"
        with_facts.append(agent.tick().facts)
        time.sleep(0.1)
    assert with_facts[0] is True
    assert sum(with_facts) == 2
    # A dropped or refused batch may have carried them: they are sent again.
    agent.spool.facts_lost.set()
    assert agent.tick().facts is True
    agent.shutdown(ship_s=0)


def test_unusable_values_become_null_not_a_refused_batch(tmp_path: Path) -> None:
    weird = Steady(
        "weird",
        gpus=1,
        power_w=math.nan,
        util_pct=140.0,
        temp_c=55.0,
        ecc_dbe_vol=True,
        made_up_field=3,
        xid=2**40,
    )
    weird_host = Steady("weirdhost", gpus=0)
    weird_host.collect = lambda: Reading(host={"cpu_user_pct": -1.0, "cpu_count": 8})  # type: ignore[method-assign]
    agent = Agent(settings(), [weird, weird_host], node="node-a", spool_dir=tmp_path, facts_of_node=dict)
    agent.start(ship=False, serve_metrics=False)
    agent.tick()
    agent.seal()
    agent.shutdown(ship_s=0)
    (batch,) = decode_segments(tmp_path)
    g = batch["gpu"]
    assert g["power_w"] == [None] and g["util_pct"] == [None] and g["xid"] == [None]
    assert g["temp_c"] == [55] and g["ecc_dbe_vol"] == [1]
    assert "made_up_field" not in g
    assert batch["host"]["cpu_user_pct"] == [None] and batch["host"]["cpu_count"] == [8]
    assert agent.sanitizer.nulled["power_w"] == 1 and agent.sanitizer.unknown["made_up_field"] == 1


def test_malformed_rows_are_left_out_and_counted(tmp_path: Path) -> None:
    bad = Steady("bad")
    bad.collect = lambda: Reading(gpus=[{"power_w": 1.0}, {"gpu": "0", "power_w": 2.0}])  # type: ignore[method-assign]
    agent = Agent(settings(), [Steady(), bad], node="node-a", spool_dir=tmp_path, facts_of_node=dict)
    agent.start(ship=False, serve_metrics=False)
    stats = agent.tick()
    assert stats.gpu_rows == 2
    assert agent.metrics.value("gpufleet_agent_source_errors_total", source="bad", kind="malformed") == 1
    agent.shutdown(ship_s=0)


def test_run_loop_ticks_on_schedule_and_seals_every_ship_interval(tmp_path: Path) -> None:
    src = Steady(gpus=1)
    agent = Agent(
        settings(interval_s=0.1, ship_interval_s=0.4),
        [src],
        node="node-a",
        spool_dir=tmp_path,
        facts_of_node=dict,
    )
    agent.start(ship=False, serve_metrics=False)
    stop = threading.Event()
    th = threading.Thread(target=agent.run, args=(stop,))
    th.start()
    time.sleep(1.5)
    stop.set()
    th.join(2)
    agent.shutdown(ship_s=0)
    batches = decode_segments(tmp_path)
    times = [t for b in batches for t in b["gpu"]["time"]]
    assert 12 <= len(times) <= 16
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 0.25 and min(gaps) > 0.04
    # 4 ticks per segment (0.4 s / 0.1 s); the last one is cut by the stop.
    assert all(len(b["gpu"]["time"]) == 4 for b in batches[:-1])


def test_metrics_endpoint(tmp_path: Path) -> None:
    port = free_port()
    agent = Agent(
        settings(metrics_port=port, metrics_host="127.0.0.1"),
        [Steady(), Failing()],
        node="node-a",
        spool_dir=tmp_path,
        facts_of_node=dict,
    )
    agent.start(ship=False)
    agent.tick()
    text = httpx.get(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=5).text
    for name in (
        'gpufleet_agent_samples_collected_total{source="steady"} 2.0',
        'gpufleet_agent_source_errors_total{kind="error",source="failing"} 1.0',
        "gpufleet_agent_spool_bytes",
        "gpufleet_agent_spool_segments",
        "gpufleet_agent_batches_sent_total",
        "gpufleet_agent_batches_retried_total",
        "gpufleet_agent_batches_dead_lettered_total",
        "gpufleet_agent_samples_dropped_total",
        "gpufleet_agent_last_ship_success_timestamp_seconds",
    ):
        assert name in text, name
    agent.shutdown(ship_s=0)


# --------------------------------------------------------------------------- shipped configuration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "agent"


def test_example_config_and_daemonset_config_are_valid_settings(tmp_path: Path) -> None:
    import yaml

    from gpufleet.config import load_settings

    s = load_settings(DEPLOY / "agent.yaml")
    assert s.agent.sources == ["nvml", "host"] and s.agent.job_files_dir == Path("/run/gpufleet/jobs")
    assert s.agent.source_schedules["dcgm_exporter"].interval_s == 5.0
    docs = list(yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text()))
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (path := tmp_path / "agent.yaml").write_text(cm["data"]["agent.yaml"])
    k8s = load_settings(path)
    assert k8s.agent.proc_root == Path("/host/proc") and k8s.agent.sys_root == Path("/host/sys")
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] and mounts["/host/sys"]["readOnly"]
    # It reads every GPU without allocating one away from the jobs.
    resources = pod["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in {**resources.get("limits", {}), **resources.get("requests", {})}


# --------------------------------------------------------------------------- the entry point


def test_entry_point_refuses_what_a_person_must_fix(tmp_path: Path) -> None:
    from gpufleet.agent.main import AgentError, build_agent, make_sources, resolve_node
    from gpufleet.config import Settings

    base = Settings(data_dir=tmp_path)
    with pytest.raises(AgentError, match="no node token"):
        build_agent(base)
    with pytest.raises(AgentError, match="not valid"):
        resolve_node(AgentSettings(node="bad node!"))
    with pytest.raises(AgentError, match="unknown source 'nope'"):
        make_sources(AgentSettings(sources=["host", "nope"]))
    with pytest.raises(AgentError, match="more than once"):
        make_sources(AgentSettings(sources=["host", "host"]))
    with pytest.raises(AgentError, match="no sources"):
        make_sources(AgentSettings(sources=[]))
    # Fake GPUs stand in for NVML, in its place in the list.
    srcs = make_sources(AgentSettings(sources=["host", "nvml"]), fake_nvml=3)
    assert [s.name for s in srcs] == ["host", "nvml"] and len(srcs[1].collect().gpus) == 3
    agent = build_agent(
        base.model_copy(update={"agent": AgentSettings(token="t", node="n-1", sources=["host"])})
    )
    assert agent.node == "n-1" and agent.spool.dir == tmp_path / "agent-spool"
