"""A new owner of the sweep restores the persisted window and finds exactly what the warm owner finds."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest

from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.detectors.window import Window
from gpufleet.collector.incident_store import clean_json
from gpufleet.collector.sweep import Sweeper
from gpufleet.collector.window_cache import WindowCache, load_facts, load_runs
from gpufleet.collector.window_snapshot import SEG_S, decode_segment, encode_segment
from gpufleet.config import Settings
from gpufleet.sim import Fleet
from tests.collector.test_sweep import register_runs
from testsupport.simfeed import SimFeed


class LateFeed(SimFeed):
    """Agents of ``held`` nodes keep their samples until released (a network partition, a slow agent)."""

    held: set[str]

    def ship(self) -> None:
        held = getattr(self, "held", set())
        kept = {n: self._pending[n] for n in held}
        for n in held:
            self._pending[n] = {"gpu": [], "host": []}
        super().ship()
        for n, rows in kept.items():
            self._pending[n] = {k: rows[k] + self._pending[n][k] for k in ("gpu", "host")}


def window_of(conn: psycopg.Connection, cache: WindowCache, now: float) -> Window:
    return cache.window(now, load_runs(conn, now - cache.window_s, now), load_facts(conn))


def same_window(a: Window, b: Window) -> None:
    for name in ("gpus", "hosts"):
        wa, wb = getattr(a, name), getattr(b, name)
        assert set(wa) == set(wb), name
        for k in wa:
            assert np.array_equal(wa[k].t, wb[k].t), (name, k)
            # a column one cache does not store reads as NaN there
            for c in set(wa[k].cols) | set(wb[k].cols):
                assert np.array_equal(wa[k].get(c), wb[k].get(c), equal_nan=True), (name, k, c)


def findings(w: Window, settings: Settings) -> list[tuple[Any, ...]]:
    res = run_detectors(w, settings.detect)
    assert not res.failures
    return sorted(
        (f.scope_key, f.cause, f.severity, f.start, f.last_active, f.hold_s, repr(clean_json(f.evidence)))
        for f in res.findings
    )


def gpu_blocks(cache: WindowCache, lo: int, hi: int) -> list[Any]:
    """The GPU blocks of the cache's 10-s segments in [lo, hi), each written and read back."""
    out = []
    for s in range(lo, hi, 10):
        d = decode_segment(encode_segment(cache, float(s), float(s + 10)))
        assert d is not None
        out.append(d.gpus)
    return out


def test_segment_round_trip() -> None:
    cache = WindowCache(600.0)
    t = np.arange(100.0, 130.0)
    from gpufleet.collector.window_cache import GPU_COLUMNS, HOST_COLUMNS, _Buf

    rng = np.random.default_rng(1)
    g0 = rng.random((len(GPU_COLUMNS), len(t)), dtype=np.float32)
    g0[3] = np.nan  # a field nobody reports: neither stored nor in the segment
    g0[4, 10:] = (
        np.nan
    )  # a field reported before the segment's seconds only: in the cache, not in the segment
    cache.gpus[("n1", 0)] = _Buf(t, g0)
    cache.gpus[("n1", 1)] = _Buf(t[5:], np.full((len(GPU_COLUMNS), len(t) - 5), np.nan, dtype=np.float32))
    cache.hosts["n1"] = _Buf(t, rng.random((len(HOST_COLUMNS), len(t)), dtype=np.float32))
    assert 3 not in cache.gpus[("n1", 0)].rows and 4 in cache.gpus[("n1", 0)].rows
    assert len(cache.gpus[("n1", 1)].rows) == 0
    d = decode_segment(encode_segment(cache, 110.0, 120.0))
    assert d is not None and 3 not in d.gpus.present and 4 not in d.gpus.present
    d = decode_segment(encode_segment(cache, 100.0, 110.0))
    assert d is not None
    assert (
        d.gpus.keys == [("n1", 0), ("n1", 1)] and d.gpus.counts.tolist() == [10, 5] and d.hosts.keys == ["n1"]
    )
    assert 3 not in d.gpus.present and len(d.gpus.present) == len(GPU_COLUMNS) - 1 and 4 in d.gpus.present
    g = d.gpus.full(len(GPU_COLUMNS))
    assert np.array_equal(d.gpus.t[:10], t[:10])
    assert np.array_equal(g[:, :10], cache.gpus[("n1", 0)].cols[:, :10], equal_nan=True)
    assert np.isnan(g[:, 10:]).all()


def test_cold_takeover_finds_what_the_warm_leader_finds(conn: psycopg.Connection, settings: Settings) -> None:
    fleet = Fleet.from_scenario("straggler_power_cap", seed=3)
    register_runs(conn, fleet)
    fault_start = min(i.start for i in fleet.labels().incidents if i.kind in ("straggler", "throttling"))
    feed = LateFeed(conn, fleet)
    feed.held = set()
    warm = Sweeper(settings)
    late_node = fleet.nodes[1]
    t = fleet.t0 + 60
    end = fault_start + 300
    while t < end:
        # One node's agent is cut off for 40 s twice: its samples land in segments already written,
        # once before the warm leader's last save (rewritten segments), once after it (the new
        # owner's catch-up).
        feed.held = {late_node} if end - 200 < t < end - 160 or t > end - 40 else set()
        feed.run_until(t)
        warm(conn, fleet.t)
        t += settings.detect.sweep_interval_s
    assert warm.last["snapshot_segments"] >= 1 and not warm.last["restored"]
    feed.held = set()
    feed.ship()  # the second partition heals after the warm leader's last sweep
    now = fleet.t
    feed.close()
    # segments cover the window (and one before it); late samples made some be written again
    segs = [r[0] for r in conn.execute("SELECT seg FROM sweep_snapshots ORDER BY seg").fetchall()]
    assert segs == list(range(segs[0], segs[-1] + SEG_S, SEG_S))
    assert segs[0] <= now - settings.detect.window_s and len(segs) <= settings.detect.window_s / SEG_S + 2
    assert warm.snapshots is not None and warm.snapshots.rewritten >= 1

    taker = Sweeper(settings)
    taker(conn, now)
    assert taker.last["restored"]
    assert taker.cache.last_fresh and {n for n, _, _ in taker.cache.last_fresh} == {late_node}
    # only the raw tail and the late batch were read from the sample tables, not the window
    assert taker.snapshots is not None
    restored = taker.snapshots.restored_samples
    assert 0 < taker.last["fetched_rows"] < 0.2 * restored

    warm.cache.refresh(conn, now)
    cold = WindowCache(settings.detect.window_s)  # the old way: every raw sample of the window
    cold.refresh(conn, now)
    wa, wb, wc = (window_of(conn, c, now) for c in (warm.cache, taker.cache, cold))
    same_window(wa, wb)
    same_window(wa, wc)
    fa = findings(wa, settings)
    assert {k[0].split("|")[0] for k in fa} >= {"straggler"}
    assert fa == findings(wb, settings) == findings(wc, settings)

    # A damaged segment does not stop detection: the next owner reads the window's raw samples.
    conn.execute(
        "UPDATE sweep_snapshots SET blob = substring(blob FROM 1 FOR 40) WHERE seg = %s", (segs[-3],)
    )
    damaged = Sweeper(settings)
    damaged(conn, now)
    assert not damaged.last["restored"] and damaged.last["fetched_rows"] >= restored
    same_window(wa, window_of(conn, damaged.cache, now))


def test_segments_reassemble_into_the_cache() -> None:
    """Keys that come and go between segments, a column present in one segment only, gaps."""
    from gpufleet.collector.window_cache import GPU_COLUMNS, _Buf
    from gpufleet.collector.window_snapshot import _assemble

    rng = np.random.default_rng(2)
    cache = WindowCache(600.0)
    for i, t in enumerate([np.arange(100.0, 160.0), np.arange(125.0, 131.0), np.r_[101.5, 139.0, 155.0]]):
        c = rng.random((len(GPU_COLUMNS), len(t)), dtype=np.float32)
        c[5] = np.where(t >= 140, c[5], np.nan)
        c[7] = np.nan
        cache.gpus[("n", i)] = _Buf(t, c)
    blocks = gpu_blocks(cache, 100, 160)
    assert 5 not in blocks[0].present and 5 in blocks[-1].present
    got = _assemble(blocks, len(GPU_COLUMNS))
    assert set(got) == set(cache.gpus)
    for k, b in cache.gpus.items():
        assert np.array_equal(got[k].t, b.t)
        assert np.array_equal(got[k].cols, b.cols, equal_nan=True)
    # room after each key's samples: appending does not reallocate
    before = got[("n", 0)]._t
    got[("n", 0)].merge(np.array([200.0]), np.zeros((len(GPU_COLUMNS), 1), dtype=np.float32))
    assert got[("n", 0)]._t is before and got[("n", 0)].t[-1] == 200.0
    assert np.array_equal(got[("n", 1)].t, cache.gpus[("n", 1)].t)  # the neighbour's samples are intact
    # a segment read twice (never written so, but harmless): samples sorted and de-duplicated
    twice = _assemble([*blocks, blocks[2]], len(GPU_COLUMNS))
    for k, b in cache.gpus.items():
        assert np.array_equal(twice[k].t, b.t)
        assert np.array_equal(twice[k].cols, b.cols, equal_nan=True)


def test_a_uniform_fleet_reassembles_alike(monkeypatch: Any) -> None:
    """Every GPU reporting every second (segments alike in keys, counts and columns) takes the
    strided copy; it builds what the sample-by-sample path builds, room after each key included,
    and a segment read twice still comes out sorted and de-duplicated."""
    from gpufleet.collector import window_snapshot
    from gpufleet.collector.window_cache import GPU_COLUMNS, _Buf

    rng = np.random.default_rng(3)
    cache = WindowCache(600.0)
    t = np.arange(100.0, 160.0) + 0.25
    for i in range(5):
        c = rng.random((len(GPU_COLUMNS), len(t)), dtype=np.float32)
        c[4:] = np.nan
        c[2, ::7] = np.nan  # a NULL now and then stays a NULL
        cache.gpus[("n", i)] = _Buf(t, c)
    blocks = gpu_blocks(cache, 100, 160)
    assert window_snapshot._uniform(blocks, 4)
    for case in (blocks, [*blocks, blocks[3]]):
        fast = window_snapshot._assemble(case, len(GPU_COLUMNS))
        with monkeypatch.context() as m:
            m.setattr(window_snapshot, "_uniform", lambda *_: False)
            slow = window_snapshot._assemble(case, len(GPU_COLUMNS))
        assert set(fast) == set(slow) == set(cache.gpus)
        for k, b in cache.gpus.items():
            assert np.array_equal(fast[k].t, b.t) and np.array_equal(slow[k].t, b.t)
            assert np.array_equal(fast[k].cols, b.cols, equal_nan=True)
            assert np.array_equal(slow[k].cols, b.cols, equal_nan=True)
            if case is blocks:  # the same room to append into (a key read twice is rebuilt)
                assert len(fast[k]._t) == len(slow[k]._t)
    # Segments of different lengths still are; keys that differ between segments are not.
    short = decode_segment(encode_segment(cache, 100.0, 105.0))
    assert short is not None and window_snapshot._uniform([blocks[0], short.gpus], 4)
    del cache.gpus[("n", 2)]
    fewer = decode_segment(encode_segment(cache, 100.0, 110.0))
    assert fewer is not None and not window_snapshot._uniform([blocks[0], fewer.gpus], 4)


def test_restored_buffers_move_their_samples_over_many_sweeps() -> None:
    """A restored window sliding at a steady pace: no sweep moves or reallocates more than a quarter
    of the buffers (each takes its own part of the room it was given; they used to run out all in one
    sweep, which then copied the whole window into fresh memory twice its size), most move their
    samples back within their own arrays instead of reallocating, and every buffer holds exactly
    the window after each sweep."""
    from gpufleet.collector import window_snapshot
    from gpufleet.collector.window_cache import GPU_COLUMNS, _Buf

    rng = np.random.default_rng(5)
    cache = WindowCache(600.0)
    t = np.arange(0.0, 600.0)
    for i in range(400):
        c = np.full((len(GPU_COLUMNS), len(t)), np.nan, dtype=np.float32)
        c[:3] = rng.random((3, len(t)), dtype=np.float32)
        cache.gpus[("n", i)] = _Buf(t, c)
    blocks = gpu_blocks(cache, 0, 600)
    bufs = window_snapshot._assemble(blocks, len(GPU_COLUMNS))
    now, moved_per_sweep, reallocated = 600.0, [], 0
    for _ in range(240):  # 20 minutes of 5-s sweeps
        new_t = np.arange(now, now + 5)
        cols = np.full((len(GPU_COLUMNS), 5), np.nan, dtype=np.float32)
        cols[:3] = new_t.astype(np.float32)
        moved = 0
        for b in bufs.values():
            before = (b._t, b.a)
            b.merge(new_t, cols)
            b.trim(now + 5 - 600)
            if b._t is not before[0]:
                reallocated += 1
                moved += 1
            elif b.a < before[1]:
                moved += 1
        now += 5
        moved_per_sweep.append(moved)
        for b in list(bufs.values())[::37]:
            assert b.t.tolist() == np.arange(now - 600, now).tolist()
            assert np.array_equal(b.vals[0, -5:], new_t.astype(np.float32))
    assert max(moved_per_sweep) <= 0.25 * len(bufs), moved_per_sweep
    assert sum(moved_per_sweep) >= len(bufs)  # every buffer did run out of room at least once
    assert reallocated < 0.5 * sum(moved_per_sweep)


def test_a_streamed_restore_assembles_what_decoded_segments_do() -> None:
    """A restore reads the segments' headers first and decompresses each segment's samples into one
    reused buffer while assembling: the buffers come out as from fully decoded segments, for a
    uniform fleet and once a GPU stops reporting (the sample-by-sample path); consecutive headers
    that list the same GPUs and hosts share one key list, one that lists others keeps its own."""
    from gpufleet.collector.window_cache import GPU_COLUMNS, HOST_COLUMNS, _Buf
    from gpufleet.collector.window_snapshot import _assemble, _Stream

    rng = np.random.default_rng(7)
    cache = WindowCache(600.0)
    t = np.arange(100.0, 140.0)
    for i in range(6):
        c = np.full((len(GPU_COLUMNS), len(t)), np.nan, dtype=np.float32)
        c[:2] = rng.random((2, len(t)), dtype=np.float32)
        cache.gpus[(f"n{i // 2}", i % 2)] = _Buf(t, c)
        h = np.full((len(HOST_COLUMNS), len(t)), np.nan, dtype=np.float32)
        h[0] = rng.random(len(t), dtype=np.float32)
        cache.hosts[f"n{i // 2}"] = _Buf(t, h)
    uniform = [encode_segment(cache, 100.0, 110.0), encode_segment(cache, 110.0, 120.0)]
    del cache.gpus[("n1", 0)]
    mixed = [*uniform, encode_segment(cache, 120.0, 130.0), encode_segment(cache, 130.0, 140.0)]
    for blobs in (uniform, mixed):
        stream = _Stream(blobs)
        assert stream.blocks()
        decoded = [decode_segment(b) for b in blobs]
        gpus = _assemble(stream.gpus, len(GPU_COLUMNS), stream.gpu_data)
        hosts = _assemble(stream.hosts, len(HOST_COLUMNS))
        for got, want in (
            (gpus, _assemble([d.gpus for d in decoded], len(GPU_COLUMNS))),  # type: ignore[union-attr]
            (hosts, _assemble([d.hosts for d in decoded], len(HOST_COLUMNS))),
        ):  # type: ignore[union-attr]
            assert list(got) == list(want)
            for k, b in want.items():
                assert np.array_equal(got[k].t, b.t) and np.array_equal(got[k].cols, b.cols, equal_nan=True)
    a, b, c, d = stream.gpus
    assert b.keys is a.keys and d.keys is c.keys and c.keys is not a.keys and ("n1", 0) not in c.keys
    assert stream.hosts[1].keys is stream.hosts[0].keys
    # A segment cut short is an error, not a window with holes.
    import struct

    import zstandard

    body = zstandard.ZstdDecompressor().decompress(uniform[0])
    (hl,) = struct.unpack_from("<I", body)
    cut = _Stream([zstandard.ZstdCompressor().compress(body[:-100])])
    assert cut.blocks()
    with pytest.raises(ValueError, match="shorter than its header says"):
        _assemble(cut.gpus, len(GPU_COLUMNS), cut.gpu_data)
    with pytest.raises(ValueError, match="inside its header"):
        _Stream([zstandard.ZstdCompressor().compress(body[:hl])]).blocks()
