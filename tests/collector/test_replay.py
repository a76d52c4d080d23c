"""`gpufleet replay` as contracts.md section 2 defines it: outputs, and malformed bundles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sim import write_bundle

CONTRACT_KEYS = [
    "run_id",
    "start",
    "end",
    "gpu_count",
    "gpu_hours",
    "gpu_kwh",
    "host_kwh",
    "it_kwh",
    "pue",
    "facility_kwh",
    "co2e_kg",
    "energy_cost",
    "compute_cost",
    "total_cost",
    "currency",
    "coverage",
]
FINDING_KEYS = {"kind", "run_id", "node", "gpu", "start", "end", "cause", "severity", "evidence"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    write_bundle("straggler_power_cap", out, duration_s=900)
    return out


def replay(bundle: Path, tmp: Path, pg_server: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUFLEET_DATABASE_URL=pg_server, GPUFLEET_DATA_DIR=str(tmp))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "replay",
            str(bundle),
            "--findings",
            str(tmp / "findings.jsonl"),
            "--accounting",
            str(tmp / "accounting.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_replay_writes_findings_and_accounting(bundle: Path, tmp_path: Path, pg_server: str) -> None:
    proc = replay(bundle, tmp_path, pg_server)
    assert proc.returncode == 0, proc.stderr
    findings = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    labels = json.loads((bundle / "labels.json").read_text())["incidents"]
    # contracts.md section 2: GPU-scoped kinds are one row per GPU with node and gpu set, also
    # where the incident groups a run's GPUs throttled for one reason
    assert {(f["kind"], f["node"], f["gpu"], f["cause"]) for f in findings} == {
        (i["kind"], i["node"], i["gpu"], i["cause"]) for i in labels
    }
    for f in findings:
        assert set(f) == FINDING_KEYS
        assert f["start"].endswith("Z")
        if f["kind"] in ("straggler", "throttling", "pcie_degraded"):
            assert isinstance(f["node"], str) and isinstance(f["gpu"], int), f
    accounting = json.loads((tmp_path / "accounting.json").read_text())
    runs = {line.split(",")[0] for line in (bundle / "runs.csv").read_text().splitlines()[1:]}
    assert {a["run_id"] for a in accounting} == runs
    for a in accounting:
        assert list(a)[: len(CONTRACT_KEYS)] == CONTRACT_KEYS
        assert a["coverage"] > 0.99 and a["gpu_kwh"] > 0 and a["co2e_kg"] > 0
        assert a["total_cost"] == pytest.approx(a["energy_cost"] + a["compute_cost"])
        # replay's incidents are priced as the live collector's: a straggler run loses GPU-time
        lost = a["lost_to_incidents"]
        assert 0 <= lost["gpu_hours"] <= a["gpu_hours"] and lost["total_cost"] <= a["total_cost"]
        assert lost["currency"] == a["currency"]


@pytest.mark.parametrize(
    "file,edit,expect",
    [
        (
            "gpu.csv",
            lambda t: t.replace("\n", "\nnot-a-time,h100-01,0,\n", 1),
            "gpu.csv: line 2, column 'time'",
        ),
        ("gpu.csv", lambda t: _set_field(t, 5, "power_w", "NaN"), "gpu.csv: line 5, column 'power_w'"),
        ("gpu.csv", lambda t: _set_field(t, 7, "util_pct", "250"), "gpu.csv: line 7, column 'util_pct'"),
        ("gpu.csv", lambda t: _set_field(t, 3, "temp_c", "hot"), "gpu.csv: line 3, column 'temp_c'"),
        ("allocations.csv", lambda t: t + "ghost-run,h100-01,0\n", "allocations.csv: line"),
        (
            "runs.csv",
            lambda t: t.replace("run_id", "id", 1),
            "runs.csv: line 1: missing required column(s) run_id",
        ),
    ],
)
def test_malformed_bundle_names_file_line_column_and_writes_nothing(
    bundle: Path, tmp_path: Path, pg_server: str, file: str, edit, expect: str
) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    (bad / file).write_text(edit((bad / file).read_text()))
    proc = replay(bad, tmp_path, pg_server)
    assert proc.returncode != 0
    assert expect in proc.stderr, proc.stderr
    assert not (tmp_path / "findings.jsonl").exists() and not (tmp_path / "accounting.json").exists()


def test_missing_gpu_csv(tmp_path: Path, pg_server: str) -> None:
    (tmp_path / "empty").mkdir()
    proc = replay(tmp_path / "empty", tmp_path, pg_server)
    assert proc.returncode != 0 and "gpu.csv is missing" in proc.stderr


def _set_field(text: str, line: int, column: str, value: str) -> str:
    lines = text.splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[line - 1].rstrip("\n").split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells) + "\n"
    return "".join(lines)


def test_replay_uses_the_detector_thresholds_of_its_config(
    bundle: Path, tmp_path: Path, pg_server: str
) -> None:
    """The same settings model as the live sweep: a threshold set in the
    file given with --config changes what replay finds."""
    strict = tmp_path / "strict.yaml"
    # No GPU can be busy this long inside a 180 s evaluation span: no straggler.
    strict.write_text("detect:\n  straggler_min_busy_s: 100000\n")
    env = dict(os.environ, GPUFLEET_DATABASE_URL=pg_server, GPUFLEET_DATA_DIR=str(tmp_path))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "replay",
            str(bundle),
            "--config",
            str(strict),
            "--findings",
            str(tmp_path / "f.jsonl"),
            "--accounting",
            str(tmp_path / "a.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    kinds = {json.loads(line)["kind"] for line in (tmp_path / "f.jsonl").read_text().splitlines()}
    labels = {i["kind"] for i in json.loads((bundle / "labels.json").read_text())["incidents"]}
    assert "straggler" in labels and "straggler" not in kinds

    bad = tmp_path / "bad.yaml"
    bad.write_text("detect:\n  straggler_z: -1\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "replay",
            str(bundle),
            "--config",
            str(bad),
            "--findings",
            str(tmp_path / "g.jsonl"),
            "--accounting",
            str(tmp_path / "b.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "detect.straggler_z" in proc.stderr
    assert not (tmp_path / "g.jsonl").exists()


def test_replay_incidents_feed_goodput_as_the_live_stores_do(tmp_path: Path, pg_server: str) -> None:
    from datetime import datetime

    from gpufleet.collector.replay import replay as run_replay
    from gpufleet.config import load_settings
    from gpufleet.db import migrate
    from gpufleet.db.scratch import scratch_database

    out = tmp_path / "starved"
    write_bundle("starvation_cpu", out, duration_s=1200)
    settings = load_settings(data_dir=tmp_path)
    with scratch_database(pg_server, "gpufleet_replay_goodput") as url:
        migrate.upgrade(url, settings)
        res = run_replay(url, out, settings)
    acc = {a["run_id"]: a for a in res.accounting}
    starved = [f for f in res.findings if f["kind"] == "starvation"]
    assert {f["run_id"] for f in starved} == {"cpu-starved"}
    # The GPU time the findings say was lost, computed here from FINDINGS.jsonl alone.
    run = acc["cpu-starved"]

    def t(s: str) -> float:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    from gpufleet.collector.bundle import read_bundle

    # An open run is accounted up to the end of the trace.
    lo, hi = t(run["start"]), t(run["end"]) if run["end"] else read_bundle(out).t_max
    lost_s = sum(
        max(0.0, min(t(f["end"]) if f["end"] else hi, hi) - max(t(f["start"]), lo))
        * f["evidence"]["gpu_time_lost_share"]
        * run["gpu_count"]
        for f in starved
    )
    eff = run["efficiency"]
    assert lost_s > 0 and eff["lost_gpu_hours"] == pytest.approx(lost_s / 3600, rel=1e-6)
    assert (
        eff["goodput"] == pytest.approx(1 - lost_s / (run["gpu_count"] * (hi - lo)), rel=1e-6)
        and eff["goodput"] < 1
    )
    assert (
        acc["cpu-control"]["efficiency"]["lost_gpu_hours"] == 0
        and acc["cpu-control"]["efficiency"]["goodput"] == 1
    )
