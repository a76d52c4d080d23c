"""tools/record_gpu_traces.py, rehearsed on fake NVML with a CPU stand-in for the GPU.

One short ``--dry-run`` drives the whole pipeline the real recording uses
(sampler threads on the agent's NVML and host sources, the injected event
schedule, bundles, labels, the golden NVML readings, the single archive);
the tests read what it left behind with the project's own readers.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import statistics
import subprocess
import sys
import tarfile
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpufleet.agent.sources.nvml_api import NvmlError
from gpufleet.collector.bundle import read_bundle
from gpufleet.facts import check_facts
from gpufleet.sim.labels import CAUSES, KINDS, Labels
from gpufleet.sim.nvml_fake import H200, FakeNvml

#: The recorder's dry run keeps a real schedule (loader waits, a save every second over a 3-second run):
#: its counts of waits and saves assume the cores are not shared with other test workers.
pytestmark = pytest.mark.serial

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "record_gpu_traces.py"
NAME = "dry"
GPUS = 2
INTERVALS = {"1s": 1.0, "100ms": 0.1}
SCENARIOS = ("healthy", "slow_loader", "checkpoint")
ARGS = [
    "--dry-run",
    "--name",
    NAME,
    "--seconds",
    "3",
    "--lead-in",
    "1",
    "--warmup",
    "0.3",
    "--loader-period",
    "1.2",
    "--loader-busy",
    "0.4",
    "--loader-workers",
    "2",
    "--ckpt-every",
    "1",
    "--dry-gpus",
    str(GPUS),
    "--node",
    "rehearsal-01",
]


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("out")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *ARGS], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    tree = tmp_path_factory.mktemp("tree")
    with tarfile.open(final["archive"]) as tar:
        tar.extractall(tree, filter="data")
    return {"out": out, "final": final, "root": tree / NAME, "stdout": proc.stdout}


def bundles(root: Path) -> list[tuple[str, str, Path]]:
    return [(s, lab, root / s / lab) for s in SCENARIOS for lab in INTERVALS]


def test_one_archive_is_all_that_is_left_in_out(recording: dict[str, Any]) -> None:
    out, final = recording["out"], recording["final"]
    assert final["ok"] is True and final["dry_run"] is True
    assert [p.name for p in out.iterdir()] == [f"{NAME}.tar.gz"]
    assert Path(final["archive"]).stat().st_size == final["archive_bytes"]
    assert final["intervals"] == ["1s", "100ms"]
    assert set(final["rows"]) == set(SCENARIOS)
    meta = json.loads((recording["root"] / "recording.json").read_text())
    assert meta["nvml"]["api"] == "FakeNvml" and meta["nvml"]["tolerated"] == {}
    assert meta["host_source"]["enabled"] is True
    assert set(meta["scenarios"]) == set(SCENARIOS)


def test_script_loads_nothing_the_recording_machine_lacks(recording: dict[str, Any]) -> None:
    modules = set(json.loads((recording["root"] / "recording.json").read_text())["modules"])
    missing_there = {
        "pydantic",
        "pydantic_settings",
        "msgpack",
        "orjson",
        "zstandard",
        "psycopg",
        "sqlalchemy",
        "fastapi",
        "httpx",
        "typer",
        "yaml",
    }
    assert not modules & missing_there
    assert "torch" not in modules and "pynvml" not in modules
    # The agent's own sources, under the one installed name.
    assert {"gpufleet", "numpy"} <= modules and "agent" not in modules


def test_every_bundle_reads_with_the_collectors_reader(recording: dict[str, Any]) -> None:
    rows = recording["final"]["rows"]
    for scenario, label, d in bundles(recording["root"]):
        b = read_bundle(d)
        assert b.gpu_rows == rows[scenario][label]["gpu"] > 0
        assert b.host_rows == rows[scenario][label]["host"] > 0
        assert [r["run_id"] for r in b.runs] == [f"realtrace-{scenario}"]
        assert b.allocations == [(f"realtrace-{scenario}", "rehearsal-01", 0)]
        facts = b.facts["rehearsal-01"]
        check_facts(facts)
        assert facts["hostname"] == "rehearsal-01"
        assert facts["gpu_count"] == GPUS and facts["gpus"][0]["name"] == H200.name
        with (d / "gpu.csv").open() as f:
            header = next(csv.reader(f))
        assert header[:4] == ["time", "node", "gpu", "uuid"]


def test_sample_spacing_is_the_interval_asked_for(recording: dict[str, Any]) -> None:
    for _scenario, label, d in bundles(recording["root"]):
        with (d / "gpu.csv").open() as f:
            times = sorted({ts(r["time"]) for r in csv.DictReader(f)})
        gaps = [b - a for a, b in pairwise(times)]
        assert len(gaps) >= 3
        want = INTERVALS[label]
        assert abs(statistics.median(gaps) - want) <= 0.2 * want, (d, statistics.median(gaps))


def test_labels_events_are_the_logged_events_inside_the_recorded_span(recording: dict[str, Any]) -> None:
    root = recording["root"]
    for scenario, _label, d in bundles(root):
        labels = Labels.load(d / "labels.json")
        assert labels.scenario == scenario
        b = read_bundle(d)
        assert abs(labels.start - b.t_min) < 0.002 and abs(labels.end - b.t_max) < 0.002
        logged = [json.loads(line) for line in (root / scenario / "events.jsonl").read_text().splitlines()]
        assert len(labels.events) == len(logged) > 0
        for kind in {e["type"] for e in logged}:
            mine = sorted((e for e in labels.events if e.type == kind), key=lambda e: e.start)
            theirs = sorted((e for e in logged if e["type"] == kind), key=lambda e: e["start"])
            assert len(mine) == len(theirs), kind
            for ev, lg in zip(mine, theirs, strict=True):
                assert ev.end is not None
                assert abs(ev.start - lg["start"]) <= 0.001 and abs(ev.end - lg["end"]) <= 0.001
                assert b.t_min <= ev.start <= ev.end <= b.t_max, (d, ev)
        spans = [(i.start, i.end) for i in labels.incidents] + [
            (h.start, h.end) for h in labels.hard_negatives
        ]
        for start, end in spans:
            assert end is not None and b.t_min <= start <= end <= b.t_max
        run = labels.runs[0]
        assert run["run_id"] == f"realtrace-{scenario}"
        assert b.runs[0]["start"] == pytest.approx(run["start"], abs=0.001)


def test_expected_findings_use_the_simulators_vocabulary(recording: dict[str, Any]) -> None:
    root = recording["root"]
    for scenario, _label, d in bundles(root):
        labels = Labels.load(d / "labels.json")
        for inc in labels.incidents:
            assert inc.kind in KINDS and inc.cause in CAUSES[inc.kind]
        kinds = [i.kind for i in labels.incidents]
        if scenario == "healthy":
            assert kinds == []
            assert labels.hard_negatives[0].reason == "healthy_training"
            continue
        assert labels.hard_negatives[0].reason == "healthy_lead_in"
        (inc,) = labels.incidents
        if scenario == "slow_loader":
            assert (inc.kind, inc.cause) == ("starvation", "cpu")
            waits = [e for e in labels.events if e.type == "loader_wait"]
            assert len(waits) == inc.evidence["cycles"] >= 2
            assert inc.start == pytest.approx(waits[0].start, abs=0.001)
            assert inc.evidence["period_s"] == pytest.approx(1.2, rel=0.25)
            assert 0.1 < inc.evidence["duty"] < 0.8
        else:
            assert (inc.kind, inc.cause) == ("checkpoint_stall", None)
            saves = [e for e in labels.events if e.type == "checkpoint_save"]
            assert len(saves) == len(inc.evidence["stalls"]) >= 2
            assert all(e.detail["bytes"] > 0 and e.detail["fsync"] for e in saves)
            # A save far under --ckpt-min-s grows the state (up to the cap) for the next one.
            (resize,) = [e for e in labels.events if e.type == "checkpoint_resize"]
            assert (
                resize.detail["after_bytes"] == 4 * resize.detail["before_bytes"] == saves[1].detail["bytes"]
            )
            assert [ts(a) for a, _ in inc.evidence["stalls"]] == pytest.approx(
                [e.start for e in saves], abs=0.001
            )


def test_golden_nvml_readings_hold_one_record_per_tick_per_gpu(recording: dict[str, Any]) -> None:
    for _scenario, _label, d in bundles(recording["root"]):
        records = [json.loads(line) for line in (d / "nvml_readings.jsonl").read_text().splitlines()]
        assert all("error" not in r for r in records)
        by_tick: dict[int, list[dict[str, Any]]] = {}
        for r in records:
            by_tick.setdefault(r["tick"], []).append(r)
        assert sorted(by_tick) == list(range(len(by_tick)))
        assert all(sorted(r["row"]["gpu"] for r in recs) == list(range(GPUS)) for recs in by_tick.values())
        with (d / "gpu.csv").open() as f:
            csv_rows = list(csv.DictReader(f))
        assert len(csv_rows) == len(records) == len(by_tick) * GPUS
        for rec, row in zip(records, csv_rows, strict=True):
            assert ts(row["time"]) == pytest.approx(rec["time"], abs=0.001)
            assert int(row["gpu"]) == rec["row"]["gpu"] and row["uuid"] == rec["row"]["uuid"]
            assert float(row["power_w"]) == pytest.approx(rec["row"]["power_w"], abs=1e-3)
            assert int(row["energy_mj"]) == rec["row"]["energy_mj"]


def test_fake_gpu_was_busy_while_training_and_idle_while_waiting(recording: dict[str, Any]) -> None:
    d = recording["root"] / "slow_loader" / "100ms"
    labels = Labels.load(d / "labels.json")
    records = [json.loads(line) for line in (d / "nvml_readings.jsonl").read_text().splitlines()]
    gpu0 = [(r["time"], r["row"]["util_pct"]) for r in records if r["row"]["gpu"] == 0]

    def utils(kind: str) -> list[int]:
        spans = [(e.start, e.end) for e in labels.events if e.type == kind]
        return [u for t, u in gpu0 for a, b in spans if b is not None and a + 0.05 < t < b - 0.05]

    assert utils("train_burst") and set(utils("train_burst")) == {H200.load_util_pct}
    assert utils("loader_wait") and set(utils("loader_wait")) == {0}
    assert {r["row"]["util_pct"] for r in records if r["row"]["gpu"] == 1} == {0}


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_gpu_traces", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = sys.modules.get(spec.name)
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


class FailingReadings(FakeNvml):
    """NVML that answers some readings with an error other than NOT_SUPPORTED."""

    def pcie_throughput_kb_s(self, handle: Any, direction: Any) -> int:
        raise NvmlError("nvml: nvmlDeviceGetPcieThroughput: Unknown Error")

    def wait_xid(self, event_set: Any, timeout_ms: int) -> Any:
        raise NvmlError("nvml: nvmlEventSetWait: Unknown Error")


def test_a_failing_reading_is_recorded_as_null_and_named() -> None:
    mod = load_script()
    with pytest.raises(NvmlError):
        mod.NvmlSource(FailingReadings([H200])).collect()
    setup = mod.nvml_preflight(lambda: FailingReadings([H200]), "FailingReadings")
    assert setup.tolerant is not None and setup.first_error
    assert set(setup.tolerant.tolerated) == {"pcie_throughput_kb_s", "wait_xid"}
    src = setup.source()
    row = src.collect().gpus[0]
    assert row["pcie_tx_bytes_s"] is None and row["pcie_rx_bytes_s"] is None and row["xid"] is None
    assert row["power_w"] == H200.idle_power_w and row["uuid"].startswith("GPU-")
    src.close()


def test_plain_nvml_is_used_when_it_reads() -> None:
    mod = load_script()
    setup = mod.nvml_preflight(lambda: FakeNvml([H200]), "FakeNvml")
    assert setup.tolerant is None and setup.first_error is None
    assert setup.source().collect().gpus[0]["xid"] == 0
