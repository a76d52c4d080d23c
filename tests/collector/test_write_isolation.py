"""One batch can fail only itself: the writer survives anything one batch holds,
a writer thread that dies is restarted (readiness false meanwhile), and
stopping drains within a bounded time.  Real writer threads, real PostgreSQL."""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from gpufleet.collector.writer import DatabaseUnavailable, GroupWriter, Outcome, WriteFailed
from gpufleet.wire import encode, validate
from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, count, post


def _valid(batch_id: str, node: str = "node-a") -> Any:
    return validate(batch(batch_id, node))


async def _gather(writer: GroupWriter, batches: list[Any], timeout: float = 10.0) -> list[Any]:
    futs = [writer.submit(b) for b in batches]
    return await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), timeout)


def _state(c: Collector) -> Any:
    """The running collector's CollectorState (the app served is the ingest fast path over it)."""
    app: Any = c.server.server.config.app
    return app.state


def _kill_thread(t: threading.Thread) -> None:
    """Raise SystemExit inside ``t`` (what an unforeseen fatal error in a writer looks like)."""
    assert t.ident is not None
    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(SystemExit))
    assert n == 1


def test_a_batch_that_cannot_be_encoded_fails_alone_and_the_writer_lives_on(db: str) -> None:
    # A batch that got past validation anyway (here built by hand: facts with
    # bytes, which JSON cannot hold) in the same group as good ones.
    writer = GroupWriter(db, linger_s=0.05)
    writer.start()
    try:
        bad = _valid("a:bad")
        bad.facts = {"x": b"\x00"}
        results = asyncio.run(_gather(writer, [_valid("a:1"), bad, _valid("a:2")]))
        assert isinstance(results[1], WriteFailed)
        assert [r.stored for r in (results[0], results[2])] == [True, True]
        assert writer.healthy and writer.stats.write_errors == 1
        # ... and it goes on writing.
        assert asyncio.run(_gather(writer, [_valid("a:3")]))[0].stored
    finally:
        writer.stop()
    assert count(db) == 3 * 8
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM ingest_batches WHERE batch_id = 'a:bad'").fetchone() == (0,)


def test_deep_facts_batch_is_refused_and_ingest_goes_on(collector: Collector) -> None:
    # The repro: 1000 levels of lists in facts used to kill the writer
    # thread (RecursionError in Jsonb), after which every request hung.
    body = b'{"batch_id":"deep:1","node":"node-a","facts":{"x":' + b"[" * 1000 + b"1" + b"]" * 1000 + b"}}"
    assert orjson.loads(body)  # the parser itself takes it
    r = httpx.post(
        collector.url + "/v1/ingest",
        content=body,
        headers={"Content-Type": "application/json", **collector.headers()},
        timeout=10,
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["facts", "x"]
    r = post(collector, {"batch_id": "bin:1", "node": "node-a", "facts": {"x": b"\x00"}})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["facts", "x"]
    r = post(collector, batch("a:after"))
    assert r.status_code == 200 and r.json()["status"] == "stored"
    assert httpx.get(collector.url + "/readyz", timeout=5).json()["ready"] is True
    with psycopg.connect(collector.db) as c:
        assert c.execute("SELECT batch_id FROM ingest_batches").fetchall() == [("a:after",)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_thread_is_restarted_and_readiness_says_so(db: str) -> None:
    writer = GroupWriter(db)
    writer.supervise_s = 1.0  # slow enough to see the gap
    writer.start()
    try:
        assert writer.healthy
        t = writer._workers[0]
        _kill_thread(t)
        t.join(5)
        assert not t.is_alive()
        assert not writer.healthy
        deadline = time.monotonic() + 5
        while not writer.healthy:
            assert time.monotonic() < deadline, "writer was not restarted"
            time.sleep(0.05)
        assert writer.stats.restarts == 1
        assert asyncio.run(_gather(writer, [_valid("a:1")]))[0].stored
    finally:
        writer.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_readyz_is_false_while_the_writer_is_down(collector: Collector) -> None:
    state = _state(collector)
    state.writer.supervise_s = 1.5
    time.sleep(0.3)  # the supervisor picks up the slower pace after its current nap
    t = state.writer._workers[0]
    _kill_thread(t)
    t.join(5)
    r = httpx.get(collector.url + "/readyz", timeout=5)
    assert r.status_code == 503 and r.json()["writer"] is False
    deadline = time.monotonic() + 10
    while httpx.get(collector.url + "/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "collector never became ready again"
        time.sleep(0.1)
    assert post(collector, batch("a:1")).status_code == 200


def test_stop_is_bounded_and_answers_everything_when_the_database_stalls(db: str) -> None:
    # The database holds the writer (a lock on gpu_samples); a full queue
    # behind it.  stop() must return within its timeout and no request may be
    # left waiting.
    writer = GroupWriter(db, max_rows=20)
    writer.start()
    blocker = psycopg.connect(db)
    blocker.execute("LOCK TABLE gpu_samples IN ACCESS EXCLUSIVE MODE")

    async def scenario() -> tuple[float, list[Any]]:
        futs = [writer.submit(_valid(f"a:{i}")) for i in range(20)]
        await asyncio.sleep(0.5)  # the first group is stuck in COPY
        t0 = time.monotonic()
        await asyncio.to_thread(writer.stop, 2.0)
        took = time.monotonic() - t0
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 5)
        return took, results

    try:
        took, results = asyncio.run(scenario())
    finally:
        blocker.rollback()
        blocker.close()
    assert took < 3.0
    assert all(isinstance(r, DatabaseUnavailable | Outcome) for r in results)
    assert sum(isinstance(r, DatabaseUnavailable) for r in results) >= 19


def test_an_answer_never_waits_longer_than_write_wait_s(collector: Collector) -> None:
    _state(collector).ingest.write_wait_s = 1.0
    blocker = psycopg.connect(collector.db)
    try:
        blocker.execute("LOCK TABLE gpu_samples IN ACCESS EXCLUSIVE MODE")
        t0 = time.monotonic()
        r = post(collector, batch("a:slow"))
        took = time.monotonic() - t0
    finally:
        blocker.rollback()
        blocker.close()
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert took < 5
    # Once the database moves, the retry is stored once (or answered duplicate).
    deadline = time.monotonic() + 10
    while (r := post(collector, batch("a:slow"))).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert count(collector.db) == 8


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_every_request_is_answered_after_a_poison_batch(collector: Collector, fmt: str) -> None:
    # Concurrent good batches around a refused one: all answered, all good ones stored.
    body, headers = encode({"batch_id": "p:1", "node": "node-a", "facts": {"gpus": 1}}, fmt, None)
    with httpx.Client(timeout=10) as c:
        bad = c.post(collector.url + "/v1/ingest", content=body, headers={**headers, **collector.headers()})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["facts", "gpus"]
    results: list[int] = []

    def send(i: int) -> None:
        results.append(post(collector, batch(f"g:{i}", t0=time.time() - 100 + i), fmt=fmt).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == [200] * 10
    assert count(collector.db) == 80


def test_requests_trickling_in_share_one_transaction(db: str) -> None:
    # A request every 20 ms: each one's arrival used to end the linger, so every
    # request paid for a transaction of its own.  Within one linger interval
    # they now share one; a quarter group already waiting is written at once.
    writer = GroupWriter(db, linger_s=0.5, threads=1)
    writer.start()

    async def trickle() -> list[Any]:
        futs = []
        for i in range(6):
            futs.append(writer.submit(_valid(f"t:{i}")))
            await asyncio.sleep(0.02)
        return await asyncio.wait_for(asyncio.gather(*futs), 10)

    try:
        t0 = time.monotonic()
        results = asyncio.run(trickle())
        assert all(r.stored for r in results)
        assert writer.stats.transactions == 1, writer.stats.transactions
        assert time.monotonic() - t0 < 2.0
        # A full quarter group does not wait for the linger.
        writer.max_rows = 8 * 4
        t0 = time.monotonic()
        assert asyncio.run(_gather(writer, [_valid("t:big")]))[0].stored
        assert time.monotonic() - t0 < 0.4
    finally:
        writer.stop()
    assert count(db) == 7 * 8


def test_write_batches_stores_each_node_and_batch_id_once(db: str) -> None:
    # the writer's own storing step, public for replay and the feeds: the first copy of a (node, batch id)
    # is stored, a repeat (in the same call or a later one) copies nothing, another node's same id is its own
    from gpufleet.collector.batch_store import write_batches

    a1, a1_again = validate(batch("a:1", n=8)), validate(batch("a:1", n=16))
    b1 = validate(batch("a:1", node="node-b", n=8))
    with psycopg.connect(db) as conn:
        with conn.transaction():
            done = write_batches(conn, [a1, a1_again, b1])
        assert done.new == {("node-a", "a:1"), ("node-b", "a:1")}
        with conn.transaction():
            assert write_batches(conn, [a1_again]).new == set()
    assert count(db) == 16
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM nodes WHERE node IN ('node-a', 'node-b')").fetchone() == (
            2,
        )


def test_a_lingering_writer_stops_waiting_at_linger_batches(db: str) -> None:
    # The linger is long here (5 s): only reaching ``linger_batches`` requests
    # can end it early, and then the three share one transaction.
    writer = GroupWriter(db, linger_s=5.0, linger_batches=3, threads=1)
    writer.start()

    async def three() -> list[Any]:
        first = writer.submit(_valid("l:0"))
        await asyncio.sleep(0.1)  # the writer has taken up lingering for it
        rest = [writer.submit(_valid(f"l:{i}")) for i in (1, 2)]
        return await asyncio.wait_for(asyncio.gather(first, *rest), 10)

    try:
        t0 = time.monotonic()
        results = asyncio.run(three())
        assert time.monotonic() - t0 < 2.0
        assert all(r.stored for r in results)
        assert writer.stats.transactions == 1, writer.stats.transactions
    finally:
        writer.stop()
    assert count(db) == 3 * 8


def test_the_collector_groups_as_configured(db: str, settings: Any) -> None:
    from gpufleet.collector.app import create_app

    s = settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"group_linger_batches": 7})})
    app: Any = create_app(db, s, run_leader=False)
    assert app.state.writer.linger_batches == 7
