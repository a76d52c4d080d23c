"""The samples detectors look at, held in memory and refreshed incrementally.

A sweep every few seconds over the last ten minutes of a large fleet cannot
re-read millions of rows each time.  The leader loads the window once, then
each sweep fetches only the batches committed since the previous one (found
through ``ingest_batches``, so late and back-filled data arrive too) and
drops samples older than the window.

Rows are read with ``COPY ... TO STDOUT (FORMAT BINARY)`` of fixed-width
columns (NULL as NaN, nodes as small integers), which numpy parses in one
``frombuffer``: no Python object per sample.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg

from collector.detectors.window import RunInfo, Series, Window

log = logging.getLogger(__name__)

#: GPU columns the detectors read (see collector/detectors).
GPU_COLUMNS = ("util_pct", "sm_active", "tensor_active", "dram_active", "power_w", "power_limit_w",
               "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "throttle_reasons", "pcie_gen", "pcie_gen_max",
               "pcie_width", "pcie_width_max", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "xid")
HOST_COLUMNS = ("cpu_user_pct", "cpu_system_pct", "cpu_iowait_pct", "cpu_idle_pct", "cpu_count",
                "disk_read_bytes_s", "disk_write_bytes_s", "disk_util_pct", "disk_await_ms",
                "net_rx_bytes_s", "net_tx_bytes_s", "host_power_w")

#: Commits can land slightly out of ``received_at`` order; batches this much
#: older than the watermark are looked at again (and skipped if already seen).
COMMIT_SLACK_S = 60.0


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


def _row_dtype(ncols: int, gpu: bool) -> np.dtype:
    fields: list[tuple[str, str]] = [("nf", ">i2"), ("lt", ">i4"), ("t", ">f8"), ("ln", ">i4"), ("node", ">i4")]
    if gpu:
        fields += [("lg", ">i4"), ("gpu", ">i2")]
    for j in range(ncols):
        fields += [(f"l{j}", ">i4"), (f"c{j}", ">f4")]
    return np.dtype(fields)


def _select(table: str, cols: tuple[str, ...], gpu: bool, where: str) -> str:
    vals = ", ".join(f"COALESCE({c}::float4, 'NaN'::float4)" for c in cols)
    key = "array_position(%(nodes)s::text[], s.node) AS node_idx" + (", s.gpu" if gpu else "")
    mig = " AND s.mig_instance IS NULL" if gpu else ""
    return (f"SELECT extract(epoch FROM s.time)::float8, {key}, {vals} FROM {table} s "
            f"WHERE {where}{mig}")


def _copy_rows(conn: psycopg.Connection, query: str, params: dict[str, Any], dtype: np.dtype) -> np.ndarray:
    chunks = []
    with conn.cursor().copy(f"COPY ({query}) TO STDOUT (FORMAT BINARY)", params) as cp:
        for block in cp:
            chunks.append(bytes(block))
    data = b"".join(chunks)
    if len(data) < 21:
        return np.zeros(0, dtype=dtype)
    body = data[19:-2]  # header (19 bytes incl. flags/extension) and trailer (-1)
    return np.frombuffer(body, dtype=dtype)


@dataclass
class _Buf:
    """Samples of one GPU or host: times and columns, sorted by time."""

    t: np.ndarray
    cols: np.ndarray  # (ncols, n) float32

    def merge(self, t: np.ndarray, cols: np.ndarray) -> None:
        if len(t) == 0:
            return
        if len(self.t) and t.min() > self.t[-1]:
            self.t = np.concatenate([self.t, t])
            self.cols = np.concatenate([self.cols, cols], axis=1)
            return
        allt = np.concatenate([self.t, t])
        allc = np.concatenate([self.cols, cols], axis=1)
        order = np.argsort(allt, kind="stable")
        allt, allc = allt[order], allc[:, order]
        keep = np.ones(len(allt), dtype=bool)
        keep[1:] = allt[1:] != allt[:-1]  # a re-fetched sample replaces nothing
        self.t, self.cols = allt[keep], allc[:, keep]

    def trim(self, t_min: float) -> None:
        i = int(np.searchsorted(self.t, t_min, side="left"))
        if i:
            self.t, self.cols = self.t[i:], self.cols[:, i:]


@dataclass
class WindowCache:
    window_s: float
    gpus: dict[tuple[str, int], _Buf] = field(default_factory=dict)
    hosts: dict[str, _Buf] = field(default_factory=dict)
    watermark: datetime | None = None
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    loaded: bool = False

    # -- loading ---------------------------------------------------------------

    def _ingest(self, conn: psycopg.Connection, nodes: list[str], where: str, params: dict[str, Any]) -> int:
        if not nodes:
            return 0
        p = {**params, "nodes": nodes}
        gdt = _row_dtype(len(GPU_COLUMNS), True)
        rows = _copy_rows(conn, _select("gpu_samples", GPU_COLUMNS, True, where), p, gdt)
        n = len(rows)
        if n:
            node_idx = rows["node"].astype(np.int64) - 1
            gpu = rows["gpu"].astype(np.int64)
            t = rows["t"].astype(np.float64)
            cols = np.vstack([rows[f"c{j}"].astype(np.float32) for j in range(len(GPU_COLUMNS))])
            key = node_idx * 65536 + gpu
            order = np.lexsort((t, key))
            key, t, cols = key[order], t[order], cols[:, order]
            bounds = np.flatnonzero(np.diff(key)) + 1
            for s, e in zip(np.r_[0, bounds], np.r_[bounds, len(key)], strict=True):
                k = int(key[s])
                gk = (nodes[k // 65536], k % 65536)
                buf = self.gpus.get(gk)
                if buf is None:
                    self.gpus[gk] = _Buf(t[s:e].copy(), cols[:, s:e].copy())
                else:
                    buf.merge(t[s:e], cols[:, s:e])
        hdt = _row_dtype(len(HOST_COLUMNS), False)
        hrows = _copy_rows(conn, _select("host_samples", HOST_COLUMNS, False, where), p, hdt)
        if len(hrows):
            node_idx = hrows["node"].astype(np.int64) - 1
            t = hrows["t"].astype(np.float64)
            cols = np.vstack([hrows[f"c{j}"].astype(np.float32) for j in range(len(HOST_COLUMNS))])
            order = np.lexsort((t, node_idx))
            node_idx, t, cols = node_idx[order], t[order], cols[:, order]
            bounds = np.flatnonzero(np.diff(node_idx)) + 1
            for s, e in zip(np.r_[0, bounds], np.r_[bounds, len(node_idx)], strict=True):
                name = nodes[int(node_idx[s])]
                buf = self.hosts.get(name)
                if buf is None:
                    self.hosts[name] = _Buf(t[s:e].copy(), cols[:, s:e].copy())
                else:
                    buf.merge(t[s:e], cols[:, s:e])
        return n + len(hrows)

    def load(self, conn: psycopg.Connection, t_start: float, t_end: float) -> int:
        """Cold load of every sample in [t_start, t_end]."""
        lo, hi = datetime.fromtimestamp(t_start, UTC), datetime.fromtimestamp(t_end, UTC)
        nodes = [r[0] for r in conn.execute(DISTINCT_NODES_SQL).fetchall()]
        self.watermark = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        n = self._ingest(conn, sorted(nodes), "s.time >= %(lo)s AND s.time <= %(hi)s", {"lo": lo, "hi": hi})
        self.loaded = True
        return n

    def refresh(self, conn: psycopg.Connection, now: float) -> int:
        """Fetch what was committed since the last call; drop what fell out of the window."""
        if not self.loaded or self.watermark is None:
            return self.load(conn, now - self.window_s, now + 3600)
        since = self.watermark - timedelta(seconds=COMMIT_SLACK_S)
        db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        batches = conn.execute(
            "SELECT batch_id, node, t_min, t_max FROM ingest_batches WHERE received_at >= %s AND t_min IS NOT NULL",
            (since,)).fetchall()
        fresh = [b for b in batches if b[0] not in self.seen]
        for b in fresh:
            self.seen[b[0]] = None
        while len(self.seen) > 200_000:
            self.seen.popitem(last=False)
        self.watermark = db_now
        lo_keep = now - self.window_s
        n = 0
        # Fresh batches cluster in time (usually the last few seconds); each
        # cluster is one time-range scan filtered by node, which the time
        # index serves however long the retention.  Re-fetched samples are
        # de-duplicated on merge.
        spans = sorted((t0, t1, node) for _, node, t0, t1 in fresh if t1.timestamp() >= lo_keep)
        clusters: list[tuple[datetime, datetime, set[str]]] = []
        for t0, t1, node in spans:
            if clusters and (t0 - clusters[-1][1]).total_seconds() <= 60:
                lo, hi, names = clusters[-1]
                names.add(node)
                clusters[-1] = (lo, max(hi, t1), names)
            else:
                clusters.append((t0, t1, {node}))
        for lo, hi, names in clusters:
            n += self._ingest(conn, sorted(names), "s.time >= %(lo)s AND s.time <= %(hi)s AND s.node = ANY(%(nodes)s)",
                              {"lo": lo, "hi": hi})
        self.trim(lo_keep)
        return n

    def trim(self, t_min: float) -> None:
        for gk in list(self.gpus):
            self.gpus[gk].trim(t_min)
            if len(self.gpus[gk].t) == 0:
                del self.gpus[gk]
        for hk in list(self.hosts):
            self.hosts[hk].trim(t_min)
            if len(self.hosts[hk].t) == 0:
                del self.hosts[hk]

    # -- views -----------------------------------------------------------------

    def window(self, t_end: float, runs: list[RunInfo], node_facts: dict[str, dict[str, Any]]) -> Window:
        """The Window detectors see at ``t_end`` (samples in (t_end - window_s, t_end])."""
        t_start = t_end - self.window_s
        w = Window(t_start=t_start, t_end=t_end, runs=runs, node_facts=node_facts)
        for (node, gpu), buf in self.gpus.items():
            a, b = np.searchsorted(buf.t, [t_start, t_end], side="right")
            if b > a:
                w.gpus[(node, gpu)] = Series(node, gpu, buf.t[a:b],
                                             {c: buf.cols[j, a:b] for j, c in enumerate(GPU_COLUMNS)})
        for node, buf in self.hosts.items():
            a, b = np.searchsorted(buf.t, [t_start, t_end], side="right")
            if b > a:
                w.hosts[node] = Series(node, None, buf.t[a:b],
                                       {c: buf.cols[j, a:b] for j, c in enumerate(HOST_COLUMNS)})
        return w


def load_runs(conn: psycopg.Connection, t_start: float, t_end: float) -> list[RunInfo]:
    rows = conn.execute(
        'SELECT r.run_id, r.name, r.site, extract(epoch FROM r.start)::float8, extract(epoch FROM r."end")::float8, '
        "COALESCE(array_agg(a.node ORDER BY a.node, a.gpu) FILTER (WHERE a.node IS NOT NULL), '{}'), "
        "COALESCE(array_agg(a.gpu ORDER BY a.node, a.gpu) FILTER (WHERE a.node IS NOT NULL), '{}') "
        "FROM runs r LEFT JOIN run_allocations a ON a.run_id = r.run_id "
        'WHERE r.start <= to_timestamp(%s) AND (r."end" IS NULL OR r."end" >= to_timestamp(%s)) '
        "GROUP BY r.run_id", (t_end, t_start)).fetchall()
    return [RunInfo(run_id=r[0], name=r[1], site=r[2], start=r[3], end=r[4],
                    allocations=[(n, int(g)) for n, g in zip(r[5], r[6], strict=True)]) for r in rows]


def load_facts(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    return {r[0]: r[1] for r in conn.execute("SELECT node, facts FROM nodes WHERE facts <> '{}'::jsonb").fetchall()}
