"""Trace bundles: the contract's files and columns, parseable values, labels, determinism."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS, canonical_gpu_name
from gpufleet.sim import Fleet, Labels, write_bundle
from gpufleet.sim.bundle import (
    ALLOCATIONS_CSV_COLUMNS,
    CARBON_CSV_COLUMNS,
    GPU_CSV_COLUMNS,
    HOST_CSV_COLUMNS,
    RUNS_CSV_COLUMNS,
    SITES_CSV_COLUMNS,
)
from gpufleet.sim.scenario import load_scenario, parse_scenario

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
FILES = ("gpu.csv", "host.csv", "runs.csv", "allocations.csv", "sites.csv", "carbon.csv", "labels.json")


def contract_columns() -> dict[str, list[str]]:
    """Column lists of section 1 of contracts.md, read from the document itself."""
    assert CONTRACTS.is_file(), f"{CONTRACTS} missing"
    text = CONTRACTS.read_text().split("## 2.")[0]
    out: dict[str, list[str]] = {}
    for name in ("gpu.csv", "host.csv"):
        block = text.split(f"`{name}`", 1)[1].split("\n\n", 2)[1]
        cols: list[str] = []
        for line in block.splitlines()[2:]:
            if not line.startswith("|"):
                break
            cols += [c.strip() for c in line.split("|")[1].split(",")]
        out[name] = cols
    for name in ("runs.csv", "allocations.csv", "sites.csv", "carbon.csv"):
        m = re.search(rf"`{re.escape(name)}`[^:]*: `([^`]+)`", text)
        assert m, name
        out[name] = [c.strip() for c in m.group(1).split(",")]
    return out


def parse_time(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        assert dt.tzinfo is not None, s
        return dt.timestamp()


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "demo"
    write_bundle("demo", out, duration_s=900)
    return out


def test_headers_are_exactly_the_contract_columns_in_order(demo_bundle: Path) -> None:
    want = contract_columns()
    assert list(GPU_CSV_COLUMNS) == want["gpu.csv"]
    assert list(HOST_CSV_COLUMNS) == want["host.csv"]
    for name, cols in (
        ("runs.csv", RUNS_CSV_COLUMNS),
        ("allocations.csv", ALLOCATIONS_CSV_COLUMNS),
        ("sites.csv", SITES_CSV_COLUMNS),
        ("carbon.csv", CARBON_CSV_COLUMNS),
    ):
        assert list(cols) == want[name], name
    for name in want:
        header, _ = read_csv(demo_bundle / name)
        assert header == want[name], name


def test_columns_follow_the_metric_catalog() -> None:
    gpu_catalog = [f.name for f in GPU_FIELDS if f.bundle and f.name not in ("mig_instance", "run_id")]
    # The catalog's ecc_dbe_vol keeps its contract name in bundles.
    assert [canonical_gpu_name(c) for c in GPU_CSV_COLUMNS[3:]] == gpu_catalog
    assert "ecc_dbe" in GPU_CSV_COLUMNS and "ecc_dbe_vol" not in GPU_CSV_COLUMNS
    assert list(HOST_CSV_COLUMNS[2:]) == [f.name for f in HOST_FIELDS if f.bundle]


def test_every_file_is_there_and_every_value_parses(demo_bundle: Path) -> None:
    for name in FILES:
        assert (demo_bundle / name).is_file(), name
    fleet = Fleet.from_scenario("demo")
    for name, key_cols in (("gpu.csv", 4), ("host.csv", 2)):
        header, rows = read_csv(demo_bundle / name)
        assert rows
        fields = {f.name: f for f in (GPU_FIELDS if name == "gpu.csv" else HOST_FIELDS)}
        last: dict[tuple[str, ...], float] = {}
        for row in rows:
            assert len(row) == len(header)
            t = parse_time(row[0])
            key = tuple(row[1:key_cols])
            assert t > last.get(key, -1.0), "times increase per series"
            last[key] = t
            for col, v in zip(header[key_cols:], row[key_cols:], strict=True):
                if v == "" and (col.startswith("nvlink_") or col.startswith("job_")):
                    continue  # NVLink readings of a board without NVLink; no job's cgroup feeds this GPU
                x = float(v)
                f = fields[canonical_gpu_name(col) if name == "gpu.csv" else col]
                assert (f.lo is None or x >= f.lo) and (f.hi is None or x <= f.hi), (col, x)
                if f.kind != "real":
                    assert x == int(x), (col, v)
    _, gpu_rows = read_csv(demo_bundle / "gpu.csv")
    assert {(r[1], int(r[2])) for r in gpu_rows} == {(g.node, g.gpu) for g in fleet.plan.gpus}
    assert {r[3] for r in gpu_rows} == {g.uuid for g in fleet.plan.gpus}


def test_runs_allocations_sites_and_carbon(demo_bundle: Path) -> None:
    fleet = Fleet.from_scenario("demo")
    _, runs = read_csv(demo_bundle / "runs.csv")
    by_id = {r[0]: r for r in runs}
    # demo-late starts after the 900 s written: not in the bundle.
    assert set(by_id) == {r.run_id for r in fleet.plan.runs if r.start <= fleet.t0 + 900}
    for r in runs:
        parse_time(r[3])
        assert r[4] == "", "all these runs are still going at the end of the trace"
    _, allocs = read_csv(demo_bundle / "allocations.csv")
    for run in fleet.plan.runs:
        if run.run_id in by_id:
            mine = {(a[1], int(a[2])) for a in allocs if a[0] == run.run_id}
            assert mine == {(fleet.plan.gpus[i].node, fleet.plan.gpus[i].gpu) for i in run.gpu_idx.tolist()}
    _, sites = read_csv(demo_bundle / "sites.csv")
    assert {s[0] for s in sites} == {"lab-a", "lab-b"}
    for s in sites:
        assert float(s[1]) >= 1 and float(s[2]) >= 0 and float(s[6]) >= 0
    _, carbon = read_csv(demo_bundle / "carbon.csv")
    for region in ("DE", "FR"):
        series = [(parse_time(c[1]), float(c[2])) for c in carbon if c[0] == region]
        assert len(series) >= 2
        assert all(b[0] - a[0] == 3600 for a, b in itertools.pairwise(series))
        assert series[0][0] <= fleet.t0 and len({v for _, v in series}) > 1


def test_labels_json_round_trips(demo_bundle: Path) -> None:
    raw = json.loads((demo_bundle / "labels.json").read_text())
    assert {"incidents", "hard_negatives", "events", "runs"} <= set(raw)
    for inc in raw["incidents"]:
        assert {"kind", "run_id", "node", "gpu", "cause", "start", "end"} <= set(inc)
        assert inc["start"].endswith("Z")
    lab = Labels.load(demo_bundle / "labels.json")
    assert lab.to_dict() == raw
    fleet = Fleet.from_scenario("demo")
    full = fleet.labels()
    fresh = full.clip(fleet.t0, fleet.t0 + 900).to_dict()
    assert json.loads(json.dumps(fresh)) == raw
    # Only what the 900 s written hold, cut to them.
    assert lab.end == fleet.t0 + 900 and all(i.end is not None and i.end <= lab.end for i in lab.incidents)
    assert len(lab.incidents) < len(full.incidents) or any(
        i.end != j.end for i, j in zip(lab.incidents, full.incidents, strict=False)
    )
    assert not [i for i in lab.incidents if i.start >= lab.end]
    (ckpt,) = lab.of_kind("checkpoint_stall")
    assert all(fleet.t0 <= parse_time(a) < fleet.t0 + 900 for a, _ in ckpt.evidence["stalls"])


def test_epoch_times(tmp_path: Path) -> None:
    write_bundle("healthy", tmp_path / "b", duration_s=30, time_format="epoch")
    _, rows = read_csv(tmp_path / "b" / "gpu.csv")
    fleet = Fleet.from_scenario("healthy")
    assert float(rows[0][0]) == fleet.t0
    assert float(rows[-1][0]) == fleet.t0 + 30


def test_same_seed_same_bytes_other_seed_other_fleet(tmp_path: Path) -> None:
    def digest(out: Path) -> str:
        h = hashlib.sha256()
        for name in FILES:
            h.update((out / name).read_bytes())
        return h.hexdigest()

    write_bundle("straggler_power_cap", tmp_path / "a", duration_s=700)
    write_bundle("straggler_power_cap", tmp_path / "b", duration_s=700)
    write_bundle("straggler_power_cap", tmp_path / "c", duration_s=700, seed=999)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    la = Labels.load(tmp_path / "a" / "labels.json")
    lc = Labels.load(tmp_path / "c" / "labels.json")
    assert la.of_kind("straggler")[0].evidence != lc.of_kind("straggler")[0].evidence


def test_refuses_to_overwrite_and_leaves_nothing_partial(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        write_bundle("healthy", out, duration_s=5)
    assert [p.name for p in out.iterdir()] == ["keep"]
    write_bundle("healthy", out, duration_s=5, overwrite=True)
    assert (out / "gpu.csv").exists() and not (out / "keep").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["b"], "no temporary directory left behind"


def test_gaps_leave_rows_out_and_counters_reset(tmp_path: Path) -> None:
    info = write_bundle("counters_and_gaps", tmp_path / "b")
    header, rows = read_csv(tmp_path / "b" / "gpu.csv")
    fleet = info.labels
    gap = next(e for e in fleet.events if e.type == "sample_gap")
    assert gap.end is not None
    t = np.array([parse_time(r[0]) for r in rows])
    node = np.array([r[1] for r in rows])
    assert not np.any((node == gap.node) & (t >= gap.start) & (t < gap.end))
    _, hosts = read_csv(tmp_path / "b" / "host.csv")
    assert not any(h[1] == gap.node and gap.start <= parse_time(h[0]) < gap.end for h in hosts)
    reset = next(e for e in fleet.events if e.type == "counter_reset")
    e_col = header.index("energy_mj")
    series = [float(r[e_col]) for r in rows if r[1] == reset.node and int(r[2]) == reset.gpu]
    assert sum(1 for a, b in itertools.pairwise(series) if b < a) == 1


def test_four_nodes_of_eight_gpus_for_an_hour_at_1hz_writes_every_sample(tmp_path: Path) -> None:
    """Every GPU's every second, with faults laid over the runs (how fast is bench/, not a test's)."""
    raw = load_scenario("healthy").model_dump()
    raw["faults"] = [
        {"kind": "checkpoint_stall", "run_id": "healthy-pretrain"},
        {"kind": "starvation_cpu", "run_id": "healthy-finetune", "start_s": 600},
    ]
    sc = parse_scenario(raw)
    info = write_bundle(sc, tmp_path / "b", duration_s=3600)
    assert info.gpu_rows == 32 * 3601


def test_sampling_interval_override(tmp_path: Path) -> None:
    info = write_bundle("healthy", tmp_path / "b", duration_s=60, sample_interval_s=0.5)
    assert info.gpu_rows == 32 * 121 and info.labels.sample_interval_s == 0.5
    _, rows = read_csv(tmp_path / "b" / "gpu.csv")
    assert rows[32][0].endswith(".500Z")
    with pytest.raises(ValueError, match="sample_interval_s"):
        write_bundle("healthy", tmp_path / "c", duration_s=60, sample_interval_s=0.05)
