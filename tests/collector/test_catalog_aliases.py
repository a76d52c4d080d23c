"""The volatile double-bit ECC counter keeps its contract name: ``ecc_dbe`` in bundles and on
the wire is the catalog's ``ecc_dbe_vol``, stored in that column; both at once is refused."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from gpufleet.catalog import GPU_ALIASES, GPU_BY_NAME, GPU_CSV_COLUMNS, canonical_gpu_name, validate_catalog
from gpufleet.collector.bundle import BundleError, read_bundle
from gpufleet.collector.replay import load
from gpufleet.wire import WireError, validate


def _doc(gpu: object) -> dict[str, object]:
    return {"batch_id": "n1:1", "node": "n1", "gpu": gpu}


def test_catalog_aliases_are_consistent() -> None:
    validate_catalog()
    assert GPU_ALIASES == {"ecc_dbe": "ecc_dbe_vol"}
    assert canonical_gpu_name("ecc_dbe") == "ecc_dbe_vol" and canonical_gpu_name("power_w") == "power_w"
    assert "ecc_dbe" not in GPU_BY_NAME and "ecc_dbe" in GPU_CSV_COLUMNS


@pytest.mark.parametrize("form", ["columns", "rows"])
def test_old_name_on_the_wire_lands_in_the_new_column(form: str) -> None:
    if form == "columns":
        gpu: object = {"time": [1.7e9, 1.7e9 + 1], "gpu": [0, 0], "ecc_dbe": [0, 2], "ecc_sbe_vol": [5, 9]}
    else:
        gpu = [{"time": 1.7e9, "gpu": 0, "ecc_dbe": 0}, {"time": 1.7e9 + 1, "gpu": 0, "ecc_dbe": 2}]
    batch = validate(_doc(gpu))
    assert "ecc_dbe" not in batch.gpu
    assert batch.gpu["ecc_dbe_vol"].values.tolist() == [0, 2]


def test_both_names_at_once_are_refused_with_the_field_named() -> None:
    with pytest.raises(WireError) as info:
        validate(_doc({"time": [1.7e9], "gpu": [0], "ecc_dbe": [0], "ecc_dbe_vol": [0]}))
    assert info.value.loc == ("gpu", "ecc_dbe") and "ecc_dbe_vol" in info.value.msg


def test_health_fields_are_bounded_like_every_catalog_field() -> None:
    with pytest.raises(WireError) as info:
        validate(_doc({"time": [1.7e9], "gpu": [0], "remapped_rows_pending": [2]}))
    assert info.value.loc[-1] == "remapped_rows_pending"
    with pytest.raises(WireError):
        validate(_doc({"time": [1.7e9], "gpu": [0], "nvlink_crc_errors": [-1]}))


def _bundle(d: Path, header: str, rows: list[str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "gpu.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return d


def test_bundle_reads_either_name_and_stores_ecc_dbe_vol(tmp_path: Path, conn: psycopg.Connection) -> None:
    old = read_bundle(
        _bundle(
            tmp_path / "old",
            "time,node,gpu,ecc_dbe,nvlink_links_up",
            ["1767225600,n1,0,3,18", "1767225601,n1,0,4,17"],
        )
    )
    new = read_bundle(_bundle(tmp_path / "new", "time,node,gpu,ecc_dbe_vol", ["1767225600,n2,0,7"]))
    assert old.batches[0].gpu["ecc_dbe_vol"].values.tolist() == [3, 4]
    assert new.batches[0].gpu["ecc_dbe_vol"].values.tolist() == [7]
    load(conn, old)
    load(conn, new)
    got = conn.execute(
        "SELECT node, ecc_dbe_vol, nvlink_links_up FROM gpu_samples ORDER BY node, time"
    ).fetchall()
    assert got == [("n1", 3, 18), ("n1", 4, 17), ("n2", 7, None)]


def test_bundle_with_both_names_is_refused(tmp_path: Path) -> None:
    d = _bundle(tmp_path / "b", "time,node,gpu,ecc_dbe,ecc_dbe_vol", ["1767225600,n1,0,3,3"])
    with pytest.raises(BundleError, match=r"gpu.csv: line 1: columns 'ecc_dbe' and 'ecc_dbe_vol'"):
        read_bundle(d)
