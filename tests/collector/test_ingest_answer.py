"""How an ingest request waits for the writer and what it answers, beside what they replaced."""

from __future__ import annotations

import asyncio

import pytest
from starlette.responses import JSONResponse

from gpufleet.collector.ingest import stored_answer, wait_at_most


def live_timers(loop: asyncio.AbstractEventLoop) -> int:
    return sum(not h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]


def test_the_answer_is_byte_for_byte_what_json_response_sends() -> None:
    for args in [("node-a:1", "stored", 80, 10, 0), ("n.b_c:9-x", "duplicate", 0, 0, 3)]:
        ours = stored_answer(*args)
        theirs = JSONResponse(
            dict(zip(["batch_id", "status", "gpu_rows", "host_rows", "rejected_skew"], args, strict=True))
        )
        assert ours.body == theirs.body
        assert ours.status_code == theirs.status_code == 200
        assert sorted(ours.raw_headers) == sorted(theirs.raw_headers)


def test_a_confirmation_is_returned_and_a_failure_raised() -> None:
    async def scenario() -> tuple[int, BaseException | None, int]:
        loop = asyncio.get_running_loop()
        ok: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.01, ok.set_result, 7)
        bad: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.01, bad.set_exception, RuntimeError("write failed"))
        err = None
        try:
            await wait_at_most(bad, 5)
        except RuntimeError as e:
            err = e
        got = await wait_at_most(ok, 5)
        # Each wait's timer went with its answer: none waits out its 5 s.
        return got, err, live_timers(loop)

    got, err, timers = asyncio.run(scenario())
    assert got == 7 and isinstance(err, RuntimeError)
    assert timers == 0


def test_a_timeout_leaves_the_write_running_and_nothing_scheduled() -> None:
    async def scenario() -> tuple[bool, bool, int, int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with pytest.raises(TimeoutError):
            await wait_at_most(fut, 0.05)
        # No callback is left on a future that outlives the request, and no timer.
        callbacks = len(fut._callbacks or [])  # type: ignore[attr-defined]
        timers = live_timers(loop)
        # The write goes on: its confirmation still arrives, to nobody waiting.
        cancelled = fut.cancelled()
        fut.set_result(1)
        await asyncio.sleep(0)
        return cancelled, fut.done(), timers, callbacks

    cancelled, done, timers, callbacks = asyncio.run(scenario())
    assert not cancelled and done
    assert timers == 0 and callbacks == 0


def test_cancelling_the_request_does_not_cancel_the_write() -> None:
    async def scenario() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        task = loop.create_task(wait_at_most(fut, 30))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        fut.set_result(3)
        return fut.cancelled(), live_timers(loop)

    cancelled, timers = asyncio.run(scenario())
    assert not cancelled and timers == 0
