"""Ingest refusals added by issue 11: per-node de-duplication, batch ids with
a trailing newline, float4 overflow, and parse bounds (object count and
length) that hold whatever the body's byte size."""

from __future__ import annotations

import struct
import time

import httpx
import msgpack
import orjson
import psycopg
import pytest
import zstandard

from gpufleet.catalog import GPU_BY_NAME
from gpufleet.wire import JSON, MSGPACK, ParseLimits, WireError, encode, parse, validate
from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, count, post


def test_another_nodes_batch_id_does_not_make_this_nodes_batch_a_duplicate(collector: Collector) -> None:
    # node-b (or a cloned agent) sends node-a's next batch id first.
    r = post(collector, batch("victim-agent:42", node="node-b"), who="node-b")
    assert r.status_code == 200 and r.json()["status"] == "stored"
    r = post(collector, batch("victim-agent:42", node="node-a"), who="node-a")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stored"
    with psycopg.connect(collector.db) as c:
        assert c.execute("SELECT node, count(*) FROM gpu_samples GROUP BY node ORDER BY node").fetchall() == [
            ("node-a", 8),
            ("node-b", 8),
        ]
    # A retry by the same node is still a duplicate.
    r = post(collector, batch("victim-agent:42", node="node-a"), who="node-a")
    assert r.json()["status"] == "duplicate"
    assert count(collector.db) == 16


def test_same_id_from_two_nodes_in_one_group(collector: Collector) -> None:
    import threading

    codes: dict[str, dict] = {}

    def send(node: str) -> None:
        codes[node] = post(collector, batch("clone:1", node=node), who=node).json()

    threads = [threading.Thread(target=send, args=(n,)) for n in ("node-a", "node-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert {n: c["status"] for n, c in codes.items()} == {"node-a": "stored", "node-b": "stored"}
    assert count(collector.db) == 16


@pytest.mark.parametrize("bad_id", ["nl-id\n", "nl-id\r\n", "x" * 129, ""])
def test_batch_id_must_match_whole(collector: Collector, bad_id: str) -> None:
    r = post(collector, batch(bad_id), fmt="json", comp=None)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["batch_id"]
    assert count(collector.db, "ingest_batches") == 0


def test_node_name_with_trailing_newline_is_refused() -> None:
    with pytest.raises(WireError) as e:
        validate({"batch_id": "a:1", "node": "node-a\n"})
    assert e.value.loc == ("node",)


@pytest.mark.parametrize("fmt,typed", [("json", False), ("msgpack", False), ("msgpack", True)])
def test_float4_overflow_is_refused_like_infinity(collector: Collector, fmt: str, typed: bool) -> None:
    assert GPU_BY_NAME["mem_used_mib"].kind == "real" and GPU_BY_NAME["mem_used_mib"].hi is None
    doc = batch()
    doc["gpu"]["mem_used_mib"] = [1.0] * 8
    doc["gpu"]["mem_used_mib"][5] = 1e300
    if typed:  # as an f8 typed array (an f4 one cannot hold 1e300)
        body, headers = encode(doc, "msgpack", None, typed=False)
        d = msgpack.unpackb(body)
        d["gpu"]["mem_used_mib"] = {"dtype": "f8", "data": struct.pack("<8d", *doc["gpu"]["mem_used_mib"])}
        r = httpx.post(
            collector.url + "/v1/ingest",
            content=msgpack.packb(d),
            headers={**headers, **collector.headers()},
            timeout=10,
        )
    else:
        r = post(collector, doc, fmt=fmt, comp=None, typed=False)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["gpu", 5, "mem_used_mib"]
    assert count(collector.db) == 0


def test_largest_finite_float4_is_still_accepted(collector: Collector) -> None:
    doc = batch()
    doc["gpu"]["mem_used_mib"] = [3.0e38] * 8
    r = post(collector, doc, fmt="json", comp=None)
    assert r.status_code == 200, r.text
    with psycopg.connect(collector.db) as c:
        assert c.execute("SELECT count(*) FROM gpu_samples WHERE mem_used_mib = 'Infinity'").fetchone() == (
            0,
        )


# -- parse bounds ------------------------------------------------------------------------


def _empty_maps(n: int) -> bytes:
    return b"\xdd" + struct.pack(">I", n) + b"\x80" * n


@pytest.mark.parametrize(
    "raw,ctype",
    [
        (_empty_maps(33_000_000), MSGPACK),  # one array of 33 M empty maps
        # 5,000 arrays of 6,600 empty maps: every array is short, together they are 33 M objects
        (
            b"\xdd" + struct.pack(">I", 5000) + (b"\xdc" + struct.pack(">H", 6600) + b"\x80" * 6600) * 5000,
            MSGPACK,
        ),
        (b"[" + b"{}," * 2_000_000 + b"{}]", JSON),
        (b"[" + b"0," * 4_000_000 + b"0]", JSON),
    ],
)
def test_object_bombs_are_refused_before_they_are_built(raw: bytes, ctype: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(WireError) as e:
        parse(raw, ctype, ParseLimits.for_samples(50_000))
    assert e.value.kind == "too_large"
    assert time.perf_counter() - t0 < 5


def test_the_largest_legal_batch_fits_the_parse_bounds() -> None:
    # max_samples samples in row form with every GPU field: the most structure a legal batch has.
    n = 2_000
    row = {name: None for name in GPU_BY_NAME} | {"time": time.time(), "gpu": 0}
    doc = {
        "batch_id": "a:1",
        "node": "n",
        "gpu": [dict(row) for _ in range(n)],
        "facts": {"gpus": [{"gpu": i, "name": "H100"} for i in range(8)]},
    }
    limits = ParseLimits.for_samples(n)
    for fmt in ("json", "msgpack"):
        body, headers = encode(doc, fmt, None, typed=False)
        assert len(parse(body, headers["Content-Type"], limits)["gpu"]) == n
    # one sample more than a batch may hold is refused while parsing
    doc["gpu"].append(dict(row))
    doc["gpu"].append(dict(row))
    body, headers = encode(doc, "msgpack", None, typed=False)
    with pytest.raises(WireError) as e:
        parse(body, headers["Content-Type"], limits)
    assert e.value.kind == "too_large"


def test_zstd_object_bomb_answers_413(collector: Collector) -> None:
    body = zstandard.ZstdCompressor(level=19).compress(_empty_maps(3_900_000))
    assert len(body) < 2_000
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={"Content-Type": MSGPACK, "Content-Encoding": "zstd", **collector.headers()},
        timeout=30,
    )
    assert r.status_code == 413, r.text
    assert post(collector, batch("a:after")).status_code == 200


def test_deeply_nested_agent_block_is_refused(collector: Collector) -> None:
    body = b'{"batch_id":"a:1","node":"node-a","agent":{"x":' + b"[" * 500 + b"]" * 500 + b"}}"
    assert orjson.loads(body)
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={"Content-Type": JSON, **collector.headers()},
        timeout=10,
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["agent", "x"]


@pytest.mark.parametrize(
    "raw,ctype",
    [
        (b"[" * 5000 + b"]" * 5000, JSON),
        (b"\x91" * 5000 + b"\x90", MSGPACK),
        (b"\x81\xa1x" * 5000 + b"\x80", MSGPACK),
    ],
)
def test_nesting_beyond_the_parsers_stack_is_400_and_ingest_goes_on(
    collector: Collector, raw: bytes, ctype: str
) -> None:
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=raw,
        headers={"Content-Type": ctype, **collector.headers()},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    assert post(collector, batch("a:after")).status_code == 200
