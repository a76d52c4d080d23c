"""A bounded, crash-safe spool on disk between collection and shipping.

Layout of the spool directory::

    agent_id                      random id of this agent, made once
    next_seq                      segment numbers reserved so far (never reused)
    lock                          flock'ed by the running agent: a second one refuses to start
    0000000000001025.open         the open segment: appended once per tick
    0000000000001024-450.seg      sealed segments: <seq>-<samples>.seg
    dead/                         batches the collector refused for good (+ .json why)

**Open segment.** An 8-byte magic, then one frame per tick record:
``<u32 length><u32 crc32(payload)><msgpack payload>``, written with one
``write`` per record (and ``fsync`` when configured), so a killed agent loses
at most the record being written.  On start an open segment left by a crash is
read up to the first torn or corrupt frame -- that one record is counted and
dropped, never wedging the agent -- and sealed.

**Sealed segment.** Sealing turns the records into one wire batch (msgpack +
zstd) whose ``batch_id`` is ``<agent_id>:<seq>``; the file holds that body
behind a magic and a CRC.  It is written to a temporary name, fsynced and
renamed, then never changed: a resend after any crash carries the same id and
bytes, and the collector de-duplicates it.  Sequence numbers are reserved in
fsynced blocks, so a restart (even after power loss) never reuses one.

**Cap.** When the spool holds more than ``max_bytes``, the oldest sealed
segments are deleted first (the one being sent is never touched) and their
samples counted as dropped -- exactly, from the count in the file name -- so
``spooled = delivered + dropped + pending`` holds.  The spool stays within
the cap plus one segment.  A segment leaves only on the collector's 2xx
(:meth:`Spool.ack`) or refusal (:meth:`Spool.dead_letter`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from gpufleet.agent.batch import record_samples
from gpufleet.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

OPEN_MAGIC = b"GFSPOOL1"
SEALED_MAGIC = b"GFBATCH1"
_FRAME = struct.Struct("<II")
_SEALED_HEAD = struct.Struct("<8sI")
#: A frame longer than this is corruption, not a record, bytes.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: Sequence numbers reserved per fsync of ``next_seq``.
SEQ_BLOCK = 1024

_SEALED_RE = re.compile(r"^(\d{16})-(\d+)\.seg$")
_OPEN_RE = re.compile(r"^(\d{16})\.open$")

#: Turns a segment's records and its batch id into the request body.
Encoder = Callable[[list[dict[str, Any]], str], bytes]


class CorruptSegment(ValueError):
    """A sealed segment's bytes do not match its CRC (disk corruption)."""


class SpoolLocked(RuntimeError):
    """Another agent process holds this spool directory."""


@dataclass
class Segment:
    """A sealed segment: an immutable batch waiting for the collector."""

    seq: int
    samples: int
    path: Path
    size: int
    batch_id: str


@dataclass
class SpoolStats:
    """This process's sample accounting (Prometheus carries the same numbers)."""

    spooled: int = 0
    delivered: int = 0
    dropped_full: int = 0
    dropped_dead: int = 0
    dropped_corrupt: int = 0
    dropped_write: int = 0
    torn_records: int = 0
    recovered_records: int = 0


@dataclass
class RecoveredRecords:
    records: list[dict[str, Any]] = field(default_factory=list)
    good_bytes: int = 0
    torn: bool = False


def read_records(data: bytes) -> RecoveredRecords:
    """The intact records of an open segment, stopping at the first torn or corrupt frame."""
    out = RecoveredRecords()
    if len(data) < len(OPEN_MAGIC) or data[: len(OPEN_MAGIC)] != OPEN_MAGIC:
        out.torn = bool(data)
        return out
    pos = len(OPEN_MAGIC)
    out.good_bytes = pos
    while pos < len(data):
        if pos + _FRAME.size > len(data):
            out.torn = True
            break
        length, crc = _FRAME.unpack_from(data, pos)
        start, end = pos + _FRAME.size, pos + _FRAME.size + length
        if length > MAX_RECORD_BYTES or end > len(data) or zlib.crc32(data[start:end]) != crc:
            out.torn = True
            break
        try:
            rec = msgpack.unpackb(data[start:end], raw=False)
        except (ValueError, msgpack.UnpackException):
            out.torn = True
            break
        if not isinstance(rec, dict):
            out.torn = True
            break
        out.records.append(rec)
        pos = end
        out.good_bytes = pos
    return out


def frame(record: dict[str, Any]) -> bytes:
    payload = msgpack.packb(record, use_bin_type=True)
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, *, sync: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


class Spool:
    """The spool directory; :meth:`open` recovers it, then one writer appends and one shipper drains."""

    def __init__(
        self,
        directory: Path | str,
        encoder: Encoder,
        *,
        max_bytes: int,
        segment_max_samples: int = 10_000,
        fsync: bool = False,
        dead_max_bytes: int = 64 * 1024 * 1024,
        metrics: AgentMetrics | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dir = Path(directory)
        self.dead_dir = self.dir / "dead"
        self.encoder = encoder
        self.max_bytes = max_bytes
        self.segment_max_samples = segment_max_samples
        self.fsync = fsync
        self.dead_max_bytes = dead_max_bytes
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.stats = SpoolStats()
        #: Set when a segment that may have carried node facts was lost; the
        #: runtime then sends the facts again.
        self.facts_lost = threading.Event()
        self._mono = mono
        self._lock = threading.Condition()
        self._sealed: dict[int, Segment] = {}
        self._leased: set[int] = set()
        self.agent_id = ""
        self._next_seq = 1
        self._reserved = 0
        self._fd: int | None = None
        self._open_seq: int | None = None
        self._open_path: Path | None = None
        self._open_records: list[dict[str, Any]] = []
        self._open_samples = 0
        self._open_bytes = 0
        self._opened_at = 0.0
        self._lock_fd: int | None = None

    # -- start-up ----------------------------------------------------------------------------

    def open(self) -> Spool:
        """Create or recover the directory: seal what a crash left open, enforce the cap."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self.dead_dir.mkdir(exist_ok=True)
        for tmp in self.dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        self.agent_id = self._load_agent_id()
        seqs = [0]
        opens: list[tuple[int, Path]] = []
        for path in self.dir.iterdir():
            if m := _SEALED_RE.match(path.name):
                seq = int(m.group(1))
                self._sealed[seq] = Segment(
                    seq, int(m.group(2)), path, path.stat().st_size, self.batch_id(seq)
                )
                seqs.append(seq)
            elif m := _OPEN_RE.match(path.name):
                opens.append((int(m.group(1)), path))
                seqs.append(int(m.group(1)))
        self._reserved = self._load_reserved()
        self._next_seq = max(self._reserved, max(seqs) + 1)
        for seq, path in sorted(opens):
            self._recover(seq, path)
        self._enforce_cap()
        self._gauges()
        return self

    def _take_lock(self) -> None:
        """Two agents appending to one spool would interleave records; the second one refuses to start."""
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolLocked(f"spool {self.dir} is in use by another agent process") from None
        self._lock_fd = fd

    def _load_agent_id(self) -> str:
        path = self.dir / "agent_id"
        try:
            text = path.read_text().strip()
            if re.fullmatch(r"[A-Za-z0-9._-]{1,64}", text):
                return text
            log.warning("spool: %s is malformed; starting a new agent id", path)
        except FileNotFoundError:
            pass
        agent_id = uuid.uuid4().hex[:16]
        _write_atomic(path, agent_id.encode() + b"\n", sync=True)
        return agent_id

    def _load_reserved(self) -> int:
        try:
            return int((self.dir / "next_seq").read_text().strip())
        except FileNotFoundError:
            return 1
        except ValueError:
            log.warning("spool: next_seq is malformed; continuing after the highest segment on disk")
            return 1

    def _recover(self, seq: int, path: Path) -> None:
        if seq in self._sealed:
            # Sealed and renamed before the crash; only the unlink was missing.
            path.unlink(missing_ok=True)
            return
        data = path.read_bytes()
        got = read_records(data)
        if got.torn:
            self.stats.torn_records += 1
            self.metrics.torn_records.inc()
            log.warning(
                "spool: %s ends in a torn or corrupt record (%d bytes discarded); %d records recovered",
                path.name,
                len(data) - got.good_bytes,
                len(got.records),
            )
        self.stats.recovered_records += len(got.records)
        if got.records:
            samples = sum(record_samples(r) for r in got.records)
            self._write_sealed(seq, got.records, samples)
        path.unlink(missing_ok=True)

    # -- writing (agent thread) --------------------------------------------------------------

    def batch_id(self, seq: int) -> str:
        return f"{self.agent_id}:{seq}"

    def _new_segment(self) -> None:
        seq = self._next_seq
        self._next_seq += 1
        if seq >= self._reserved:
            self._reserved = seq + SEQ_BLOCK
            _write_atomic(self.dir / "next_seq", f"{self._reserved}\n".encode(), sync=True)
        path = self.dir / f"{seq:016d}.open"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        os.write(fd, OPEN_MAGIC)
        self._fd, self._open_seq, self._open_path = fd, seq, path
        self._open_records, self._open_samples = [], 0
        self._open_bytes = len(OPEN_MAGIC)
        self._opened_at = self._mono()

    def append(self, record: dict[str, Any]) -> bool:
        """Write one tick record; False (and its samples counted as dropped) when the disk refused it."""
        samples = record_samples(record)
        data = frame(record)
        try:
            if self._fd is None:
                self._new_segment()
            assert self._fd is not None
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
            if self.fsync:
                os.fsync(self._fd)
        except OSError as e:
            self._undo_partial_write()
            self.stats.dropped_write += samples
            self.metrics.samples_dropped.labels("spool_write").inc(samples)
            log.error("spool: cannot append a record to %s: %s", self._open_path, e)
            return False
        self._open_records.append(record)
        self._open_samples += samples
        with self._lock:
            self._open_bytes += len(data)
        self.stats.spooled += samples
        self.metrics.samples_spooled.inc(samples)
        if self._open_samples >= self.segment_max_samples:
            self.seal()
        self._gauges()
        return True

    def _undo_partial_write(self) -> None:
        """Cut a partial frame off so the records after it stay readable on recovery."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._open_bytes)
            os.lseek(self._fd, self._open_bytes, os.SEEK_SET)
        except OSError as e:
            log.error("spool: cannot truncate %s after a failed write: %s", self._open_path, e)

    def open_age_s(self) -> float:
        """Seconds since the open segment got its first record (0 when none is open)."""
        return self._mono() - self._opened_at if self._fd is not None else 0.0

    def seal(self) -> Segment | None:
        """Turn the open segment into an immutable batch; None when nothing was open."""
        if self._fd is None:
            return None
        fd, seq, path = self._fd, self._open_seq, self._open_path
        records, samples = self._open_records, self._open_samples
        assert seq is not None and path is not None
        self._fd, self._open_seq, self._open_path = None, None, None
        self._open_records, self._open_samples = [], 0
        os.close(fd)
        seg = self._write_sealed(seq, records, samples) if records else None
        path.unlink(missing_ok=True)
        with self._lock:
            self._open_bytes = 0
        self._enforce_cap()
        self._gauges()
        return seg

    def _write_sealed(self, seq: int, records: list[dict[str, Any]], samples: int) -> Segment:
        body = self.encoder(records, self.batch_id(seq))
        data = _SEALED_HEAD.pack(SEALED_MAGIC, zlib.crc32(body)) + body
        path = self.dir / f"{seq:016d}-{samples}.seg"
        _write_atomic(path, data, sync=True)
        seg = Segment(seq, samples, path, len(data), self.batch_id(seq))
        with self._lock:
            self._sealed[seq] = seg
            self._lock.notify_all()
        return seg

    # -- the cap -----------------------------------------------------------------------------

    def _enforce_cap(self) -> None:
        dropped: list[Segment] = []
        with self._lock:
            total = self._open_bytes + sum(s.size for s in self._sealed.values())
            for seq in sorted(self._sealed):
                if total <= self.max_bytes:
                    break
                if seq in self._leased:
                    continue
                seg = self._sealed.pop(seq)
                total -= seg.size
                dropped.append(seg)
        for seg in dropped:
            seg.path.unlink(missing_ok=True)
            self.stats.dropped_full += seg.samples
            self.metrics.samples_dropped.labels("spool_full").inc(seg.samples)
        if dropped:
            self.facts_lost.set()
            log.warning(
                "spool: over its %d-byte cap; dropped the %d oldest segments (%d samples)",
                self.max_bytes,
                len(dropped),
                sum(s.samples for s in dropped),
            )

    # -- draining (shipper thread) -----------------------------------------------------------

    def wait_for_sealed(self, timeout: float) -> bool:
        """Wait until a segment is sealed, :meth:`wake` is called, or ``timeout`` passes;
        True when a segment is free to lease."""
        with self._lock:
            if not any(s not in self._leased for s in self._sealed):
                self._lock.wait(timeout)
            return any(s not in self._leased for s in self._sealed)

    def wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def lease(self) -> Segment | None:
        """The oldest sealed segment, reserved for sending (the cap will not drop it meanwhile)."""
        with self._lock:
            free = [s for s in self._sealed if s not in self._leased]
            if not free:
                return None
            seq = min(free)
            self._leased.add(seq)
            return self._sealed[seq]

    def release(self, seg: Segment) -> None:
        """Give a leased segment back unsent (it will be sent again, first)."""
        with self._lock:
            self._leased.discard(seg.seq)
        self._enforce_cap()

    def read(self, seg: Segment) -> bytes:
        """The request body of a sealed segment; :class:`CorruptSegment` when its CRC fails."""
        data = seg.path.read_bytes()
        if len(data) < _SEALED_HEAD.size:
            raise CorruptSegment(f"{seg.path.name}: {len(data)} bytes, shorter than its header")
        magic, crc = _SEALED_HEAD.unpack_from(data)
        body = data[_SEALED_HEAD.size :]
        if magic != SEALED_MAGIC or zlib.crc32(body) != crc:
            raise CorruptSegment(f"{seg.path.name}: bad magic or CRC")
        return body

    def ack(self, seg: Segment) -> None:
        """The collector stored it (or already had it): delete it."""
        seg.path.unlink(missing_ok=True)
        with self._lock:
            self._sealed.pop(seg.seq, None)
            self._leased.discard(seg.seq)
        self.stats.delivered += seg.samples
        self.metrics.samples_delivered.inc(seg.samples)
        self._gauges()

    def dead_letter(self, seg: Segment, status: str, detail: str, *, corrupt: bool = False) -> None:
        """Move a segment the collector refused for good (or that is corrupt) aside, and count it."""
        target = self.dead_dir / seg.path.name
        try:
            os.replace(seg.path, target)
            _write_atomic(
                target.with_suffix(".json"),
                json.dumps(
                    {
                        "batch_id": seg.batch_id,
                        "samples": seg.samples,
                        "status": status,
                        "detail": detail[:4000],
                        "time": time.time(),
                    }
                ).encode(),
                sync=False,
            )
        except OSError as e:
            log.error("spool: cannot move %s to %s (%s); deleting it", seg.path.name, self.dead_dir, e)
            seg.path.unlink(missing_ok=True)
        with self._lock:
            self._sealed.pop(seg.seq, None)
            self._leased.discard(seg.seq)
        if corrupt:
            self.stats.dropped_corrupt += seg.samples
            self.metrics.samples_dropped.labels("corrupt_segment").inc(seg.samples)
        else:
            self.stats.dropped_dead += seg.samples
            self.metrics.samples_dropped.labels("dead_letter").inc(seg.samples)
        self.metrics.batches_dead_lettered.labels(status).inc()
        self.facts_lost.set()
        self._trim_dead()
        self._gauges()

    def _trim_dead(self) -> None:
        segs = sorted(self.dead_dir.glob("*.seg"))
        sizes = {p: p.stat().st_size for p in segs}
        total = sum(sizes.values())
        for p in segs:
            if total <= self.dead_max_bytes:
                break
            total -= sizes[p]
            p.unlink(missing_ok=True)
            p.with_suffix(".json").unlink(missing_ok=True)

    # -- state -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the open segment's file without sealing it (a later open recovers it); release the lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def pending_samples(self) -> int:
        with self._lock:
            return self._open_samples + sum(s.samples for s in self._sealed.values())

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._open_bytes + sum(s.size for s in self._sealed.values())

    @property
    def sealed_count(self) -> int:
        with self._lock:
            return len(self._sealed)

    def _gauges(self) -> None:
        self.metrics.spool_bytes.set(self.bytes)
        self.metrics.spool_segments.set(self.sealed_count)
