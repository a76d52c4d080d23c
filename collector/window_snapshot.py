"""The detector window of a sweep shard, persisted so a new owner starts warm.

A sweep needs the last ``window_s`` of raw samples.  Re-reading them from
the sample tables is what made a new leader's first sweep slow (14 s for
10,000 GPUs on two cores: PostgreSQL aggregating 6 million rows), and
nothing was detected meanwhile.  The owner of a shard therefore writes its
in-memory window as it ages, in ``SEG_S``-second segments: for each segment
one zstd-compressed blob holding every GPU's and host's samples of those
seconds, column by column, in the cache's own float32 values.  Beside them,
one state row: the cache's watermark when the segments were written, the
batch ids it had merged by then, ``upto`` (the end of the last segment) and
``since`` (from when the segments are complete).

A new owner (:func:`restore`) reads, in one REPEATABLE READ transaction:
the segments of the window, the batches committed since the watermark that
it had not merged and that reach before ``upto`` (late and back-filled
data), and the raw samples from ``upto`` on (the last few seconds).  That is
exactly what the previous owner's cache held plus what it would have fetched
next, so detection on a restored window equals detection on the live one.

Segments are written once their seconds are ``SETTLE_S`` old; a segment that
late data changed afterwards is rewritten with the next state row, in the
same transaction, so the segments always agree with the state's watermark.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import psycopg
import zstandard

from gpufleet.collector.window_cache import GPU_COLUMNS, HOST_COLUMNS, Pending, WindowCache, _Buf

log = logging.getLogger(__name__)

#: Seconds of samples per segment: the raw tail a new owner reads is at most
#: this plus ``SETTLE_S`` plus one sweep interval.
SEG_S = 10

#: A segment is written once its last second is this old (most batches have landed).
SETTLE_S = 5.0

_FORMAT = 2


def seg_of(t: float) -> int:
    return math.floor(t / SEG_S) * SEG_S


def _pack_block(
    bufs: dict[Any, _Buf], lo: float, hi: float, ncols: int
) -> tuple[list[Any], list[int], list[int], bytes, bytes]:
    """(keys, sample counts, the columns holding any value, times, those columns' values)."""
    keys: list[Any] = []
    counts: list[int] = []
    ts: list[np.ndarray] = []
    # Runs of consecutive keys storing the same columns: (those columns, their values per key).
    # Compared as bytes: np.array_equal costs ~3 us a buffer, a third of packing a segment.
    runs: list[tuple[bytes, np.ndarray, list[np.ndarray]]] = []
    bounds = np.array([lo, hi])
    for k, b in bufs.items():
        t = b.t
        a, z = t.searchsorted(bounds, side="left").tolist()
        if z > a:
            keys.append(k)
            counts.append(z - a)
            ts.append(t[a:z])
            layout = b.rows.tobytes()
            if not runs or runs[-1][0] != layout:
                runs.append((layout, b.rows, []))
            runs[-1][2].append(b.vals[:, a:z])
    tt = np.concatenate(ts) if ts else np.zeros(0, dtype=np.float64)
    cc = np.full((ncols, len(tt)), np.nan, dtype=np.float32)
    pos = 0
    for _, rows, vals in runs:
        n = sum(v.shape[1] for v in vals)
        if len(rows):
            cc[rows, pos : pos + n] = np.concatenate(vals, axis=1)
        pos += n
    # A column no source reported in these seconds is all NaN: left out, restored as NaN.
    present = np.flatnonzero(~np.isnan(cc).all(axis=1)) if cc.shape[1] else np.zeros(0, dtype=np.int64)
    return (
        keys,
        counts,
        present.tolist(),
        tt.astype("<f8").tobytes(),
        np.ascontiguousarray(cc[present], dtype="<f4").tobytes(),
    )


def encode_segment(cache: WindowCache, lo: float, hi: float, level: int = 1) -> bytes:
    """Every sample of the cache in [lo, hi) as one compressed blob."""
    gk, gn, gp, gt, gc = _pack_block(cache.gpus, lo, hi, len(GPU_COLUMNS))
    hk, hn, hp, ht, hc = _pack_block(cache.hosts, lo, hi, len(HOST_COLUMNS))
    head = orjson.dumps(
        {
            "v": _FORMAT,
            "gcols": GPU_COLUMNS,
            "hcols": HOST_COLUMNS,
            "gnode": [k[0] for k in gk],
            "ggpu": [k[1] for k in gk],
            "gn": gn,
            "gp": gp,
            "hk": hk,
            "hn": hn,
            "hp": hp,
        }
    )
    body = b"".join((struct.pack("<I", len(head)), head, gt, gc, ht, hc))
    return zstandard.ZstdCompressor(level=level).compress(body)


@dataclass
class Block:
    """One table's samples of a segment: keys, their sample counts, times, and the present columns."""

    keys: list[Any]
    counts: np.ndarray
    t: np.ndarray
    present: list[int]
    #: (len(present), samples) float32.
    cols: np.ndarray

    def full(self, ncols: int) -> np.ndarray:
        """Every column, NaN where not present."""
        out = np.full((ncols, len(self.t)), np.nan, dtype=np.float32)
        out[self.present] = self.cols
        return out


@dataclass
class Decoded:
    gpus: Block
    hosts: Block


def decode_segment(blob: bytes) -> Decoded | None:
    """A segment's samples, or None when it was written for other columns (then nothing is restored)."""
    body = memoryview(zstandard.ZstdDecompressor().decompress(blob))
    (hl,) = struct.unpack_from("<I", body, 0)
    return _blocks_of(orjson.loads(body[4 : 4 + hl]), body, 4 + hl)


_NO_SAMPLES = np.zeros(0)


def _blocks_of(
    head: dict[str, Any],
    body: memoryview | None,
    pos: int,
    gkeys: list[Any] | None = None,
    hkeys: list[Any] | None = None,
) -> Decoded | None:
    """A segment's blocks from its header and, from ``pos`` of ``body``, its samples (no body: the
    blocks hold no samples yet); ``gkeys`` and ``hkeys``, when given, are the key lists to use."""
    if (
        head.get("v") != _FORMAT
        or tuple(head["gcols"]) != GPU_COLUMNS
        or tuple(head["hcols"]) != HOST_COLUMNS
    ):
        return None
    if gkeys is None:
        gkeys = list(zip(head["gnode"], head["ggpu"], strict=True))
    if hkeys is None:
        hkeys = head["hk"]
    out: list[Block] = []
    for keys, counts, present in ((gkeys, head["gn"], head["gp"]), (hkeys, head["hn"], head["hp"])):
        n = sum(counts)
        if body is None:
            t, c = _NO_SAMPLES, _NO_SAMPLES.reshape(0, 0)
        else:
            t = np.frombuffer(body, dtype="<f8", count=n, offset=pos)
            pos += 8 * n
            c = np.frombuffer(body, dtype="<f4", count=n * len(present), offset=pos).reshape(len(present), n)
            pos += 4 * n * len(present)
        out.append(Block(keys, np.asarray(counts, dtype=np.int64), t, present, c))
    return Decoded(out[0], out[1])


class _Stream:
    """The segments of one restore, their samples decompressed one segment at a time into one
    reused buffer while the window is assembled from them.

    Decompressing every segment first held the whole window twice: 400 MB of fresh memory
    for 10,000 GPUs, which a new owner (a process that never held the window) pays for in
    page faults before it assembles the window into another 450 MB.  Here the headers are read
    first (:meth:`blocks`: keys, counts and columns, enough to lay the window out); then the GPU
    assembly asks for each segment's samples in order (:meth:`gpu_data`), and the segment's host
    samples, small, are copied out at the same time."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs
        self.heads: list[tuple[int, dict[str, Any]]] = []
        self.gpus: list[Block] = []
        self.hosts: list[Block] = []
        self._buf = bytearray()

    def blocks(self) -> bool:
        """Read every header into header-only blocks; False when one was written for other columns.

        A header listing the same GPUs (hosts) as the one before shares its key list: consecutive
        segments of a steady fleet do, and :func:`_assemble` then recognises them by identity."""
        prev: dict[str, Any] | None = None
        for blob in self.blobs:
            with zstandard.ZstdDecompressor().stream_reader(blob) as r:
                (hl,) = struct.unpack("<I", _read_exactly(r, 4))
                head = orjson.loads(_read_exactly(r, hl))
            same_gpus = prev is not None and (head.get("gnode"), head.get("ggpu")) == (
                prev["gnode"],
                prev["ggpu"],
            )
            same_hosts = prev is not None and head.get("hk") == prev["hk"]
            d = _blocks_of(
                head,
                None,
                0,
                gkeys=self.gpus[-1].keys if same_gpus else None,
                hkeys=self.hosts[-1].keys if same_hosts else None,
            )
            if d is None:
                return False
            self.heads.append((4 + hl, head))
            self.gpus.append(d.gpus)
            self.hosts.append(d.hosts)
            prev = head
        return True

    def gpu_data(self, i: int, bl: Block) -> tuple[np.ndarray, np.ndarray]:
        start, head = self.heads[i]
        size = start + sum(sum(head[n]) * (8 + 4 * len(head[p])) for n, p in (("gn", "gp"), ("hn", "hp")))
        if len(self._buf) < size:
            self._buf = bytearray(max(size, len(self._buf) * 5 // 4))
        view = memoryview(self._buf)[:size]
        with zstandard.ZstdDecompressor().stream_reader(self.blobs[i]) as r:
            got = 0
            while got < size:
                n = r.readinto(view[got:])
                if not n:
                    raise ValueError(f"snapshot segment {i} is shorter than its header says")
                got += n
        d = _blocks_of(head, view, start, gkeys=bl.keys, hkeys=self.hosts[i].keys)
        assert d is not None
        h = d.hosts
        self.hosts[i] = Block(h.keys, h.counts, h.t.copy(), h.present, h.cols.copy())
        return d.gpus.t, d.gpus.cols


def _read_exactly(r: Any, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = r.read(n - len(out))
        if not chunk:
            raise ValueError("snapshot segment ends inside its header")
        out += chunk
    return out


def _uniform(blocks: list[Block], ncols: int) -> bool:
    """The blocks list the same keys in the same order, each with one count for all its keys,
    and store the same ``ncols`` columns."""
    first = blocks[0].keys
    for bl in blocks:
        if len(bl.present) != ncols or not (bl.keys is first or bl.keys == first):
            return False
        if len(bl.counts) and not (bl.counts == bl.counts[0]).all():
            return False
    return True


def _own_data(i: int, bl: Block) -> tuple[np.ndarray, np.ndarray]:
    return bl.t, bl.cols


def _assemble(
    blocks: list[Block],
    ncols: int,
    data: Callable[[int, Block], tuple[np.ndarray, np.ndarray]] = _own_data,
    staggered: bool = True,
) -> dict[Any, _Buf]:
    """Per-key buffers from one table's blocks, in time order.

    Every sample is written once, straight from its segment, into one array
    laid out key after key with room after each key's samples (a quarter
    more, at least 32), so the next sweeps' samples append without a copy.
    Only the columns some segment holds are stored (the buffers share that
    list); the others read as NaN.  ``data(i, block)`` gives block ``i``'s times and values,
    asked once per block, in order (:class:`_Stream` decompresses them then).  ``staggered=False``
    gives every key all of its room (bench/window_slide.py's baseline)."""
    if not blocks:
        return {}
    ids: dict[Any, int] = {}
    kid_of: list[np.ndarray] = []
    prev: tuple[list[Any] | None, np.ndarray] = (None, np.zeros(0, dtype=np.int64))
    for bl in blocks:
        if bl.keys != prev[0]:  # most segments list the same keys as the one before
            prev = (
                bl.keys,
                np.fromiter(
                    (ids.setdefault(k, len(ids)) for k in bl.keys), dtype=np.int64, count=len(bl.keys)
                ),
            )
        kid_of.append(prev[1])
    nkeys = len(ids)
    n_k = np.zeros(nkeys, dtype=np.int64)
    for bl, kid in zip(blocks, kid_of, strict=True):
        n_k += np.bincount(kid, weights=bl.counts, minlength=nkeys).astype(np.int64)
    cap_k = n_k + np.maximum(n_k // 4, 32)
    base = np.zeros(nkeys + 1, dtype=np.int64)
    np.cumsum(cap_k, out=base[1:])
    present = np.array(sorted({j for bl in blocks for j in bl.present}), dtype=np.int64)
    row = {j: r for r, j in enumerate(present.tolist())}
    absent = np.array([j for j in range(ncols) if j not in row], dtype=np.int64)
    t = np.empty(int(base[-1]), dtype=np.float64)
    c = np.empty((len(present), int(base[-1])), dtype=np.float32)
    if nkeys and _uniform(blocks, len(present)):
        # Every segment lists the same keys with as many samples each (a fleet whose GPUs all
        # report at one rate): every key's slots are one row of a (keys x capacity) view, and
        # each segment is copied in as one strided block instead of scattered sample by sample.
        t2 = t.reshape(nkeys, -1)
        c3 = c.reshape(len(present), nkeys, -1)
        at = 0
        for i, bl in enumerate(blocks):
            k = int(bl.counts[0])
            bt, bc = data(i, bl)
            t2[:, at : at + k] = bt.reshape(nkeys, k)
            c3[:, :, at : at + k] = bc.reshape(len(present), nkeys, k)
            at += k
        blocks, kid_of = [], []
    # Each sample goes to its key's slot, after the key's samples of earlier segments.
    filled = base[:-1].copy()
    for i, (bl, kid) in enumerate(zip(blocks, kid_of, strict=True)):
        bt, bc = data(i, bl)
        n = len(bt)
        piece = np.zeros(len(kid) + 1, dtype=np.int64)
        np.cumsum(bl.counts, out=piece[1:])
        dest = np.repeat(filled[kid] - piece[:-1], bl.counts) + np.arange(n)
        filled[kid] += bl.counts
        t[dest] = bt
        if len(bl.present) == len(present):
            c[:, dest] = bc
        else:
            have = np.array([row[j] for j in bl.present], dtype=np.int64)
            c[np.ix_(np.setdiff1d(np.arange(len(present)), have), dest)] = np.nan
            c[np.ix_(have, dest)] = bc
    # Times must rise within each key (segments never overlap); a key where they do not is rebuilt by merging.
    out: dict[Any, _Buf] = {}
    starts = base[:-1]
    ends = starts + n_k
    ok = np.ones(nkeys, dtype=bool)
    if int(n_k.sum()) > 1:
        rise = np.ones(len(t), dtype=bool)
        rise[1:] = t[1:] > t[:-1]
        rise[starts] = True
        bad_pos = np.flatnonzero(~rise)
        if bad_pos.size:
            owner = np.searchsorted(starts, bad_pos, side="right") - 1
            ok[owner[bad_pos < ends[owner]]] = False
    # Each key uses between half and all of its room (golden-ratio steps), so that the restored
    # buffers run out of room, and move their samples, over many sweeps rather than in one.
    spare = cap_k - n_k
    unused = ((np.arange(nkeys) * 0.6180339887498949) % 1.0 * (spare // 2)).astype(np.int64) * staggered
    for k, i in ids.items():
        a, z, n = int(starts[i]), int(base[i + 1] - unused[i]), int(n_k[i])
        if ok[i]:
            out[k] = _Buf.adopt(t[a:z], c[:, a:z], n, present, absent)
        else:  # sorted, the first of equal times kept
            _, first = np.unique(t[a : a + n], return_index=True)
            full = np.full((ncols, len(first)), np.nan, dtype=np.float32)
            full[present] = c[:, a : a + n][:, first]
            out[k] = _Buf(t[a : a + n][first], full)
    return out


def _seen_blob(seen: dict[str, datetime]) -> bytes:
    return zstandard.ZstdCompressor(level=1).compress(
        orjson.dumps([[k, v.timestamp()] for k, v in seen.items()])
    )


def _seen_load(blob: bytes, tz: Any) -> dict[str, datetime]:
    return {
        k: datetime.fromtimestamp(v, tz)
        for k, v in orjson.loads(zstandard.ZstdDecompressor().decompress(blob))
    }


@dataclass
class WindowSnapshots:
    """Writes and restores one shard's window (``shards`` shards in all; 1: the whole fleet)."""

    shard: int = 0
    shards: int = 1
    #: End of the last segment written (exclusive), epoch seconds.
    upto: float | None = None
    #: From when the written segments hold every sample (epoch seconds).
    since: float = 0.0
    dirty: set[int] = field(default_factory=set)
    #: Segments written again because late data changed them, since this object was made.
    rewritten: int = 0
    #: Samples the last restore took from the snapshot (not from the sample tables).
    restored_samples: int = 0
    #: ``upto`` of the snapshot the last restore read: the raw tail starts there.
    restored_upto: float = 0.0
    last: dict[str, float] = field(default_factory=dict)

    def invalidate(self) -> None:
        """Every segment written is to be written again (the cache took in the whole window of more nodes)."""
        if self.upto is not None:
            self.dirty.update(range(seg_of(self.since), int(self.upto), SEG_S))

    def note_fresh(self, cache: WindowCache) -> None:
        """Segments already written that the last refresh merged new samples into."""
        if self.upto is None:
            return
        for _, t0, t1 in cache.last_fresh:
            if t0 < self.upto:
                for s in range(seg_of(t0), seg_of(min(t1, self.upto - 1e-6)) + SEG_S, SEG_S):
                    self.dirty.add(s)

    def save(self, conn: psycopg.Connection, cache: WindowCache, now: float) -> int:
        """Write the segments that aged since the last call and those late data changed; returns how many."""
        if not cache.loaded or cache.watermark is None or cache.loaded_from is None:
            return 0
        self.note_fresh(cache)
        first = seg_of(max(cache.loaded_from, now - cache.window_s))
        end = seg_of(now - SETTLE_S)  # segments [.., end) are complete
        if self.upto is not None and self.upto > end:
            end = int(self.upto)
        start = first if self.upto is None else max(first, int(self.upto))
        again = {s for s in self.dirty if first <= s < start}
        segs = sorted({*range(start, end, SEG_S), *again})
        if not segs:
            return 0
        t0 = time.perf_counter()
        blobs = [(s, encode_segment(cache, float(s), float(s + SEG_S))) for s in segs]
        since = max(cache.loaded_from, float(first)) if self.upto is None else self.since
        with conn.transaction():
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO sweep_snapshots (shards, shard, seg, blob) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (shards, shard, seg) DO UPDATE SET blob = EXCLUDED.blob",
                    [(self.shards, self.shard, s, b) for s, b in blobs],
                )
            conn.execute(
                "DELETE FROM sweep_snapshots WHERE shards = %s AND shard = %s AND seg < %s",
                (self.shards, self.shard, seg_of(now - cache.window_s) - SEG_S),
            )
            conn.execute(
                "INSERT INTO sweep_snapshot_state (shards, shard, watermark, upto, since, seen) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (shards, shard) DO UPDATE SET "
                "watermark = EXCLUDED.watermark, upto = EXCLUDED.upto, since = EXCLUDED.since, "
                "seen = EXCLUDED.seen, written_at = now()",
                (self.shards, self.shard, cache.watermark, float(end), since, _seen_blob(cache.seen)),
            )
        self.upto, self.since = float(end), since
        self.dirty.clear()
        self.rewritten += len(again)
        self.last = {
            "segments": len(blobs),
            "bytes": sum(len(b) for _, b in blobs),
            "save_s": time.perf_counter() - t0,
        }
        return len(blobs)

    def restore(self, conn: psycopg.Connection, cache: WindowCache, now: float) -> int | None:
        """Load ``cache`` from the snapshot and the raw tail; returns the rows read from the sample
        tables (``restored_samples``: those from the snapshot), or None (cache untouched) when
        no snapshot covers the window: then the caller loads the window from the sample tables."""
        t_lo = now - cache.window_s
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            st = conn.execute(
                "SELECT watermark, upto, since, seen FROM sweep_snapshot_state "
                "WHERE shards = %s AND shard = %s",
                (self.shards, self.shard),
            ).fetchone()
            if st is None:
                return None
            watermark, upto, since, seen_raw = st
            if since > t_lo or upto < t_lo:
                return None
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(
                    "SELECT seg, blob FROM sweep_snapshots WHERE shards = %s AND shard = %s "
                    "AND seg >= %s AND seg < %s ORDER BY seg",
                    (self.shards, self.shard, seg_of(t_lo), upto),
                ).fetchall()
            stream = _Stream([b for _, b in rows])
            before = cache.seen, cache.watermark
            try:
                if not stream.blocks():
                    return None
                cache.seen = _seen_load(seen_raw, watermark.tzinfo)
                cache.watermark = watermark
                nodes = {k[0] for bl in stream.gpus for k in bl.keys} | {
                    k for bl in stream.hosts for k in bl.keys
                }
                # The database reads the late batches and the raw tail while the window is assembled
                # here (the reads touch no buffer); their rows are merged after it, as catch_up would.
                pending: list[Pending] = []
                with ThreadPoolExecutor(1) as pool:
                    reading = pool.submit(cache.read_tail, conn, now, upto, nodes, pending)
                    gpus = _assemble(stream.gpus, len(GPU_COLUMNS), stream.gpu_data)
                    hosts = _assemble(stream.hosts, len(HOST_COLUMNS))
                    reading.result()
            except (ValueError, zstandard.ZstdError) as e:
                # A damaged snapshot must not stop detection: this owner reads the raw samples.
                log.warning(
                    "the persisted window of sweep shard %d of %d cannot be read (%s); reading the "
                    "window from the sample tables instead",
                    self.shard,
                    self.shards,
                    e,
                )
                cache.seen, cache.watermark = before
                return None
            cache.gpus, cache.hosts = gpus, hosts
            restored = int(sum(int(bl.counts.sum()) for bl in stream.gpus + stream.hosts))
            n = cache.merge_pending(pending)
            cache.trim(now - cache.window_s)
        cache.loaded, cache.loaded_from = True, since
        self.upto, self.since = upto, since
        self.dirty.clear()
        self.restored_samples, self.restored_upto = restored, float(upto)
        return n
