"""The samples detectors look at, held in memory and refreshed incrementally.

A sweep every few seconds over the last ten minutes of a large fleet cannot
re-read millions of rows each time.  The leader loads the window once, then
each sweep fetches only the batches committed since the previous one (found
through ``ingest_batches``, so late and back-filled data arrive too) and
drops samples older than the window.

Samples are read one row per GPU (or host): its times and all its columns as
PostgreSQL binary arrays (NULL as NaN), which numpy parses a whole read at a
time (:func:`merge_rows`): no Python object per sample.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

from gpufleet.collector.brin_tail import BrinTail
from gpufleet.collector.detectors.fabric import FABRIC_COLUMNS
from gpufleet.collector.detectors.window import RunInfo, Series, Window
from gpufleet.store import run_model

log = logging.getLogger(__name__)

#: GPU columns the detectors read (see collector/detectors).
GPU_COLUMNS = (
    "util_pct",
    "sm_active",
    "tensor_active",
    "dram_active",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "temp_c",
    "throttle_reasons",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
    "xid",
    "nvlink_tx_bytes_s",
    "nvlink_rx_bytes_s",
    "nvlink_links_up",
    "nvlink_links_max",
    "nvlink_crc_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "ecc_sbe_vol",
    "ecc_dbe_vol",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "pcie_replay_count",
    "job_cpu_cores",
    "job_cpu_quota_cores",
    "job_cpu_throttled_share",
    "job_cpu_pressure_pct",
    "job_io_pressure_pct",
)
HOST_COLUMNS = (
    "cpu_user_pct",
    "cpu_system_pct",
    "cpu_iowait_pct",
    "cpu_idle_pct",
    "cpu_count",
    "disk_read_bytes_s",
    "disk_write_bytes_s",
    "disk_util_pct",
    "disk_await_ms",
    "net_rx_bytes_s",
    "net_tx_bytes_s",
    "host_power_w",
    *FABRIC_COLUMNS,
)

#: Array type OIDs (pg_type) of the column kinds, and timestamptz[].
_PG_ARRAY = {"real": 1021, "double": 1022, "smallint": 1005, "integer": 1007, "bigint": 1016}
TIMESTAMPTZ_ARRAY = 1185


class _RawLoader(Loader):
    """Leave a binary array as bytes for :func:`merge_rows`."""

    format = Format.BINARY

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


#: Nodes per query of a cold load, to bound the server's aggregation memory.  A read of a
#: shorter span takes proportionally more nodes per query (the same samples at most): each
#: query scans the span's rows of every node, so a steady sweep's few seconds of a large
#: fleet are one query, not one per 250 nodes.
NODES_PER_QUERY = 250

#: Commits can land slightly out of ``received_at`` order; batches this much
#: older than the watermark are looked at again (and skipped if already seen).
COMMIT_SLACK_S = 60.0

#: Most batch ids remembered as merged (a bound on memory, not needed for correctness).
MAX_SEEN = 200_000


#: Every node name in the sample tables, by a skip scan of their indexes
#: (one probe per node instead of reading every row).
DISTINCT_NODES_SQL = """
WITH RECURSIVE g AS (
  SELECT min(node) AS n FROM gpu_samples
  UNION ALL SELECT (SELECT min(node) FROM gpu_samples WHERE node > g.n) FROM g WHERE g.n IS NOT NULL
), h AS (
  SELECT min(node) AS n FROM host_samples
  UNION ALL SELECT (SELECT min(node) FROM host_samples WHERE node > h.n) FROM h WHERE h.n IS NOT NULL
)
SELECT n FROM g WHERE n IS NOT NULL UNION SELECT n FROM h WHERE n IS NOT NULL"""


def _select(table: str, cols: tuple[str, ...], gpu: bool, where: str, unread: tuple[str, ...] = ()) -> str:
    """One row per GPU (or host): its sample times, and the columns ``cols`` packed
    into one 2-D float4 array (samples x columns, NULL as NaN) that numpy reads
    in a single call; with ``unread``, a last field saying whether any of those
    other columns holds a value in the group (:meth:`WindowCache._read_held`).

    No ORDER BY is needed: both aggregates of a group see the rows in the
    same order, and times are sorted on arrival."""
    vals = ", ".join(f"COALESCE({c}::float4, 'NaN'::float4)" for c in cols)
    key = "s.node" + (", s.gpu" if gpu else "")
    mig = " AND s.mig_instance IS NULL" if gpu else ""
    probe = (", bool_or(" + " OR ".join(f"s.{c} IS NOT NULL" for c in unread) + ")") if unread else ""
    return (
        f"SELECT {key}, array_agg(s.time), array_agg(ARRAY[{vals}]){probe} FROM {table} s "
        f"WHERE {where}{mig} GROUP BY {key}"
    )


def held_select(table: str, columns: tuple[str, ...], gpu: bool, where: str, held: np.ndarray) -> str:
    """:func:`_select` of the columns ``held`` (indexes into ``columns``), probing the others."""
    keep = set(held.tolist())
    return _select(
        table,
        tuple(columns[j] for j in held),
        gpu,
        where,
        tuple(c for j, c in enumerate(columns) if j not in keep),
    )


def raw_cursor(conn: psycopg.Connection) -> psycopg.Cursor[Any]:
    """A binary cursor that leaves the sample arrays as PostgreSQL sent them, for :func:`merge_rows`."""
    cur = conn.cursor(binary=True)
    cur.adapters.register_loader(TIMESTAMPTZ_ARRAY, _RawLoader)
    cur.adapters.register_loader(_PG_ARRAY["real"], _RawLoader)
    return cur


def execute_read(cur: psycopg.Cursor[Any], query: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
    """Send a window read, never prepared.  A sweep sends the same read every few seconds, so the
    driver would prepare it after five, and PostgreSQL would then settle on a generic plan, made
    without knowing that the time range is the last few seconds: at 10,000 GPUs a steady refresh's
    GPU read took 0.47 s instead of 0.20 s from the sixth sweep on (``bench/sweep.py``:
    ``refresh_read_prepared_s`` against ``refresh_read_s``)."""
    return cur.execute(query, params, prepare=False)


def held_columns(bufs: dict[Any, _Buf]) -> np.ndarray | None:
    """Indexes of the columns some buffer stores (sorted), None for no buffer."""
    if not bufs:
        return None
    layouts: dict[bytes, np.ndarray] = {}
    for b in bufs.values():
        layouts.setdefault(b.rows.tobytes(), b.rows)
    return np.unique(np.concatenate(list(layouts.values())))


PG_EPOCH_US = 946684800 * 1_000_000


_STAGGER = itertools.count()


def stagger(n: int) -> int:
    """Extra room for a new buffer of ``n`` samples, 0 to n/2 and different from one buffer to
    the next (golden-ratio steps; with the 7/4 n every buffer has, twice ``n`` on average):
    buffers filled at one pace would otherwise all run out of room in the same sweep, and that
    sweep would copy the whole window."""
    return int((next(_STAGGER) * 0.6180339887498949) % 1.0 * (n // 2 + 1))


class Pending(NamedTuple):
    """One GPU's (``gpu``) or host's row of a read, still as PostgreSQL sent its arrays."""

    gpu: bool
    key: Any
    t: bytes
    m: bytes


class _Buf:
    """Samples of one GPU or host, sorted by time, with room to append.

    Only the columns that ever held a value are stored (``rows``, indexes
    into the table's columns, with their values in ``_c``); the others read
    as NaN.  Most fleets report well under half the detector columns (no
    DCGM profiling, no NVLink, no job cgroup), so this is most of the
    window's memory, and of what a new owner rebuilds.

    New samples usually come after the last ones: they are written into
    spare capacity, and old ones are dropped by moving the start, so a
    steady-state sweep copies only what arrived, not the whole window.
    """

    __slots__ = ("_c", "_t", "a", "absent", "b", "ncols", "rows")

    def __init__(self, t: np.ndarray, cols: np.ndarray) -> None:
        """From every column (``cols``: columns x samples, NaN where none)."""
        empty = np.isnan(cols).all(axis=1)
        self.rows, self.absent, self.ncols = np.flatnonzero(~empty), np.flatnonzero(empty), cols.shape[0]
        cap = max(16, 7 * len(t) // 4 + stagger(len(t)))
        self._t = np.empty(cap, dtype=np.float64)
        self._c = np.empty((len(self.rows), cap), dtype=np.float32)
        self.a, self.b = 0, len(t)
        self._t[: self.b] = t
        self._c[:, : self.b] = cols[self.rows]

    @classmethod
    def adopt(cls, t: np.ndarray, vals: np.ndarray, n: int, rows: np.ndarray, absent: np.ndarray) -> _Buf:
        """Take arrays as they are (no copy): their first ``n`` samples, sorted, and spare room after;
        ``vals`` holds the columns ``rows``, ``absent`` lists the others (buffers may share both)."""
        b = cls.__new__(cls)
        b._t, b._c, b.a, b.b, b.rows, b.absent = t, vals, 0, n, rows, absent
        b.ncols = len(rows) + len(absent)
        return b

    @property
    def t(self) -> np.ndarray:
        return self._t[self.a : self.b]

    @property
    def vals(self) -> np.ndarray:
        """The stored columns' samples (len(rows) x samples, a view)."""
        return self._c[:, self.a : self.b]

    @property
    def cols(self) -> np.ndarray:
        """Every column (columns x samples, NaN for those not stored): a copy."""
        out = np.full((self.ncols, self.b - self.a), np.nan, dtype=np.float32)
        out[self.rows] = self.vals
        return out

    def _reserve(self, extra: int) -> None:
        n = self.b - self.a
        if self.b + extra <= len(self._t):
            return
        if len(self._t) - (n + extra) >= max(n // 8, 16):
            # The room trimmed off the front is enough: move the samples back to the start of the
            # arrays they are in.  A window that slides at a steady pace lives in the same memory
            # for good, instead of every buffer asking for twice its size at once.
            self._t[:n] = self._t[self.a : self.b]
            self._c[:, :n] = self._c[:, self.a : self.b]
            self.a, self.b = 0, n
            return
        cap = max(len(self._t), 7 * (n + extra) // 4 + stagger(n + extra))
        t, c = np.empty(cap, dtype=np.float64), np.empty((self._c.shape[0], cap), dtype=np.float32)
        t[:n], c[:, :n] = self._t[self.a : self.b], self._c[:, self.a : self.b]
        self._t, self._c, self.a, self.b = t, c, 0, n

    def _widen(self, rows: np.ndarray) -> None:
        """Store columns ``rows`` too (NaN for the samples held so far)."""
        keep = np.union1d(self.rows, rows)
        c = np.full((len(keep), len(self._t)), np.nan, dtype=np.float32)
        c[np.searchsorted(keep, self.rows), self.a : self.b] = self._c[:, self.a : self.b]
        self._c, self.rows = c, keep
        self.absent = np.setdiff1d(np.arange(self.ncols), keep)

    def appends_at(self, t0: float) -> bool:
        """Samples from ``t0`` on come after every sample held (or none is held)."""
        return self.b == self.a or t0 > self._t[self.b - 1]

    def append(self, t: np.ndarray, vals: np.ndarray) -> None:
        """Add samples after the last one (:meth:`appends_at`): ``vals`` holds the stored columns
        (``rows``) alone; the caller has made sure the others hold no value."""
        self._reserve(len(t))
        self._t[self.b : self.b + len(t)] = t
        self._c[:, self.b : self.b + len(t)] = vals
        self.b += len(t)

    def merge(self, t: np.ndarray, cols: np.ndarray, present: np.ndarray | None = None) -> None:
        """Add samples (``cols``: every column x samples, NaN where none; ``present``, when the
        caller knows it: which columns hold any value)."""
        if len(t) == 0:
            return
        if self.b == self.a or t[0] > self._t[self.b - 1]:
            if len(self.absent):
                new = (
                    present[self.absent] if present is not None else ~np.isnan(cols[self.absent]).all(axis=1)
                )
                if new.any():
                    self._widen(self.absent[new])
            self._reserve(len(t))
            self._t[self.b : self.b + len(t)] = t
            self._c[:, self.b : self.b + len(t)] = cols[self.rows]
            self.b += len(t)
            return
        # Out of order or overlapping (a re-fetch, a back-fill): merge and de-duplicate.
        allt = np.concatenate([self.t, t])
        allc = np.concatenate([self.cols, cols], axis=1)
        order = np.argsort(allt, kind="stable")
        allt, allc = allt[order], allc[:, order]
        keep = np.ones(len(allt), dtype=bool)
        keep[1:] = allt[1:] != allt[:-1]
        self.__init__(allt[keep], allc[:, keep])  # type: ignore[misc]

    def trim(self, t_min: float) -> None:
        # A steady sweep drops the few oldest samples: looked at as Python floats, that costs half
        # of a search over the whole buffer (10 against 22 ms at 10,000 GPUs); more have aged only
        # after a pause.
        a = self.a
        for k, v in enumerate(self._t[a : min(a + 8, self.b)].tolist()):
            if v >= t_min:
                self.a = a + k
                return
        self.a += int(np.searchsorted(self._t[a : self.b], t_min, side="left"))

    def __len__(self) -> int:
        return self.b - self.a


_T_REC = np.dtype([("l", ">i4"), ("v", ">i8")])
_M_REC = np.dtype([("l", ">i4"), ("v", ">f4")])

#: Most samples parsed in one go by :func:`merge_rows` (bounds the copies it makes: ~80 MB).
MERGE_CHUNK_SAMPLES = 262_144


def merge_rows(
    bufs: dict[Any, _Buf], rows: list[tuple[Any, bytes, bytes]], ncols: int, cols: np.ndarray | None = None
) -> int:
    """Merge rows of :func:`_select` (key, its times, its values, as PostgreSQL sent the arrays)
    into ``bufs``, in order; returns the samples merged.  ``cols``: the indexes, among the
    table's ``ncols`` columns, of those the rows hold (None: all); the others read as NaN.

    The rows are parsed together, one numpy read of all their times and one of all their
    values, not a few numpy calls per row: a steady sweep of 10,000 GPUs merges 11,000 rows of
    a few samples each, and parsing them one by one was most of its refresh."""
    n = 0
    chunk: list[tuple[Any, bytes, bytes]] = []
    size = 0
    for r in rows:
        chunk.append(r)
        size += int.from_bytes(r[1][12:16], "big")
        if size >= MERGE_CHUNK_SAMPLES:
            n += _merge_chunk(bufs, chunk, ncols, cols)
            chunk, size = [], 0
    return n + _merge_chunk(bufs, chunk, ncols, cols)


def _merge_chunk(
    bufs: dict[Any, _Buf],
    rows: list[tuple[Any, bytes, bytes]],
    ncols: int,
    cols_read: np.ndarray | None = None,
) -> int:
    if not rows:
        return 0
    if any(int.from_bytes(t_raw[4:8], "big") for _, t_raw, _ in rows):
        raise ValueError("a sample time is NULL")  # the schema forbids it
    counts = np.fromiter(
        (int.from_bytes(t_raw[12:16], "big") for _, t_raw, _ in rows), dtype=np.int64, count=len(rows)
    )
    total = int(counts.sum())
    # Headers off (1-D: 20 bytes, 2-D: 28); what is left is (length, value) records end to end.
    tb = b"".join([memoryview(t_raw)[20:] for _, t_raw, _ in rows])
    mb = b"".join([memoryview(m_raw)[28:] for _, _, m_raw in rows])
    width = ncols if cols_read is None else len(cols_read)
    if len(tb) != _T_REC.itemsize * total or len(mb) != _M_REC.itemsize * total * width:
        raise ValueError("sample arrays of an unexpected shape")  # _select makes neither
    t_all = (np.frombuffer(tb, dtype=_T_REC)["v"].astype(np.float64) + PG_EPOCH_US) / 1e6
    # Column-major (columns x samples): each row's values are then a slice of it, as a buffer stores them.
    vals = np.frombuffer(mb, dtype=_M_REC)["v"].reshape(total, width).T.astype(np.float32, order="C")
    read = np.arange(ncols) if cols_read is None else np.asarray(cols_read, dtype=np.int64)
    del tb, mb
    starts = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    # Rows whose times fall somewhere (a fall at a row's first sample is only the row boundary).
    falls = np.flatnonzero(t_all[1:] < t_all[:-1]) + 1
    owner = np.searchsorted(starts, falls, side="right") - 1
    if (falls != starts[owner]).any():
        # PostgreSQL aggregates a group's samples in the order it scanned them, which is often
        # not time order: sort every row of the chunk at once (stable: equal times keep their
        # order), so that each row is a slice that appends as it is.
        row_of = np.repeat(np.arange(len(rows)), counts)
        order = np.lexsort((t_all, row_of))
        t_all, vals = t_all[order], vals[:, order]
    nonempty = np.flatnonzero(counts > 0)
    # Which of the read columns hold a value in each row (a buffer starts storing those it lacked).
    present = np.zeros((len(rows), width), dtype=bool)
    if total:
        present[nonempty] = np.logical_or.reduceat(~np.isnan(vals), starts[nonempty], axis=1).T
    pos = starts.tolist()
    first = t_all[np.minimum(starts[:-1], max(total - 1, 0))].tolist() if total else []
    layouts: dict[bytes, tuple[np.ndarray | None, np.ndarray] | None] = {}
    for i, (key, _, _) in enumerate(rows):
        a, b = pos[i], pos[i + 1]
        if a == b:
            continue
        buf = bufs.get(key)
        if buf is not None and buf.appends_at(first[i]):
            # The usual case: samples after the buffer's last one.  Its stored columns are picked
            # from the read ones, and the read ones it lacks are checked for a value: once per
            # layout (buffers of a fleet share a few), not per row.
            shape = buf.rows.tobytes()
            if shape not in layouts:
                layouts[shape] = _layout(buf, read)
            lay = layouts[shape]
            if lay is not None and not (len(lay[1]) and present[i, lay[1]].any()):
                buf.append(t_all[a:b], vals[:, a:b] if lay[0] is None else vals[lay[0], a:b])
                continue
        t, cols = t_all[a:b], _every_column(vals[:, a:b], read, ncols)
        if buf is None:
            bufs[key] = _Buf(t, cols)
        else:
            buf.merge(t, cols)
    return total


def _every_column(vals: np.ndarray, read: np.ndarray, ncols: int) -> np.ndarray:
    """Values of the columns ``read`` as every column (the others NaN)."""
    if len(read) == ncols:
        return vals
    out = np.full((ncols, vals.shape[1]), np.nan, dtype=np.float32)
    out[read] = vals
    return out


def _layout(buf: _Buf, read: np.ndarray) -> tuple[np.ndarray | None, np.ndarray] | None:
    """Where a buffer's stored columns lie among the ``read`` ones (None: all of them, in order),
    and where the read columns it does not store lie; None when it stores one that was not read
    (the general merge then gives that column NaN for the new samples)."""
    at = np.searchsorted(read, buf.rows)
    if len(buf.rows) and (at.max() >= len(read) or (read[np.minimum(at, len(read) - 1)] != buf.rows).any()):
        return None
    lacks = np.flatnonzero(~np.isin(read, buf.rows))
    return (None if len(at) == len(read) else at), lacks


@dataclass
class WindowCache:
    window_s: float
    gpus: dict[tuple[str, int], _Buf] = field(default_factory=dict)
    hosts: dict[str, _Buf] = field(default_factory=dict)
    watermark: datetime | None = None
    #: Batch ids already merged, with their ``received_at``.  A refresh re-reads
    #: what arrived since ``watermark - COMMIT_SLACK_S`` and skips these; an id
    #: received before that is never read again, so it is dropped (keeping the
    #: last 200,000 whatever their age grew the leader by ~140 B per batch for
    #: hours: ~28 MB at 50 nodes after 5.5 h).
    seen: dict[str, datetime] = field(default_factory=dict)
    loaded: bool = False
    #: From when the cache holds every sample (the start of its first load), epoch seconds.
    loaded_from: float | None = None
    #: Only nodes this accepts are read (a sweep shard's nodes); None: every node.
    node_filter: Callable[[str], bool] | None = None
    #: (node, t_min, t_max) of the batches the last refresh merged, epoch seconds.
    last_fresh: list[tuple[str, float, float]] = field(default_factory=list)
    #: The time indexes' newest ranges, summarized before each read (plain PostgreSQL).
    brin: BrinTail = field(default_factory=BrinTail)

    # -- loading ---------------------------------------------------------------

    def _ingest(
        self,
        conn: psycopg.Connection,
        nodes: list[str],
        where: str,
        params: dict[str, Any],
        span_s: float | None = None,
        defer: list[Pending] | None = None,
    ) -> int:
        """Merge the rows ``where`` selects of ``nodes``, which lie in ``span_s`` seconds (None: a window);
        with ``defer``, append them there unparsed instead (for :meth:`merge_pending`)."""
        n = 0
        span = self.window_s if span_s is None else max(span_s, 1.0)
        per_query = int(NODES_PER_QUERY * max(1.0, self.window_s / span))
        for k in range(0, len(nodes), per_query):
            p = {**params, "nodes": nodes[k : k + per_query]}
            with raw_cursor(conn) as cur:
                if defer is not None:
                    for node, gpu, t, m in execute_read(
                        cur, _select("gpu_samples", GPU_COLUMNS, True, where), p
                    ):
                        defer.append(Pending(True, (node, int(gpu)), t, m))
                        n += int.from_bytes(t[12:16], "big")
                    for node, t, m in execute_read(
                        cur, _select("host_samples", HOST_COLUMNS, False, where), p
                    ):
                        defer.append(Pending(False, node, t, m))
                        n += int.from_bytes(t[12:16], "big")
                    continue
                n += self._read_held(cur, self.gpus, "gpu_samples", GPU_COLUMNS, where, p)
                n += self._read_held(cur, self.hosts, "host_samples", HOST_COLUMNS, where, p)
        return n

    def _read_held(
        self,
        cur: psycopg.Cursor[Any],
        bufs: dict[Any, _Buf],
        table: str,
        columns: tuple[str, ...],
        where: str,
        p: dict[str, Any],
    ) -> int:
        """Read and merge the rows ``where`` selects, only the columns the buffers already store.

        Most fleets report well under half the columns: the others cost PostgreSQL an array
        element per sample and value to build and send, for nothing (a steady sweep at
        10,000 GPUs reporting 15 of the 35 GPU columns: 0.17 s instead of 0.22 s for the read).
        The same query says, per GPU or host, whether any other column holds a value; those
        (a source that starts reporting a new field) are read again with every column, and
        only then merged, so no value is ever dropped."""
        gpu = table == "gpu_samples"

        def key(r: tuple[Any, ...]) -> Any:
            return (r[0], int(r[1])) if gpu else r[0]

        def every_column(where: str, p: dict[str, Any]) -> list[tuple[Any, bytes, bytes]]:
            return [(key(r), r[-2], r[-1]) for r in execute_read(cur, _select(table, columns, gpu, where), p)]

        held = held_columns(bufs)
        if held is None or len(held) in (0, len(columns)):  # nothing to leave out, or nothing to ask for
            return merge_rows(bufs, every_column(where, p), len(columns))
        narrow: list[tuple[Any, bytes, bytes]] = []
        more: set[Any] = set()
        for r in execute_read(cur, held_select(table, columns, gpu, where, held), p):
            if r[-1]:
                more.add(key(r))
            else:
                narrow.append((key(r), r[-3], r[-2]))
        n = merge_rows(bufs, narrow, len(columns), held)
        if more:
            nodes = sorted({k[0] for k in more} if gpu else more)
            full = every_column(f"({where}) AND s.node = ANY(%(more)s)", {**p, "more": nodes})
            n += merge_rows(bufs, [r for r in full if r[0] in more], len(columns))
        return n

    def merge_pending(self, rows: list[Pending]) -> int:
        """Merge rows an earlier read deferred, in their order."""
        return merge_rows(
            self.gpus, [(r.key, r.t, r.m) for r in rows if r.gpu], len(GPU_COLUMNS)
        ) + merge_rows(self.hosts, [(r.key, r.t, r.m) for r in rows if not r.gpu], len(HOST_COLUMNS))

    def load(self, conn: psycopg.Connection, t_start: float, t_end: float, summarize: bool = True) -> int:
        """Cold load of every sample in [t_start, t_end].  ``summarize=False`` on a hot standby, which
        cannot summarize the time index (its index follows the primary's, which the caller summarizes)."""
        lo, hi = datetime.fromtimestamp(t_start, UTC), datetime.fromtimestamp(t_end, UTC)
        if summarize:
            self.brin.catch_up(conn)
        nodes = [r[0] for r in conn.execute(DISTINCT_NODES_SQL).fetchall()]
        if self.node_filter is not None:
            nodes = [x for x in nodes if self.node_filter(x)]
        self.watermark = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        n = self._ingest(
            conn,
            sorted(nodes),
            "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
            {"lo": lo, "hi": hi},
        )
        self.loaded, self.loaded_from = True, t_start
        self.last_fresh = []
        return n

    def add_nodes(self, conn: psycopg.Connection, nodes: set[str], now: float) -> int:
        """Read the window of nodes the cache starts to hold (a sweep shard's run moved onto them).

        Their batches were skipped by earlier refreshes (they were filtered
        out, so never remembered as merged); those read here are read again
        by the next refresh and de-duplicated on merge."""
        if not nodes:
            return 0
        return self._ingest(
            conn,
            sorted(nodes),
            "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
            {
                "lo": datetime.fromtimestamp(now - self.window_s, UTC),
                "hi": datetime.fromtimestamp(now + 3600, UTC),
            },
        )

    def drop_nodes(self, keep: Callable[[str], bool]) -> None:
        """Forget the samples of nodes the cache no longer holds."""
        for gk in [k for k in self.gpus if not keep(k[0])]:
            del self.gpus[gk]
        for hk in [k for k in self.hosts if not keep(k)]:
            del self.hosts[hk]

    def _batches_since(
        self, conn: psycopg.Connection
    ) -> tuple[datetime, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """(database time, every batch received since the watermark less the slack, those not merged yet);
        the listed ones are remembered as merged."""
        assert self.watermark is not None
        since = self.watermark - timedelta(seconds=COMMIT_SLACK_S)
        db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        batches = conn.execute(
            "SELECT batch_id, node, t_min, t_max, received_at FROM ingest_batches "
            "WHERE received_at >= %s AND t_min IS NOT NULL",
            (since,),
        ).fetchall()
        if self.node_filter is not None:
            batches = [b for b in batches if self.node_filter(b[1])]
        self.seen = {bid: at for bid, at in self.seen.items() if at >= since}
        fresh = [b for b in batches if b[0] not in self.seen]
        for b in fresh:
            self.seen[b[0]] = b[4]
        while len(self.seen) > MAX_SEEN:  # a backlog drained all at once; a re-read is only wasted work
            del self.seen[next(iter(self.seen))]
        return db_now, batches, fresh

    def _fetch(
        self,
        conn: psycopg.Connection,
        fresh: list[tuple[Any, ...]],
        lo_keep: float,
        defer: list[Pending] | None = None,
    ) -> int:
        # Fresh batches cluster in time (usually the last few seconds); each
        # cluster is one time-range scan filtered by node, which the time
        # index serves however long the retention.  Re-fetched samples are
        # de-duplicated on merge.
        spans = sorted((t0, t1, node) for _, node, t0, t1, _ in fresh if t1.timestamp() >= lo_keep)
        self.last_fresh = [(node, t0.timestamp(), t1.timestamp()) for t0, t1, node in spans]
        clusters: list[tuple[datetime, datetime, set[str]]] = []
        for t0, t1, node in spans:
            if clusters and (t0 - clusters[-1][1]).total_seconds() <= 60:
                lo, hi, names = clusters[-1]
                names.add(node)
                clusters[-1] = (lo, max(hi, t1), names)
            else:
                clusters.append((t0, t1, {node}))
        n = 0
        for lo, hi, names in clusters:
            n += self._ingest(
                conn,
                sorted(names),
                "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
                {"lo": lo, "hi": hi},
                (hi - lo).total_seconds(),
                defer,
            )
        return n

    def catch_up(self, conn: psycopg.Connection, now: float, upto: float, nodes: set[str]) -> int:
        """After a restore of every sample before ``upto`` as of the watermark: merge the batches
        committed since that reach before ``upto``, and read every sample from ``upto`` on (run in the
        same REPEATABLE READ transaction as the restore, so nothing falls between the two)."""
        rows: list[Pending] = []
        self.read_tail(conn, now, upto, nodes, rows)
        n = self.merge_pending(rows)
        self.trim(now - self.window_s)
        return n

    def read_tail(
        self, conn: psycopg.Connection, now: float, upto: float, nodes: set[str], rows: list[Pending]
    ) -> int:
        """The reads of :meth:`catch_up`, their rows appended to ``rows`` (not merged): they touch
        neither the buffers nor what a restore assembles meanwhile; returns the samples read."""
        db_now, batches, fresh = self._batches_since(conn)
        for b in batches:  # all of them are merged below or lie in the tail read below
            self.seen[b[0]] = b[4]
        lo_keep = now - self.window_s
        upto_dt = datetime.fromtimestamp(upto, UTC)
        n = self._fetch(conn, [b for b in fresh if b[2] < upto_dt], lo_keep, rows)
        late = self.last_fresh
        tail = sorted(nodes | {b[1] for b in batches if b[3] >= upto_dt})
        n += self._ingest(
            conn,
            tail,
            "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
            {"lo": upto_dt, "hi": datetime.fromtimestamp(now + 3600, UTC)},
            now - upto,
            rows,
        )
        self.last_fresh = late
        self.watermark = db_now
        return n

    def refresh(self, conn: psycopg.Connection, now: float) -> int:
        """Fetch what was committed since the last call; drop what fell out of the window."""
        if not self.loaded or self.watermark is None:
            return self.load(conn, now - self.window_s, now + 3600)
        self.brin.catch_up(conn)
        db_now, _, fresh = self._batches_since(conn)
        self.watermark = db_now
        lo_keep = now - self.window_s
        n = self._fetch(conn, fresh, lo_keep)
        self.trim(lo_keep)
        return n

    def trim(self, t_min: float) -> None:
        for gk in list(self.gpus):
            self.gpus[gk].trim(t_min)
            if len(self.gpus[gk]) == 0:
                del self.gpus[gk]
        for hk in list(self.hosts):
            self.hosts[hk].trim(t_min)
            if len(self.hosts[hk]) == 0:
                del self.hosts[hk]

    def samples(self) -> int:
        """Samples held, GPUs' and hosts'."""
        return sum(len(b) for b in self.gpus.values()) + sum(len(b) for b in self.hosts.values())

    # -- views -----------------------------------------------------------------

    def window(self, t_end: float, runs: list[RunInfo], node_facts: dict[str, dict[str, Any]]) -> Window:
        """The Window detectors see at ``t_end`` (samples in (t_end - window_s, t_end])."""
        t_start = t_end - self.window_s
        w = Window(t_start=t_start, t_end=t_end, runs=runs, node_facts=node_facts)
        names: dict[bytes, list[str]] = {}  # the column names of each stored-column list, looked up once
        for (node, gpu), buf in self.gpus.items():
            ser = _series(buf, GPU_COLUMNS, names, t_start, t_end, node, gpu)
            if ser is not None:
                w.gpus[(node, gpu)] = ser
        names = {}
        for node, buf in self.hosts.items():
            ser = _series(buf, HOST_COLUMNS, names, t_start, t_end, node, None)
            if ser is not None:
                w.hosts[node] = ser
        return w


def _series(
    buf: _Buf,
    columns: tuple[str, ...],
    names: dict[bytes, list[str]],
    t_start: float,
    t_end: float,
    node: str,
    gpu: int | None,
) -> Series | None:
    """A buffer's samples in (t_start, t_end] as views; columns it does not store are left out
    (a series reads them as NaN)."""
    t = buf.t
    if not len(t):
        return None
    # Usually the whole buffer lies in the window (it is trimmed to it): no search.
    a = 0 if t[0] > t_start else int(t.searchsorted(t_start, side="right"))
    b = len(t) if t[-1] <= t_end else int(t.searchsorted(t_end, side="right"))
    if b <= a:
        return None
    key = buf.rows.tobytes()
    cols = names.get(key)
    if cols is None:
        cols = names[key] = [columns[j] for j in buf.rows.tolist()]
    return Series(node, gpu, t[a:b], dict(zip(cols, buf.vals[:, a:b], strict=True)))


def load_runs(conn: psycopg.Connection, t_start: float, t_end: float) -> list[RunInfo]:
    """Runs overlapping [t_start, t_end) (epoch seconds), on the detectors' clock, with the progress
    they reported from the last report before ``t_start`` on (what a hang is judged by)."""
    runs = [
        RunInfo.of(r)
        for r in run_model.load_runs(
            conn, since=datetime.fromtimestamp(t_start, UTC), until=datetime.fromtimestamp(t_end, UTC)
        )
    ]
    if not runs:
        return runs
    lo, hi = datetime.fromtimestamp(t_start, UTC), datetime.fromtimestamp(t_end, UTC)
    rows = conn.execute(
        """SELECT p.run_id, extract(epoch FROM p.time)::float8, p.tokens FROM run_progress p
           WHERE p.run_id = ANY(%s) AND p.tokens IS NOT NULL AND p.time <= %s
             AND p.time >= coalesce((SELECT max(q.time) FROM run_progress q
                                     WHERE q.run_id = p.run_id AND q.time < %s AND q.tokens IS NOT NULL), %s)
           ORDER BY p.run_id, p.time""",
        ([r.run_id for r in runs], hi, lo, lo),
    ).fetchall()
    by: dict[str, list[tuple[float, float]]] = {}
    for run_id, t, tokens in rows:
        by.setdefault(run_id, []).append((float(t), float(tokens)))
    for r in runs:
        pts = by.get(r.run_id)
        if pts:
            r.progress_t = np.array([t for t, _ in pts])
            r.progress_tokens = np.array([k for _, k in pts])
    return runs


def load_facts(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    return {
        r[0]: r[1]
        for r in conn.execute("SELECT node, facts FROM nodes WHERE facts <> '{}'::jsonb").fetchall()
    }
