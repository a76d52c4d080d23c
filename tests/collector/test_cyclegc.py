"""Cyclic collection waits while a sweep runs, and comes back after it."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import weakref

import psycopg
import pytest

from gpufleet.collector import cyclegc
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings
from gpufleet.sim import Fleet
from tests.collector.test_sweep import register_runs
from testsupport.simfeed import SimFeed


@pytest.fixture(autouse=True)
def _gc_enabled() -> object:
    gc.enable()
    yield
    gc.enable()


def test_pauses_nest_and_the_last_one_out_enables_again() -> None:
    with cyclegc.paused():
        assert not gc.isenabled()
        with cyclegc.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_an_error_inside_the_pause_still_enables_again() -> None:
    with pytest.raises(RuntimeError), cyclegc.paused():
        raise RuntimeError("sweep failed")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_application_stays_off() -> None:
    gc.disable()
    with cyclegc.paused():
        pass
    assert not gc.isenabled()


def test_overlapping_pauses_in_two_threads() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with cyclegc.paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with cyclegc.paused():
        t.start()
        assert inside.wait(5)
    assert not gc.isenabled()  # the other thread's pause outlives this one
    release.set()
    t.join(5)
    assert gc.isenabled()


def test_a_sweep_sets_off_no_collection_and_garbage_cycles_are_collected_after(
    conn: psycopg.Connection, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet.from_scenario("straggler_power_cap", seed=3)
    register_runs(conn, fleet)
    feed = SimFeed(conn, fleet)
    feed.run_until(fleet.t0 + 180)
    feed.close()
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        """A collection set off from inside a sweep's body."""
        if phase != "start":
            return
        f = sys._getframe()
        while f is not None and f.f_code is not Sweeper._sweep.__code__:
            f = f.f_back  # type: ignore[assignment]
        if f is not None:
            started.append(info["generation"])

    # A scenario's handful of GPUs allocates far less than a fleet: a low threshold makes
    # its sweep set off collections as a fleet's sweep does.
    threshold = gc.get_threshold()
    gc.set_threshold(20, 2, 2)
    gc.callbacks.append(seen)
    try:
        # The same sweep without the pause: the collections it sets off.
        with monkeypatch.context() as m:
            m.setattr(cyclegc, "paused", contextlib.nullcontext)
            Sweeper(settings)(conn, fleet.t)
        unpaused = list(started)
        sweeper = Sweeper(settings)
        gc.collect()
        started.clear()
        sweeper(conn, fleet.t)
        during = list(started)
        # A cycle dropped after the sweep is found by the collections that allocations set
        # off again, without an explicit collect.
        ref = weakref.ref(_Node(None))
        for _ in range(3 * gc.get_threshold()[0]):
            _Node(None)
        collected = ref() is None
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
    assert unpaused, "the sweep without the pause set off no collection: nothing to compare with"
    assert during == []
    assert collected


class _Node:
    """A container object that sits in a reference cycle of its own."""

    def __init__(self, payload: object) -> None:
        self.payload = payload
        self.me = self
