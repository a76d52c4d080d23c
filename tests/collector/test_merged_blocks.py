"""A group commit merges agents' numeric columns a matrix at a time, and stores the same rows as column by column."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest

from gpufleet.collector.batch_store import GPU_SPECS, copy_data, write_batches
from gpufleet.collector.copy_binary import concat_parts
from gpufleet.wire import Batch, Column, Columns, encode, parse, validate
from tests.collector.test_ingest import batch

Part = tuple[str, dict[str, Column], int]


def agent_batch(k: int, n: int = 16, typed: bool = True, **extra: list[Any]) -> Batch:
    """A batch as an agent sends it (typed arrays, msgpack), validated as the collector does."""
    doc = batch(f"b:{k}", node=f"node-{k}", n=n)
    doc["gpu"]["power_w"] = [float(k * 100 + i) for i in range(n)]
    doc["gpu"]["energy_mj"] = [k * 1_000_000 + i for i in range(n)]
    doc["gpu"].update(extra)
    body, _ = encode(doc, "msgpack", None, typed=typed)
    return validate(parse(body, "application/msgpack"))


def parts_of(batches: list[Batch]) -> list[Part]:
    return [(b.node, b.gpu, b.n_gpu) for b in batches]


def column_by_column(parts: list[Part]) -> list[Part]:
    """The same parts as plain dicts: no blocks, so every column is merged on its own."""
    return [(node, dict(cols), n) for node, cols, n in parts]


def same(a: dict[str, Column], b: dict[str, Column]) -> None:
    assert set(a) == set(b)
    for name in a:
        va, vb = a[name].values, b[name].values
        assert np.array_equal(np.asarray(va), np.asarray(vb)), name
        assert (a[name].null is None) == (b[name].null is None), name
        if a[name].null is not None:
            assert np.array_equal(a[name].null, b[name].null), name


def specs_for(parts: list[Part]) -> list[Any]:
    return copy_data(GPU_SPECS, parts)[0]


def test_validation_leaves_numeric_columns_as_rows_of_its_matrices() -> None:
    b = agent_batch(1)
    assert isinstance(b.gpu, Columns) and b.gpu.blocks
    for matrix, names in b.gpu.blocks:
        for row, name in enumerate(names):
            assert np.shares_memory(b.gpu[name].values, matrix)
            assert np.array_equal(b.gpu[name].values, matrix[row]), name
    blocked = {name for _, names in b.gpu.blocks for name in names}
    assert blocked == set(b.gpu) - {"uuid"}


def test_merged_by_matrix_equals_merged_by_column() -> None:
    parts = parts_of([agent_batch(k) for k in range(5)])
    specs = specs_for(parts)
    by_matrix, n = concat_parts(specs, parts)
    by_column, m = concat_parts(specs, column_by_column(parts))
    assert n == m == 5 * 16
    same(by_matrix, by_column)
    assert by_matrix["power_w"].values.tolist() == [float(k * 100 + i) for k in range(5) for i in range(16)]
    assert by_matrix["energy_mj"].values.tolist() == [k * 1_000_000 + i for k in range(5) for i in range(16)]


@pytest.mark.parametrize("change", ["set", "del", "pop", "update", "setdefault", "ior", "clear"])
def test_a_changed_section_is_merged_column_by_column(change: str) -> None:
    batches = [agent_batch(k) for k in range(3)]
    cols = batches[1].gpu
    assert isinstance(cols, Columns)
    replaced = Column(np.full(16, 7.0))
    if change == "set":
        cols["power_w"] = replaced
    elif change == "del":
        del cols["temp_c"]
    elif change == "pop":
        cols.pop("temp_c")
    elif change == "update":
        cols.update(power_w=replaced)
    elif change == "setdefault":
        cols.setdefault("sm_active", Column(np.zeros(16)))
    elif change == "ior":
        cols |= {"power_w": replaced}
    else:
        cols.clear()
        batches[1] = agent_batch(9)  # an emptied section is no batch: another takes its place
    assert batches[1].gpu is not cols or cols.blocks is None
    parts = parts_of(batches)
    specs = specs_for(parts)
    by_matrix, _ = concat_parts(specs, parts)
    by_column, _ = concat_parts(specs, column_by_column(parts))
    same(by_matrix, by_column)
    if change in ("set", "update", "ior"):
        assert by_matrix["power_w"].values[16:32].tolist() == [7.0] * 16


def test_parts_of_other_layouts_are_merged_column_by_column() -> None:
    """Parts whose matrices hold other columns (another field sent, a field sent as another
    integer width) share no layout with the rest; the merge takes them column by column."""
    parts = parts_of([agent_batch(0), agent_batch(1, sm_clock_mhz=[1980] * 16), agent_batch(2)])
    specs = specs_for(parts)
    by_matrix, _ = concat_parts(specs, parts)
    by_column, _ = concat_parts(specs, column_by_column(parts))
    same(by_matrix, by_column)
    assert by_matrix["sm_clock_mhz"].null is not None and by_matrix["sm_clock_mhz"].null.sum() == 32


def test_sections_built_otherwise_merge_beside_agents_sections() -> None:
    """Row-form and list-form batches (the slow path: plain dicts) merge with agents' ones."""
    parts = parts_of([agent_batch(0), agent_batch(1, typed=False), agent_batch(2)])
    assert not isinstance(parts[1][1], Columns)
    specs = specs_for(parts)
    by_matrix, _ = concat_parts(specs, parts)
    by_column, _ = concat_parts(specs, column_by_column(parts))
    same(by_matrix, by_column)


def test_agents_batches_are_stored_as_sent(db: str) -> None:
    batches = [agent_batch(k) for k in range(4)] + [agent_batch(4, typed=False)]
    with psycopg.connect(db) as conn, conn.transaction():
        write_batches(conn, batches)
    with psycopg.connect(db) as conn:
        got = conn.execute("SELECT node, gpu, power_w, energy_mj, temp_c FROM gpu_samples").fetchall()
    want = [
        (f"node-{k}", i % 8, float(k * 100 + i), k * 1_000_000 + i, 60) for k in range(5) for i in range(16)
    ]
    assert sorted(got) == sorted(want)
