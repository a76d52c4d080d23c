"""A degraded bundle is written as every bundle is (bundle_files): whole or not at all, cells the reader reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpufleet.collector.bundle import read_bundle
from gpufleet.collector.bundle_files import COLUMNS, GPU_CSV
from gpufleet.sim import write_bundle
from gpufleet.sim.degrade import DCGM_DROPPED, NVSMI_COLUMNS, degrade_bundle


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "bundle"
    write_bundle("starvation_cpu_quota", out, duration_s=300)
    return out


@pytest.fixture
def bundle(simulated: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(simulated, out)
    return out


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_the_forms_name_gpu_csv_columns() -> None:
    """A column renamed in the contract would otherwise be cut from every degraded bundle unnoticed."""
    assert set(NVSMI_COLUMNS) | set(DCGM_DROPPED) <= set(COLUMNS[GPU_CSV])


def test_a_failed_degrade_leaves_the_bundle_as_it_was(bundle: Path) -> None:
    (bundle / "gpu.csv").write_text("")
    before = files(bundle)
    with pytest.raises(ValueError, match="no header row"):
        degrade_bundle(bundle, "bare")
    assert files(bundle) == before
    assert [p.name for p in bundle.parent.iterdir()] == ["bundle"]


def test_files_no_form_concerns_are_kept_as_they_were(bundle: Path) -> None:
    (bundle / "notes.txt").write_text("kept\n")
    runs = (bundle / "runs.csv").read_bytes()
    degrade_bundle(bundle, "bare")
    assert (bundle / "notes.txt").read_text() == "kept\n"
    assert (bundle / "runs.csv").read_bytes() == runs
    assert not (bundle / "host.csv").exists() and not (bundle / "nodes.json").exists()
    assert json.loads((bundle / "labels.json").read_text())["degrade"] == "bare"
    assert [p.name for p in bundle.parent.iterdir()] == ["bundle"]


def test_a_quoted_carriage_return_stays_quoted(bundle: Path) -> None:
    """Unquoted, the reader (which splits lines first) would take it for the end of the row."""
    lines = (bundle / "gpu.csv").read_bytes().split(b"\n")
    cells = lines[1].split(b",")
    cells[1] = b'"n\r1"'
    lines[1] = b",".join(cells)
    (bundle / "gpu.csv").write_bytes(b"\n".join(lines))
    rows = read_bundle(bundle).gpu_rows
    degrade_bundle(bundle, "nvsmi")
    assert b'"n\r1"' in (bundle / "gpu.csv").read_bytes()
    assert read_bundle(bundle).gpu_rows == rows


def test_a_link_to_a_bundle_still_leads_to_it(bundle: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(bundle)
    degrade_bundle(link, "nohost")
    assert link.is_symlink()
    assert not (bundle / "host.csv").exists()
