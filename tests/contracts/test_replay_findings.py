"""docs/contracts.md section 2: what ``gpufleet replay`` writes, FINDINGS.jsonl and ACCOUNTING.json, pinned field
by field over replays of labelled scenarios that raise every documented kind."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import waste
from gpufleet.accounting import CONTRACT_FIELDS
from gpufleet.collector.replay import findings_jsonl, replay
from gpufleet.config import Settings
from gpufleet.sim import write_bundle
from tests.conftest import truncate_all
from tests.contracts import docs

KEYS = ("kind", "run_id", "node", "gpu", "start", "end", "cause", "severity", "evidence")
RUN_SCOPED = ("starvation", "checkpoint_stall", "idle_allocation", "hung_collective")
GPU_SCOPED = ("straggler", "throttling", "pcie_degraded")
CAUSES = {
    "starvation": {"cpu", "io", "unknown"},
    "throttling": {"power_cap", "thermal", "hw_slowdown", "power_brake"},
    "straggler": {"power_cap", "thermal", "pcie_degraded", "clocks", "unknown", "network"},
}
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
#: Scenarios (and how long each must run) whose labels hold every documented kind between them.
SCENARIOS = {
    "straggler_power_cap": 900,
    "thermal_throttling": 900,
    "starvation_io": 900,
    "checkpoint_stalls": 900,
    "straggler_pcie": 900,
    "idle_and_hung": 1800,
}


@pytest.fixture(scope="module")
def replays(
    tmp_path_factory: pytest.TempPathFactory, db_url: str, settings: Settings
) -> Iterator[dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]]:
    out = {}
    for name, duration_s in SCENARIOS.items():
        truncate_all(db_url)
        bundle = tmp_path_factory.mktemp(name) / "b"
        write_bundle(name, bundle, duration_s=duration_s)
        result = replay(db_url, bundle, settings)
        # what the command writes: FINDINGS.jsonl lines and the ACCOUNTING.json list, read back
        findings = [json.loads(line) for line in findings_jsonl(result.findings).splitlines()]
        accounting = json.loads(json.dumps(result.accounting, default=str))
        out[name] = (findings, accounting)
    yield out
    truncate_all(db_url)


def test_the_published_keys_and_kinds_are_the_tests() -> None:
    text = docs.section("2. Replay command")
    assert re.findall(
        r'"(\w+)"', text.split("FINDINGS.jsonl: one JSON object per incident:")[1].split("\n- ")[0]
    )[: len(KEYS)] == list(KEYS)
    flat = " ".join(text.split())
    assert "run-scoped kinds (" + ", ".join(f"`{k}`" for k in RUN_SCOPED) + ")" in flat
    assert "GPU-scoped kinds (" + ", ".join(f"`{k}`" for k in GPU_SCOPED) + ") set `node` and `gpu`" in flat


def test_the_published_causes_and_explanation_order_are_the_codes() -> None:
    """A straggler's causes as documented (the original five, then the added ``network``), and the
    order in which one kind explains a lost second is the one gpufleet.waste applies."""
    flat = " ".join(docs.section("2. Replay command").split())
    causes = re.search(r"the most likely cause \((.*?)\)", flat)
    assert causes is not None
    assert set(re.findall(r"`(\w+)`", causes.group(1))) == CAUSES["straggler"]
    order = re.search(r"ranks first is reported there \((.*?)\)", flat)
    assert order is not None
    kinds = re.findall(r"`(\w+)`", order.group(1))
    assert sorted(kinds, key=lambda k: waste.rank(k) if waste.rank(k) is not None else 99) == kinds
    assert [waste.state_of(k) for k in kinds] == list(waste.PRECEDENCE)


def test_every_finding_has_the_documented_shape(replays: dict[str, Any]) -> None:
    seen: set[str] = set()
    for name, (findings, _) in replays.items():
        assert findings, name
        for f in findings:
            assert tuple(f) == KEYS, (name, f)
            assert isinstance(f["kind"], str) and f["kind"]
            assert f["run_id"] is None or isinstance(f["run_id"], str)
            assert f["node"] is None or isinstance(f["node"], str)
            assert f["gpu"] is None or (isinstance(f["gpu"], int) and not isinstance(f["gpu"], bool))
            assert RFC3339_UTC.fullmatch(f["start"]), f["start"]
            assert f["end"] is None or (RFC3339_UTC.fullmatch(f["end"]) and f["end"] >= f["start"])
            assert f["severity"] in ("warning", "critical"), f
            assert isinstance(f["evidence"], dict) and f["evidence"]
            if f["kind"] in CAUSES:
                assert f["cause"] in CAUSES[f["kind"]], f
            seen.add(f["kind"])
    assert set(RUN_SCOPED) | set(GPU_SCOPED) <= seen, sorted(seen)


def test_run_scoped_kinds_set_the_run(replays: dict[str, Any]) -> None:
    for findings, _ in replays.values():
        for f in findings:
            if f["kind"] in RUN_SCOPED:
                assert isinstance(f["run_id"], str), f
                # the whole run: node and gpu null; one node or GPU named when only it is affected
                assert f["gpu"] is None or f["node"] is not None, f


def test_gpu_scoped_kinds_set_node_and_gpu(replays: dict[str, Any]) -> None:
    """A GPU-scoped finding names its GPU, also where the incident groups a run's GPUs (throttling)."""
    for findings, _ in replays.values():
        for f in findings:
            if f["kind"] in GPU_SCOPED:
                assert isinstance(f["node"], str) and isinstance(f["gpu"], int), f


def test_accounting_json_is_a_list_of_accounting_bodies(replays: dict[str, Any], tmp_path: Path) -> None:
    for name, (_, accounting) in replays.items():
        assert isinstance(accounting, list) and accounting, name
        for body in accounting:
            assert list(body)[: len(CONTRACT_FIELDS)] == list(CONTRACT_FIELDS), name
            assert body["total_cost"] == pytest.approx(body["energy_cost"] + body["compute_cost"], rel=1e-12)
            assert 0.0 <= body["coverage"] <= 1.0 and body["gpu_hours"] > 0
