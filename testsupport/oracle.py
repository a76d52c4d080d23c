"""What the collector acknowledged, and SQL that checks the database against it.

The promise under test is "a 2xx means committed, exactly once".  The oracle
is filled on the agent side at the moment an acknowledgement arrives (the
spool's ``ack``), from the very bytes that were sent, so it is independent
of what the collector or the database later claim.  The checks then ask the
database:

* :func:`missing_samples`: acknowledged samples absent from the tables (an
  anti-join of the oracle's sample keys, loaded into a temporary table);
* :func:`missing_batches`: acknowledged batch ids absent from
  ``ingest_batches``;
* :func:`duplicate_rows`: rows minus distinct sample keys (a batch stored
  twice shows here).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psycopg
import zstandard

from gpufleet.collector.copy_binary import PG_EPOCH_S
from gpufleet.wire import column_list

#: ``gpu`` value standing for the host row in the oracle's sample keys.
HOST = -1


def decode_body(body: bytes) -> dict[str, Any]:
    """A request body as the agent sends it (msgpack, zstd)."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    doc: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return doc


def column(values: Any) -> list[Any]:
    """A wire column as a list: a plain list, or a typed array as the agents send it."""
    return column_list("batch", "column", values)


def micros(times: Iterable[float]) -> np.ndarray:
    """Sample times as the collector stores them: microseconds since 2000-01-01, rounded."""
    return np.round((np.asarray(list(times), dtype=np.float64) - PG_EPOCH_S) * 1e6).astype(np.int64)


@dataclass
class Acked:
    batch_id: str
    node: str
    #: (gpu or HOST, microseconds) of every sample in the batch.
    keys: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Acked:
        keys: list[tuple[int, int]] = []
        gpu = doc.get("gpu") or {}
        if gpu:
            keys.extend(zip(column(gpu["gpu"]), micros(column(gpu["time"])).tolist(), strict=True))
        host = doc.get("host") or {}
        if host:
            keys.extend((HOST, us) for us in micros(column(host["time"])).tolist())
        return cls(doc["batch_id"], doc["node"], keys)


class Oracle:
    """Acknowledged batches by id; thread-safe; optionally mirrored to a JSON-lines file
    (an agent in another process appends there, the test reads it back)."""

    def __init__(self) -> None:
        self.batches: dict[str, Acked] = {}
        self.acks = 0
        self._lock = threading.Lock()

    def record(self, acked: Acked) -> None:
        with self._lock:
            self.acks += 1
            self.batches[acked.batch_id] = acked

    @property
    def samples(self) -> int:
        with self._lock:
            return sum(len(b.keys) for b in self.batches.values())

    def watch(self, spool: Any, log_path: Path | None = None) -> None:
        """Record every segment ``spool`` acknowledges (wraps its ``ack``)."""
        original = spool.ack

        def ack(seg: Any) -> None:
            acked = Acked.from_doc(decode_body(spool.read(seg)))
            if log_path is not None:
                append_line(log_path, {"batch_id": acked.batch_id, "node": acked.node, "keys": acked.keys})
            self.record(acked)
            original(seg)

        spool.ack = ack

    @classmethod
    def load(cls, paths: Iterable[Path]) -> Oracle:
        oracle = cls()
        for path in paths:
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue  # a line cut by kill -9
                oracle.record(Acked(d["batch_id"], d["node"], [tuple(k) for k in d["keys"]]))
        return oracle


def append_line(path: Path, obj: Any) -> None:
    """One JSON line in one ``write`` (O_APPEND): a killed process leaves whole lines or a cut last one."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


# -- SQL checks -------------------------------------------------------------------------------

_KEY_MATCH = (
    "s.node = o.node AND s.gpu = o.gpu AND "
    "s.time = timestamptz '2000-01-01 00:00:00+00' + o.us * interval '1 microsecond'"
)


def _load(conn: psycopg.Connection, oracle: Oracle) -> None:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS oracle_keys (node text, gpu int, us bigint)")
    conn.execute("TRUNCATE oracle_keys")
    with conn.cursor().copy("COPY oracle_keys (node, gpu, us) FROM STDIN") as cp:
        for b in oracle.batches.values():
            for gpu, us in b.keys:
                cp.write_row((b.node, gpu, us))
    conn.execute("ANALYZE oracle_keys")


def missing_samples(url: str, oracle: Oracle) -> dict[str, int]:
    """Acknowledged GPU and host samples that are not in the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        _load(conn, oracle)
        gpu = conn.execute(
            "SELECT count(*) FROM oracle_keys o WHERE o.gpu >= 0 AND NOT EXISTS "
            f"(SELECT 1 FROM gpu_samples s WHERE {_KEY_MATCH})"
        ).fetchone()
        host = conn.execute(
            "SELECT count(*) FROM oracle_keys o WHERE o.gpu = %s AND NOT EXISTS "
            "(SELECT 1 FROM host_samples s WHERE s.node = o.node AND "
            "s.time = timestamptz '2000-01-01 00:00:00+00' + o.us * interval '1 microsecond')",
            (HOST,),
        ).fetchone()
    return {"gpu": int(gpu[0]) if gpu else -1, "host": int(host[0]) if host else -1}


def missing_batches(url: str, oracle: Oracle) -> int:
    ids = list(oracle.batches)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM unnest(%s::text[]) AS o(id) WHERE NOT EXISTS "
            "(SELECT 1 FROM ingest_batches b WHERE b.batch_id = o.id)",
            (ids,),
        ).fetchone()
    return int(row[0]) if row else -1


def duplicate_rows(url: str) -> dict[str, int]:
    """Rows minus distinct sample keys, per table (0 when nothing was stored twice)."""
    with psycopg.connect(url) as conn:
        g = conn.execute("SELECT count(*) - count(DISTINCT (node, gpu, time)) FROM gpu_samples").fetchone()
        h = conn.execute("SELECT count(*) - count(DISTINCT (node, time)) FROM host_samples").fetchone()
    return {"gpu": int(g[0]) if g else -1, "host": int(h[0]) if h else -1}


def row_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        out = {}
        for table in ("gpu_samples", "host_samples", "ingest_batches"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            out[table] = int(row[0]) if row else -1
    return out


@dataclass
class Integrity:
    """The figures every loss scenario reports."""

    acked_batches: int
    acked_samples: int
    missing_samples: int
    missing_batches: int
    duplicate_rows: int
    rows: dict[str, int]

    @property
    def ok(self) -> bool:
        return self.missing_samples == 0 and self.missing_batches == 0 and self.duplicate_rows == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "acked_batches": self.acked_batches,
            "acked_samples": self.acked_samples,
            "missing_samples": self.missing_samples,
            "missing_batches": self.missing_batches,
            "duplicate_rows": self.duplicate_rows,
            **self.rows,
        }


def integrity(url: str, oracle: Oracle) -> Integrity:
    miss = missing_samples(url, oracle)
    dup = duplicate_rows(url)
    return Integrity(
        len(oracle.batches),
        oracle.samples,
        miss["gpu"] + miss["host"],
        missing_batches(url, oracle),
        dup["gpu"] + dup["host"],
        row_counts(url),
    )
