"""The one way bundles are written: cells the reader reads back as written, and a directory that is either
the whole new bundle or what was there before."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.collector.bundle import BundleError, read_bundle
from gpufleet.collector.bundle_files import (
    ALLOCATIONS_CSV,
    COLUMNS,
    GPU_CSV,
    NODES_JSON,
    REQUIRED,
    RUNS_CSV,
    BundleWriter,
    cell,
    epoch_s,
    number,
    occupied,
    rfc3339_ms,
    rfc3339_us,
    text,
)


def test_required_columns_are_among_the_written_ones() -> None:
    assert set(REQUIRED) == set(COLUMNS)
    for name, cols in REQUIRED.items():
        assert set(cols) <= set(COLUMNS[name]), name


def test_cells() -> None:
    assert [number(None), number(math.nan), number(math.inf), number(True)] == ["", "", "", "1"]
    assert [number(7), number(380.0), number(0.1), number(2.0**60)] == ["7", "380", "0.1", repr(2.0**60)]
    assert number(12.345678, 4) == "12.3457"
    assert [cell(None), cell(380.0), cell(3), cell(math.nan), cell("a,b")] == ["", "380.0", "3", "", '"a,b"']
    assert [text("plain"), text('say "hi"'), text("a\rb")] == ["plain", '"say ""hi"""', '"a\rb"']
    assert rfc3339_ms(1796119200.0) == "2026-12-01T10:00:00Z"
    assert rfc3339_ms(1796119200.0, always_ms=True) == "2026-12-01T10:00:00.000Z"
    assert rfc3339_ms(1796119200.0004) == "2026-12-01T10:00:00Z"
    assert epoch_s(1796119200.25) == "1796119200.25" and epoch_s(1796119200.0) == "1796119200"
    assert rfc3339_us(datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)) == "2026-12-01T10:00:00.123456Z"
    assert rfc3339_us(datetime(2026, 12, 1, 10, 0, 0, 123000, tzinfo=UTC)) == "2026-12-01T10:00:00.123Z"
    assert rfc3339_us(None) == ""


def write_small(out: Path, run_name: str = 'a, "quoted"\rname') -> None:
    with BundleWriter(out, check=read_bundle) as b:
        with b.open_csv(GPU_CSV, ["time", "node", "gpu", "power_w", "util_pct"]) as f:
            for k in range(3):
                f.write(f"{rfc3339_ms(1796119200.0 + k)},n1,0,{number(100.5 + k)},{number(None)}\n")
        b.write_csv(RUNS_CSV, [["r1", text(run_name), "", rfc3339_ms(1796119200.0), ""]])
        b.write_csv(ALLOCATIONS_CSV, [["r1", "n1", "0"]])
        b.write_json(NODES_JSON, {"n1": {"gpu_count": 1}})


def test_written_bundle_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "b"
    write_small(out)
    b = read_bundle(out)
    assert b.gpu_rows == 3 and b.allocations == [("r1", "n1", 0)] and b.facts == {"n1": {"gpu_count": 1}}
    # The reader drops the carriage return inside quotes; the row stays one row.
    assert b.runs[0]["name"] == 'a, "quoted"name'
    assert (out / RUNS_CSV).read_text().splitlines()[0] == ",".join(COLUMNS[RUNS_CSV])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["b"]


def test_a_failed_write_leaves_what_was_there(tmp_path: Path) -> None:
    out = tmp_path / "b"
    write_small(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError), BundleWriter(out) as b:
        b.write_text("gpu.csv", "half")
        raise RuntimeError("cut short")
    with pytest.raises(BundleError), BundleWriter(out, check=read_bundle) as b:
        b.write_text("gpu.csv", "time,node,gpu\n")  # no samples: refused by the reader
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["b"], "no temporary directory left behind"


def test_a_failed_first_write_removes_the_folders_it_made(tmp_path: Path) -> None:
    out = tmp_path / "x" / "y" / "b"
    with pytest.raises(RuntimeError), BundleWriter(out):
        raise RuntimeError("cut short")
    assert list(tmp_path.iterdir()) == []


def test_success_replaces_an_occupied_directory(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    assert not occupied(out)
    (out / "keep").write_text("x")
    assert occupied(out)
    write_small(out)
    assert sorted(p.name for p in out.iterdir()) == [ALLOCATIONS_CSV, GPU_CSV, NODES_JSON, RUNS_CSV]
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
