"""Ingest over real HTTP into a real database: the happy path and every refusal."""

from __future__ import annotations

import gzip
import logging
import math
import socket
import time

import httpx
import msgpack
import orjson
import psycopg
import pytest
import zstandard

from gpufleet.wire import encode
from tests.collector.conftest import Collector
from tests.scrape import sample_value


def batch(batch_id: str = "a:1", node: str = "node-a", n: int = 8, t0: float | None = None) -> dict:
    t0 = time.time() - 10 if t0 is None else t0
    return {
        "batch_id": batch_id,
        "node": node,
        "gpu": {
            "time": [t0 + i // 8 for i in range(n)],
            "gpu": [i % 8 for i in range(n)],
            "util_pct": [90.0] * n,
            "power_w": [500.5] * n,
            "energy_mj": [1_000_000 + i for i in range(n)],
            "temp_c": [60] * n,
            "uuid": [f"GPU-{i % 8}" for i in range(n)],
        },
        "host": {"time": [t0], "cpu_user_pct": [20.0], "cpu_count": [64]},
    }


def count(db: str, table: str = "gpu_samples") -> int:
    with psycopg.connect(db) as c:
        return c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]


def post(
    c: Collector,
    doc: dict,
    who: str = "node-a",
    fmt: str = "msgpack",
    comp: str | None = "zstd",
    typed: bool = True,
) -> httpx.Response:
    body, headers = encode(doc, fmt, comp, typed=typed)
    return httpx.post(c.url + "/v1/ingest", content=body, headers={**headers, **c.headers(who)}, timeout=10)


@pytest.mark.parametrize(
    "fmt,comp", [("json", None), ("json", "gzip"), ("msgpack", "zstd"), ("msgpack", None)]
)
def test_stored_after_commit(collector: Collector, fmt: str, comp: str | None) -> None:
    r = post(collector, batch(), fmt=fmt, comp=comp)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stored"
    assert count(collector.db) == 8
    assert count(collector.db, "host_samples") == 1
    with psycopg.connect(collector.db) as c:
        row = c.execute(
            "SELECT power_w, energy_mj, temp_c, uuid, sm_active FROM gpu_samples WHERE gpu = 3"
        ).fetchone()
        assert row == (500.5, 1_000_003, 60, "GPU-3", None)
        assert c.execute("SELECT node, gpu_count FROM nodes").fetchall() == [("node-a", 8)]
        assert c.execute("SELECT count(*) FROM rollup_queue").fetchone()[0] == 1  # type: ignore[index]


def test_retry_is_acknowledged_not_stored_twice(collector: Collector) -> None:
    for _ in range(3):
        r = post(collector, batch("a:42"))
        assert r.status_code == 200
    assert r.json()["status"] == "duplicate"
    assert count(collector.db) == 8


def test_rows_format_accepted(collector: Collector) -> None:
    t = time.time()
    doc = {
        "batch_id": "a:rows",
        "node": "node-a",
        "gpu": [{"time": t, "gpu": 0, "power_w": 100}, {"time": t, "gpu": 1, "util_pct": 5}],
    }
    r = post(collector, doc, fmt="json", comp=None)
    assert r.status_code == 200, r.text
    assert count(collector.db) == 2


def test_nan_names_index_and_field_and_writes_nothing(collector: Collector) -> None:
    doc = batch(n=500 * 8 // 8)
    doc["gpu"]["power_w"][317] = math.nan
    r = post(collector, doc, fmt="msgpack")
    assert r.status_code == 422
    msg = r.json()["detail"][0]
    assert msg["loc"] == ["gpu", 317, "power_w"]
    assert "sample 317" in msg["msg"] and "power_w" in msg["msg"]
    assert count(collector.db) == 0
    assert count(collector.db, "ingest_batches") == 0


@pytest.mark.parametrize(
    "mutate,loc",
    [
        (lambda d: d["gpu"].__setitem__("time", ["2026-12-01T10:00:00Z"] * 8), ["gpu", 0, "time"]),
        (lambda d: d["gpu"].__setitem__("bogus", [1] * 8), ["gpu", "bogus"]),
        (lambda d: d["gpu"]["util_pct"].__setitem__(5, "high"), ["gpu", 5, "util_pct"]),
        (lambda d: d["gpu"]["util_pct"].__setitem__(6, 101.0), ["gpu", 6, "util_pct"]),
        (lambda d: d["gpu"]["temp_c"].__setitem__(2, 60.5), ["gpu", 2, "temp_c"]),
        (lambda d: d["gpu"]["gpu"].__setitem__(1, None), ["gpu", 1, "gpu"]),
        (lambda d: d["gpu"]["power_w"].pop(), ["gpu", "power_w"]),
        (lambda d: d.pop("node"), ["node"]),
        (lambda d: d.__setitem__("extra", 1), ["extra"]),
        (lambda d: d.__setitem__("batch_id", "has space"), ["batch_id"]),
    ],
)
def test_malformed_batches_name_the_spot(collector: Collector, mutate, loc) -> None:  # type: ignore[no-untyped-def]
    doc = batch()
    mutate(doc)
    r = post(collector, doc, fmt="json", comp=None)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    assert count(collector.db) == 0


def test_unparseable_body_is_400(collector: Collector) -> None:
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=b"{not json",
        headers={"Content-Type": "application/json", **collector.headers()},
    )
    assert r.status_code == 400
    assert "JSON" in r.json()["detail"][0]["msg"]


GONE = "gpufleet_ingest_client_gone_total"


def gone_answers(c: Collector) -> float:
    """Requests recorded with the status of a client that left (499)."""
    return sample_value(c.url, "gpufleet_ingest_requests_total", code="499")


def leave_mid_body(c: Collector, who: str, batch_id: str) -> None:
    """Send a shipment's headers and part of its body, then close the connection."""
    body, headers = encode(batch(batch_id, node=who), "msgpack", "zstd")
    head = {**headers, **c.headers(who), "Content-Length": str(len(body) + 5000)}
    host, port = c.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/ingest HTTP/1.1\r\nHost: collector\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode()
            + b"\r\n"
            + body
        )
        time.sleep(0.2)  # the collector is reading the body when the node goes


def wait_for(c: Collector, name: str, value: float) -> float:
    deadline = time.monotonic() + 10
    while (got := sample_value(c.url, name)) < value and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_a_node_that_leaves_mid_upload_is_counted_not_logged_as_a_crash(collector: Collector) -> None:
    """A node restarted or cut off while sending its body (here its first shipment, which the app
    reads): nothing is stored, the collector counts it (not as a refusal) and logs no traceback, and
    the node's next shipment is stored as usual."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(handler)
    try:
        leave_mid_body(collector, "node-b", "b:gone")
        assert wait_for(collector, GONE, 1) == 1
        assert gone_answers(collector) == 1
        assert post(collector, batch("b:next", node="node-b"), who="node-b").status_code == 200
    finally:
        uvicorn_log.removeHandler(handler)
    assert count(collector.db) == 8
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
    assert sample_value(collector.url, "gpufleet_ingest_errors_total") == 0  # not a refused batch


def test_authentication(collector: Collector) -> None:
    body = orjson.dumps(batch())
    for headers in (
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer gpf_not-a-real-token"},
    ):
        r = httpx.post(
            collector.url + "/v1/ingest",
            content=body,
            headers={"Content-Type": "application/json", **headers},
        )
        assert r.status_code == 401
        assert "gpf_not-a-real-token" not in r.text
    assert count(collector.db) == 0


def test_revoked_token_is_refused(collector: Collector) -> None:
    from gpufleet.auth import revoke_token

    assert post(collector, batch("a:1")).status_code == 200
    with psycopg.connect(collector.db, autocommit=True) as c:
        assert revoke_token(c, "node-a")
    # the token cache honours a revocation within its TTL (5 s)
    deadline = time.time() + 8
    status = 200
    while time.time() < deadline and status != 401:
        status = post(collector, batch(f"a:{time.time()}")).status_code
        time.sleep(0.5)
    assert status == 401


def test_node_token_writes_only_its_node(collector: Collector) -> None:
    r = post(collector, batch("b:1", node="node-b"), who="node-a")
    assert r.status_code == 403
    doc = batch("a:9")
    doc["gpu"]["node"] = ["node-a"] * 7 + ["node-b"]
    r = post(collector, doc, who="node-a", fmt="json", comp=None)
    assert r.status_code == 403
    assert count(collector.db) == 0
    r = post(collector, batch("s:1"), who="sre")
    assert r.status_code == 403


def test_size_limits(collector: Collector) -> None:
    # declared body too large
    big = b"x" * 1_100_000
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=big,
        headers={"Content-Type": "application/json", **collector.headers()},
    )
    assert r.status_code == 413

    # chunked body without Content-Length
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(12):
            yield b"y" * 100_000

    r = httpx.post(
        collector.url + "/v1/ingest",
        content=chunks(),
        headers={"Content-Type": "application/json", **collector.headers()},
    )
    assert r.status_code == 413
    # decompression bomb: 100 KB of zstd that expands to ~1 GB
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (1 << 30))
    assert len(bomb) < 200_000
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=bomb,
        headers={"Content-Type": "application/json", "Content-Encoding": "zstd", **collector.headers()},
    )
    assert r.status_code == 413
    gz = gzip.compress(b" " * (64 << 20), 9)
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=gz,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip", **collector.headers()},
    )
    assert r.status_code == 413
    # too many samples
    r = post(collector, batch(n=5_008))
    assert r.status_code == 413
    assert count(collector.db) == 0


def test_clock_skew_rejected_and_counted(collector: Collector) -> None:
    doc = batch("a:skew")
    doc["gpu"]["time"][0] = time.time() + 3600  # an hour in the future
    doc["gpu"]["time"][1] = 1_000_000_000.0  # 2001
    r = post(collector, doc)
    assert r.status_code == 200
    assert r.json()["rejected_skew"] == 2
    assert count(collector.db) == 6
    with psycopg.connect(collector.db) as c:
        assert c.execute("SELECT rejected_skew FROM nodes WHERE node = 'node-a'").fetchone() == (2,)
    assert post(collector, batch("a:later")).status_code == 200
    assert count(collector.db) == 14
    metrics = httpx.get(collector.url + "/metrics").text
    assert 'gpufleet_ingest_rejected_skew_samples_total{node="node-a"} 2.0' in metrics


def test_msgpack_nan_and_bool_rejected(collector: Collector) -> None:
    doc = batch()
    doc["gpu"]["util_pct"][0] = True
    body = msgpack.packb(doc)
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={"Content-Type": "application/msgpack", **collector.headers()},
    )
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["gpu", 0, "util_pct"]


def test_readiness(collector: Collector) -> None:
    r = httpx.get(collector.url + "/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True


def test_typed_array_columns(collector: Collector) -> None:
    """Agents send numeric columns as typed arrays; they are checked like lists."""
    import numpy as np

    from gpufleet.wire import typed_column

    doc = batch("a:typed")
    doc["gpu"]["power_w"] = typed_column([500.5] * 7 + [None], "f4")
    doc["gpu"]["energy_mj"] = typed_column(doc["gpu"]["energy_mj"], "i8")
    r = post(collector, doc, comp=None)
    assert r.status_code == 200, r.text
    with psycopg.connect(collector.db) as c:
        rows = c.execute("SELECT gpu, power_w, energy_mj FROM gpu_samples ORDER BY gpu").fetchall()
    assert rows[0] == (0, 500.5, 1_000_000) and rows[7] == (7, None, 1_000_007)
    bad = batch("a:typed-nan")
    bad["gpu"]["power_w"] = {"dtype": "f8", "data": np.array([1.0, 2.0, np.nan] + [3.0] * 5).tobytes()}
    r = post(collector, bad, comp=None)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["gpu", 2, "power_w"]
    for col, loc in (
        ({"dtype": "f8", "data": b"\0" * 7}, ["gpu", "power_w"]),
        ({"dtype": "x9", "data": b""}, ["gpu", "power_w"]),
        ({"dtype": ["f8"], "data": b""}, ["gpu", "power_w"]),
        ({"dtype": "f8", "data": np.zeros(8).tobytes(), "nulls": b"\0\0"}, ["gpu", "power_w"]),
        ({"dtype": "f8", "data": np.zeros(8).tobytes(), "extra": 1}, ["gpu", "power_w"]),
    ):
        bad = batch("a:typed-bad")
        bad["gpu"]["power_w"] = col
        r = post(collector, bad, comp=None, typed=False)
        assert r.status_code == 422, (col, r.text)
        assert r.json()["detail"][0]["loc"] == loc
    bad = batch("a:typed-int")
    bad["gpu"]["temp_c"] = {"dtype": "f8", "data": np.array([60.5] * 8).tobytes()}
    r = post(collector, bad, comp=None, typed=False)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["gpu", 0, "temp_c"]
    assert count(collector.db) == 8
