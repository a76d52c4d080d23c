"""The spool: crash recovery of the open segment, immutable sealed batches, the cap and exact loss counts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from gpufleet.agent.batch import encode_batch, record_samples, tick_record, to_batch
from gpufleet.agent.spool import SEQ_BLOCK, CorruptSegment, Spool, SpoolLocked
from gpufleet.wire import as_lists


def encoder(records: list[dict[str, Any]], batch_id: str) -> bytes:
    return encode_batch(to_batch(records, batch_id, "node-a"))


def make(d: Path, **kw: Any) -> Spool:
    kw.setdefault("max_bytes", 10_000_000)
    return Spool(d, encoder, **kw).open()


def rec(t: float, gpus: int = 2, host: bool = True) -> dict[str, Any]:
    rows = [{"gpu": g, "mig_instance": None, "power_w": 100.0 + g, "util_pct": 50.0} for g in range(gpus)]
    return tick_record(t, rows, {"cpu_user_pct": 10.0} if host else None)


def decode(body: bytes) -> dict[str, Any]:
    return as_lists(msgpack.unpackb(zstandard.ZstdDecompressor().decompressobj().decompress(body), raw=False))


def drain(spool: Spool) -> list[dict[str, Any]]:
    """Lease, read and ack every sealed segment; the decoded batches, oldest first."""
    out = []
    while (seg := spool.lease()) is not None:
        out.append(decode(spool.read(seg)))
        spool.ack(seg)
    return out


def open_file(d: Path) -> Path:
    (path,) = d.glob("*.open")
    return path


def test_sealed_segment_is_a_columnar_batch_with_a_stable_id(tmp_path: Path) -> None:
    spool = make(tmp_path)
    for t in range(3):
        spool.append(rec(1000.0 + t))
    seg = spool.seal()
    assert seg is not None and seg.samples == 9
    assert seg.batch_id == f"{spool.agent_id}:{seg.seq}"
    assert seg.path.name == f"{seg.seq:016d}-9.seg"
    batch = decode(spool.read(seg))
    assert batch["batch_id"] == seg.batch_id and batch["node"] == "node-a"
    assert batch["gpu"]["time"] == [1000.0, 1000.0, 1001.0, 1001.0, 1002.0, 1002.0]
    assert batch["gpu"]["gpu"] == [0, 1] * 3
    assert batch["gpu"]["power_w"] == [100.0, 101.0] * 3
    assert batch["host"] == {"time": [1000.0, 1001.0, 1002.0], "cpu_user_pct": [10.0] * 3}
    # Sealing nothing seals nothing.
    assert spool.seal() is None


def test_agent_id_persists_and_sequence_numbers_are_never_reused(tmp_path: Path) -> None:
    spool = make(tmp_path)
    agent_id = spool.agent_id
    spool.append(rec(1.0))
    first = spool.seal()
    assert first is not None
    drain(spool)
    spool.close()
    # Everything was delivered and deleted: a restart must still not reuse the number,
    # or the collector would take new data for a duplicate of the old batch.
    again = make(tmp_path)
    assert again.agent_id == agent_id
    again.append(rec(2.0))
    second = again.seal()
    assert second is not None and second.seq > first.seq
    again.close()
    # Even with next_seq lost, a surviving segment keeps the numbering ahead.
    (tmp_path / "next_seq").unlink()
    third = make(tmp_path)
    third.append(rec(3.0))
    seg = third.seal()
    assert seg is not None and seg.seq > second.seq
    assert int((tmp_path / "next_seq").read_text()) >= seg.seq + 1
    assert int((tmp_path / "next_seq").read_text()) <= seg.seq + SEQ_BLOCK


def test_kill_leaves_an_open_segment_that_is_recovered_and_sealed(tmp_path: Path) -> None:
    spool = make(tmp_path)
    for t in range(5):
        spool.append(rec(100.0 + t))
    # A kill -9: no seal; the kernel closes the files (and releases the lock).
    spool.close()
    recovered = make(tmp_path)
    assert not list(tmp_path.glob("*.open"))
    assert recovered.stats.recovered_records == 5 and recovered.stats.torn_records == 0
    (batch,) = drain(recovered)
    assert batch["host"]["time"] == [100.0, 101.0, 102.0, 103.0, 104.0]


def test_a_torn_tail_costs_at_most_that_record_at_any_cut(tmp_path: Path) -> None:
    src = make(tmp_path / "src")
    for t in range(3):
        src.append(rec(float(t)))
    last_start = open_file(tmp_path / "src").stat().st_size
    src.append(rec(3.0))
    data = open_file(tmp_path / "src").read_bytes()
    src.close()
    # A kill -9 (or a power cut) at any byte of the last record.
    for cut in range(last_start, len(data) + 1):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / f"{7:016d}.open").write_bytes(data[:cut])
        spool = make(d)
        torn = cut not in (last_start, len(data))
        assert spool.stats.torn_records == (1 if torn else 0), cut
        (batch,) = drain(spool)
        assert batch["host"]["time"] == ([0.0, 1.0, 2.0, 3.0] if cut == len(data) else [0.0, 1.0, 2.0]), cut
        # The agent goes on appending after recovery.
        spool.append(rec(9.0))
        assert spool.seal() is not None
        spool.close()


def test_a_corrupt_record_ends_recovery_there_without_wedging(tmp_path: Path) -> None:
    spool = make(tmp_path)
    for t in range(3):
        spool.append(rec(float(t)))
    path = open_file(tmp_path)
    spool.close()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # flip a byte inside the last payload: its CRC no longer matches
    path.write_bytes(bytes(data))
    again = make(tmp_path)
    assert again.stats.torn_records == 1
    (batch,) = drain(again)
    assert batch["host"]["time"] == [0.0, 1.0]


def test_open_segment_without_even_its_magic_is_discarded(tmp_path: Path) -> None:
    (tmp_path / f"{3:016d}.open").write_bytes(b"GFSP")
    spool = make(tmp_path)
    assert spool.sealed_count == 0 and not list(tmp_path.glob("*.open"))
    spool.append(rec(1.0))
    seg = spool.seal()
    assert seg is not None and seg.seq > 3


def test_crash_between_seal_and_unlink_does_not_send_twice(tmp_path: Path) -> None:
    spool = make(tmp_path)
    spool.append(rec(1.0))
    open_bytes = open_file(tmp_path).read_bytes()
    open_name = open_file(tmp_path).name
    seg = spool.seal()
    assert seg is not None
    spool.close()
    # The sealed file was renamed into place but the open one was not yet removed.
    (tmp_path / open_name).write_bytes(open_bytes)
    again = make(tmp_path)
    assert again.sealed_count == 1 and not list(tmp_path.glob("*.open"))


def test_cap_drops_oldest_sealed_first_and_counts_exactly(tmp_path: Path) -> None:
    probe = make(tmp_path / "probe")
    probe.append(rec(0.0))
    seg_size = probe.seal().size  # type: ignore[union-attr]
    cap = 5 * seg_size + seg_size // 2
    spool = make(tmp_path / "s", max_bytes=cap)
    for i in range(20):
        spool.append(rec(float(i)))
        spool.seal()
        assert spool.bytes <= cap + seg_size
    assert spool.stats.dropped_full == 15 * 3
    assert spool.metrics.value("gpufleet_agent_samples_dropped_total", reason="spool_full") == 45
    batches = drain(spool)
    # The newest survive, in order.
    assert [b["host"]["time"][0] for b in batches] == [15.0, 16.0, 17.0, 18.0, 19.0]
    s = spool.stats
    assert s.spooled == s.delivered + s.dropped_full + spool.pending_samples == 60


def test_cap_never_drops_the_segment_being_sent(tmp_path: Path) -> None:
    spool = make(tmp_path)
    spool.append(rec(0.0))
    spool.seal()
    leased = spool.lease()
    assert leased is not None
    spool.max_bytes = 1  # from now on everything is over the cap
    spool.append(rec(1.0))
    spool.seal()
    # The newer segment went; the one on the wire stays until the collector answers.
    assert spool.sealed_count == 1 and leased.path.exists()
    spool.ack(leased)
    assert spool.stats.delivered == 3 and spool.stats.dropped_full == 3 and spool.pending_samples == 0


def test_samples_accounting_invariant_over_a_mixed_history(tmp_path: Path) -> None:
    spool = make(tmp_path, max_bytes=3_000)
    for i in range(40):
        spool.append(rec(float(i), gpus=1 + i % 3, host=i % 2 == 0))
        if i % 4 == 3:
            spool.seal()
        if i % 7 == 6 and (seg := spool.lease()) is not None:
            spool.ack(seg)
        if i % 11 == 10 and (seg := spool.lease()) is not None:
            spool.dead_letter(seg, "422", "refused")
    s = spool.stats
    produced = sum(record_samples(rec(float(i), gpus=1 + i % 3, host=i % 2 == 0)) for i in range(40))
    assert s.spooled == produced
    assert s.spooled == s.delivered + s.dropped_full + s.dropped_dead + spool.pending_samples
    m = spool.metrics
    assert m.value("gpufleet_agent_samples_spooled_total") == produced
    assert (
        m.value("gpufleet_agent_samples_delivered_total")
        + m.value("gpufleet_agent_samples_dropped_total", reason="spool_full")
        + m.value("gpufleet_agent_samples_dropped_total", reason="dead_letter")
        + spool.pending_samples
    ) == produced


def test_dead_letters_are_kept_aside_with_the_reason_and_capped(tmp_path: Path) -> None:
    spool = make(tmp_path, dead_max_bytes=10**6)
    spool.append(rec(1.0))
    seg = spool.seal()
    assert seg is not None
    spool.dead_letter(spool.lease(), "422", "gpu sample 0, field 'power_w': -1 is outside")  # type: ignore[arg-type]
    assert spool.sealed_count == 0
    dead = list((tmp_path / "dead").glob("*.seg"))
    assert [p.name for p in dead] == [seg.path.name]
    assert '"status": "422"' in dead[0].with_suffix(".json").read_text()
    assert spool.facts_lost.is_set()
    tiny = make(tmp_path / "t", dead_max_bytes=0)
    tiny.append(rec(1.0))
    tiny.seal()
    tiny.dead_letter(tiny.lease(), "400", "bad")  # type: ignore[arg-type]
    assert not list((tmp_path / "t" / "dead").glob("*.seg"))
    assert tiny.stats.dropped_dead == 3


def test_corrupt_sealed_segment_is_detected_before_sending(tmp_path: Path) -> None:
    spool = make(tmp_path)
    spool.append(rec(1.0))
    seg = spool.seal()
    assert seg is not None
    data = bytearray(seg.path.read_bytes())
    data[-1] ^= 0x01
    seg.path.write_bytes(bytes(data))
    with pytest.raises(CorruptSegment):
        spool.read(spool.lease())  # type: ignore[arg-type]


def test_failed_write_is_counted_and_leaves_the_segment_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = make(tmp_path)
    spool.append(rec(1.0))
    real_write = os.write
    calls = {"n": 0}

    def short_write(fd: int, data: bytes) -> int:
        calls["n"] += 1
        return real_write(fd, data[: len(data) // 2])  # a full disk: half the frame lands

    monkeypatch.setattr(os, "write", short_write)
    assert spool.append(rec(2.0)) is False
    monkeypatch.undo()
    assert calls["n"] == 1 and spool.stats.dropped_write == 3
    spool.append(rec(3.0))
    spool.close()
    again = make(tmp_path)
    assert again.stats.torn_records == 0
    (batch,) = drain(again)
    assert batch["host"]["time"] == [1.0, 3.0]


def test_second_agent_on_the_same_spool_is_refused(tmp_path: Path) -> None:
    first = make(tmp_path)
    with pytest.raises(SpoolLocked):
        make(tmp_path)
    first.close()
    make(tmp_path).close()


def test_fsync_mode_and_segment_sample_limit(tmp_path: Path) -> None:
    spool = make(tmp_path, fsync=True, segment_max_samples=6)
    for t in range(5):
        spool.append(rec(float(t)))
    # Sealed automatically every 2 records (6 samples).
    assert spool.sealed_count == 2
    assert [b["host"]["time"] for b in drain(spool)] == [[0.0, 1.0], [2.0, 3.0]]
