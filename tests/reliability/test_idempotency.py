"""Scenario 7: every batch sent three times -- one after another, all at once, and after
its chunk was compressed on TimescaleDB -- is stored once.

The batch id is registered in ``ingest_batches`` in the same transaction as
its rows, and rows are copied only for ids that were new, so a resend is
answered ``duplicate`` whatever happened to the stored rows meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.collector.app import create_app
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import serve
from gpufleet.wire import encode
from tests.reliability.conftest import gpu_batch, knob, node_tokens
from tests.timescale import timescale_server
from testsupport.oracle import duplicate_rows, row_counts


def _bodies(node: str, prefix: str, n: int, t0: float) -> list[tuple[bytes, dict[str, str]]]:
    return [
        encode(gpu_batch(f"{prefix}:{i}", node, n=16, t0=t0 + 2 * i), "msgpack", "zstd") for i in range(n)
    ]


async def _send_all(
    url: str, token: str, reqs: list[tuple[bytes, dict[str, str]]], copies: int, concurrent: bool
) -> Counter[str]:
    answers: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(
        base_url=url, timeout=30, limits=limits, headers={"Authorization": f"Bearer {token}"}
    ) as client:

        async def one(body: bytes, headers: dict[str, str]) -> None:
            r = await client.post("/v1/ingest", content=body, headers=headers)
            answers[r.json()["status"] if r.status_code == 200 else str(r.status_code)] += 1

        if concurrent:
            # all copies of every batch in flight together: they race into the same and
            # into different group-commit transactions
            await asyncio.gather(*(one(b, h) for b, h in reqs for _ in range(copies)))
        else:
            for _ in range(copies):
                for b, h in reqs:
                    await one(b, h)
    return answers


@pytest.fixture
def served(fresh_db: str, settings: Settings) -> Iterator[str]:
    with serve(create_app(fresh_db, settings, run_leader=False)) as srv:
        yield srv.url


@pytest.mark.parametrize("concurrent", [False, True], ids=["sequential", "concurrent"])
def test_three_sends_store_once(
    fresh_db: str, served: str, concurrent: bool, figures: dict[str, Any]
) -> None:
    n = int(knob("s7_batches", 100, 1000))
    token = node_tokens(fresh_db, ["idem"])["idem"]
    reqs = _bodies("idem", "idem", n, time.time() - 4 * n)
    answers = asyncio.run(_send_all(served, token, reqs, 3, concurrent))
    rows = row_counts(fresh_db)
    dup = duplicate_rows(fresh_db)
    figures.update(batches=n, sends=3 * n, answers=dict(answers), **rows, duplicate_rows=sum(dup.values()))
    assert answers == {"stored": n, "duplicate": 2 * n}
    assert rows == {"gpu_samples": 16 * n, "host_samples": n, "ingest_batches": n}
    assert dup == {"gpu": 0, "host": 0}


def test_resend_after_chunk_compression_stores_nothing(settings: Settings, figures: dict[str, Any]) -> None:
    server = timescale_server()
    with scratch_database(server, "gpufleet_rel_ts") as url:
        assert migrate.upgrade(url, settings), "TimescaleDB layout expected"
        token = node_tokens(url, ["ts-node"])["ts-node"]
        # two days old, so the batch lands in a chunk that can be compressed now
        reqs = _bodies("ts-node", "ts", 20, time.time() - 2 * 86400)
        with serve(create_app(url, settings, run_leader=False)) as srv:
            first = asyncio.run(_send_all(srv.url, token, reqs, 1, False))
            with psycopg.connect(url, autocommit=True) as c:
                chunks = c.execute(
                    "SELECT count(compress_chunk(ch, if_not_compressed => true)) "
                    "FROM show_chunks('gpu_samples') ch"
                ).fetchone()
                compressed = c.execute(
                    "SELECT count(*) FROM timescaledb_information.chunks "
                    "WHERE hypertable_name = 'gpu_samples' AND is_compressed"
                ).fetchone()
            again = asyncio.run(_send_all(srv.url, token, reqs, 3, True))
        rows = row_counts(url)
        dup = duplicate_rows(url)
    figures.update(
        server=server.rsplit("@", 1)[-1],
        chunks=chunks[0] if chunks else None,
        compressed_chunks=compressed[0] if compressed else None,
        first=dict(first),
        resends=dict(again),
        **rows,
        duplicate_rows=sum(dup.values()),
    )
    assert first == {"stored": 20}
    assert compressed is not None and compressed[0] >= 1
    assert again == {"duplicate": 60}
    assert rows == {"gpu_samples": 320, "host_samples": 20, "ingest_batches": 20}
    assert dup == {"gpu": 0, "host": 0}
