"""Scenarios 8 (hand-made part), 9 and 12: what the collector refuses, and what a refusal costs it.

A refusal names the sample and the field, happens before anything is
written, and a hostile body (oversized, chunked past the limit, a
decompression bomb) is cut off without the collector's memory following it:
RSS is measured on a real collector process.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import zstandard

from tests.reliability.conftest import gpu_batch, node_tokens, post
from testsupport.oracle import row_counts
from testsupport.procs import CollectorProc

LIMITS = {"max_body_bytes": 1_000_000, "max_decompressed_bytes": 8_000_000, "max_samples_per_batch": 5_000}


class RssSampler:
    """The peak RSS of a process while the block runs, sampled every few milliseconds."""

    def __init__(self, proc: CollectorProc, every_s: float = 0.002) -> None:
        self.proc, self.every_s = proc, every_s
        self.peak = proc.rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.rss_bytes())
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def collector(fresh_db: str, collectors: Callable[..., CollectorProc]) -> Iterator[CollectorProc]:
    col = collectors(fresh_db, {"ingest": LIMITS, "leader": False})
    col.start().wait_up()
    yield col


def _bad(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = gpu_batch("bad:1", "ref-node", n=500)
    mutate(doc)
    return doc


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], int, list[Any]]] = {
    "NaN among 500": (lambda d: d["gpu"]["power_w"].__setitem__(317, math.nan), 422, ["gpu", 317, "power_w"]),
    "Infinity": (lambda d: d["gpu"]["util_pct"].__setitem__(499, math.inf), 422, ["gpu", 499, "util_pct"]),
    "object as a value": (lambda d: d["gpu"]["temp_c"].__setitem__(42, {"v": 1}), 422, ["gpu", 42, "temp_c"]),
    "list as a value": (lambda d: d["gpu"]["power_w"].__setitem__(7, [1.0]), 422, ["gpu", 7, "power_w"]),
    "unknown field": (lambda d: d["gpu"].__setitem__("warp_drive", [1] * 500), 422, ["gpu", "warp_drive"]),
    "string time": (
        lambda d: d["gpu"]["time"].__setitem__(250, "2026-12-01T10:00:00Z"),
        422,
        ["gpu", 250, "time"],
    ),
    "missing node": (lambda d: d.pop("node"), 422, ["node"]),
    "boolean as a number": (lambda d: d["gpu"]["util_pct"].__setitem__(3, True), 422, ["gpu", 3, "util_pct"]),
    "out of range": (lambda d: d["gpu"]["util_pct"].__setitem__(499, 250.0), 422, ["gpu", 499, "util_pct"]),
    "ragged column": (lambda d: d["gpu"]["power_w"].pop(), 422, ["gpu", "power_w"]),
}


def test_malformed_batches_name_index_and_field_and_write_nothing(
    fresh_db: str, collector: CollectorProc, figures: dict[str, Any]
) -> None:
    token = node_tokens(fresh_db, ["ref-node"])["ref-node"]
    seen = {}
    for name, (mutate, status, loc) in CASES.items():
        for fmt in ("json", "msgpack"):
            doc = _bad(mutate)
            if fmt == "json" and name in ("NaN among 500", "Infinity"):
                continue  # JSON has no NaN: orjson writes null, which is a valid value
            r = post(collector.url, token, doc, fmt=fmt, comp="zstd")
            seen[f"{name} ({fmt})"] = (r.status_code, r.json()["detail"][0]["loc"])
            assert r.status_code == status, (name, fmt, r.text)
            detail = r.json()["detail"][0]
            assert detail["loc"] == loc, (name, fmt, detail)
            if len(loc) == 3:
                assert f"sample {loc[1]}" in detail["msg"] and loc[2] in detail["msg"]
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=b'{"batch_id": "x", "node": ',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    seen["truncated JSON"] = (r.status_code, r.json()["detail"][0]["loc"])
    assert r.status_code == 400
    assert row_counts(fresh_db) == {"gpu_samples": 0, "host_samples": 0, "ingest_batches": 0}
    figures.update(cases={k: list(v) for k, v in seen.items()}, rows_written=0)


def test_clock_skew_rejected_and_counted_per_node(
    fresh_db: str, collector: CollectorProc, figures: dict[str, Any]
) -> None:
    tokens = node_tokens(fresh_db, ["skew-a", "skew-b"])
    now = time.time()
    doc = gpu_batch("skew-a:1", "skew-a", n=16, t0=now - 10)
    doc["gpu"]["time"][:3] = [now + 3600, now + 301, now - 15 * 86400]  # beyond +300 s / -14 d
    ra = post(collector.url, tokens["skew-a"], doc)
    doc = gpu_batch("skew-b:1", "skew-b", n=16, t0=now - 10)
    doc["gpu"]["time"][5] = now + 86400
    rb = post(collector.url, tokens["skew-b"], doc)
    later = [post(collector.url, tokens[n], gpu_batch(f"{n}:later", n, n=16)).status_code for n in tokens]
    metrics = httpx.get(collector.url + "/metrics").text
    with psycopg.connect(fresh_db) as c:
        per_node = dict(c.execute("SELECT node, rejected_skew FROM nodes ORDER BY node").fetchall())
        stored = dict(c.execute("SELECT node, count(*) FROM gpu_samples GROUP BY node").fetchall())
    figures.update(answers=[ra.json(), rb.json()], later=later, per_node=per_node, stored=stored)
    assert ra.json()["rejected_skew"] == 3 and rb.json()["rejected_skew"] == 1
    assert later == [200, 200]
    assert per_node == {"skew-a": 3, "skew-b": 1}
    assert stored == {"skew-a": 13 + 16, "skew-b": 15 + 16}
    assert 'gpufleet_ingest_rejected_skew_samples_total{node="skew-a"} 3.0' in metrics
    assert 'gpufleet_ingest_rejected_skew_samples_total{node="skew-b"} 1.0' in metrics


def test_oversized_bodies_bombs_and_rate_limits(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    # the shipped decompression cap (what a bomb can cost), the suite's other limits
    limits = {k: v for k, v in LIMITS.items() if k != "max_decompressed_bytes"}
    col = collectors(fresh_db, {"ingest": {**limits, "rate_limit_per_s": 5}, "leader": False})
    col.start().wait_up()
    token = node_tokens(fresh_db, ["lim-node"])["lim-node"]
    h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    got: dict[str, Any] = {}
    time.sleep(1)
    rss0 = col.rss_bytes()
    got["declared_too_large"] = httpx.post(
        col.url + "/v1/ingest", content=b"x" * 1_100_000, headers=h
    ).status_code

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"y" * 100_000

    got["chunked_too_large"] = httpx.post(col.url + "/v1/ingest", content=chunks(), headers=h).status_code
    time.sleep(1)  # refill the token bucket
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (1 << 30))  # 1 GiB in ~33 KB
    streamed = zstandard.ZstdCompressor(level=19, write_content_size=False).compress(b"\0" * (1 << 30))
    with RssSampler(col) as rss:
        for name, body in (("zstd_bomb", bomb), ("zstd_bomb_no_size", streamed)):
            got[name] = httpx.post(
                col.url + "/v1/ingest", content=body, headers={**h, "Content-Encoding": "zstd"}, timeout=30
            ).status_code
            time.sleep(0.5)
        time.sleep(1)
        got["too_many_samples"] = post(col.url, token, gpu_batch("lim:big", "lim-node", n=5_008)).status_code
    rss_peak = rss.peak
    time.sleep(1.5)
    # 30 requests at once, far past 5/s with a burst of 10: sent together, so the answer does not
    # depend on how long each one's commit takes (group commit lingers up to 200 ms)
    with ThreadPoolExecutor(30) as pool:
        burst = list(pool.map(lambda i: post(col.url, token, gpu_batch(f"lim:{i}", "lim-node")), range(30)))
    statuses = [r.status_code for r in burst]
    limited = [r for r in burst if r.status_code == 429]
    got.update(
        bomb_bytes=[len(bomb), len(streamed)],
        rss_before_mb=round(rss0 / 2**20, 1),
        rss_growth_mb=round((rss_peak - rss0) / 2**20, 1),
        burst_200=statuses.count(200),
        burst_429=len(limited),
    )
    figures.update(got)
    assert got["declared_too_large"] == got["chunked_too_large"] == 413
    assert got["zstd_bomb"] == got["zstd_bomb_no_size"] == 413
    assert got["too_many_samples"] == 413
    assert rss_peak - rss0 < 50 * 2**20
    assert limited and all(r.headers.get("retry-after") for r in limited)
    assert statuses.count(200) >= 10  # the burst (2 s worth) gets through
