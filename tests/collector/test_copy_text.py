"""Text columns of a group commit, packed for the binary COPY, and stored as sent."""

from __future__ import annotations

import psycopg
import pytest

from gpufleet.collector.batch_store import write_batches
from gpufleet.collector.copy_binary import _ascii_array
from gpufleet.wire import validate
from tests.collector.test_ingest import batch


@pytest.mark.parametrize(
    "values",
    [
        [f"GPU-{i % 8:08d}-aaaa-bbbb-cccc-{i // 8:012d}" for i in range(96)],  # one length: the joined bytes
        ["GPU-1", "GPU-22", None, "GPU-333", ""],  # mixed lengths and NULLs
        ["", "", ""],
        [None, None],
    ],
)
def test_packed_text_is_each_value_as_ascii_bytes(values: list[str | None]) -> None:
    packed = _ascii_array(values)
    assert packed is not None
    arr, lengths = packed
    assert [bytes(b) for b in arr] == [(v or "").encode() for v in values]
    assert lengths.tolist() == [len(v or "") for v in values]


def test_text_beyond_ascii_is_left_to_the_row_by_row_path() -> None:
    assert _ascii_array(["GPU-1", "GPU-é"]) is None


def test_uuids_of_one_length_are_stored_as_sent(db: str) -> None:
    docs = [batch(f"a:{k}", node=f"node-{k}", n=16) for k in range(3)]
    for k, doc in enumerate(docs):
        doc["gpu"]["uuid"] = [f"GPU-{k}{i % 8:07d}-0000-1111-2222-333344445555" for i in range(16)]
    with psycopg.connect(db) as conn, conn.transaction():
        write_batches(conn, [validate(d) for d in docs])
    with psycopg.connect(db) as conn:
        got = conn.execute("SELECT node, gpu, uuid FROM gpu_samples ORDER BY node, time, gpu").fetchall()
    want = sorted((f"node-{k}", i % 8, docs[k]["gpu"]["uuid"][i]) for k in range(3) for i in range(16))
    assert sorted(got) == want
