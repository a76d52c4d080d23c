"""Tick records (what the spool appends) and their conversion to the columnar wire batch.

A tick record is one msgpack map: ``{"t": epoch seconds, "g": [GPU rows],
"h": host row or None, "f": node facts (only when they changed)}``.  Sealing a
segment turns its records into one ``gpufleet.wire`` batch: every catalog
column present in any row becomes one list, ``None`` where a row lacked it,
so the collector decodes it without a Python object per sample.
"""

from __future__ import annotations

from typing import Any

from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS
from gpufleet.wire import encode

_GPU_ORDER = ("gpu", *(f.name for f in GPU_FIELDS))
_HOST_ORDER = tuple(f.name for f in HOST_FIELDS)


def tick_record(
    t: float, gpus: list[dict[str, Any]], host: dict[str, Any] | None, facts: dict[str, Any] | None = None
) -> dict[str, Any]:
    rec: dict[str, Any] = {"t": t, "g": gpus, "h": host}
    if facts is not None:
        rec["f"] = facts
    return rec


def record_samples(rec: dict[str, Any]) -> int:
    """Samples in a record as the collector counts them: GPU rows plus the host row."""
    return len(rec.get("g") or ()) + (1 if rec.get("h") is not None else 0)


def _columns(rows: list[tuple[float, dict[str, Any]]], order: tuple[str, ...]) -> dict[str, list[Any]]:
    present: set[str] = set()
    for _, row in rows:
        present.update(row)
    names = [n for n in order if n in present]
    cols: dict[str, list[Any]] = {"time": [t for t, _ in rows]}
    for name in names:
        cols[name] = [row.get(name) for _, row in rows]
    return cols


def to_batch(
    records: list[dict[str, Any]], batch_id: str, node: str, agent: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The wire batch of a segment's records; facts are the last ones the segment carried."""
    gpu_rows = [(rec["t"], row) for rec in records for row in rec.get("g") or ()]
    host_rows = [(rec["t"], rec["h"]) for rec in records if rec.get("h") is not None]
    batch: dict[str, Any] = {"batch_id": batch_id, "node": node}
    if gpu_rows:
        batch["gpu"] = _columns(gpu_rows, _GPU_ORDER)
    if host_rows:
        batch["host"] = _columns(host_rows, _HOST_ORDER)
    facts = next((rec["f"] for rec in reversed(records) if rec.get("f") is not None), None)
    if facts is not None:
        batch["facts"] = facts
    if agent:
        batch["agent"] = agent
    return batch


def encode_batch(batch: dict[str, Any]) -> bytes:
    """The request body: msgpack, zstd-compressed (headers are fixed, see :data:`BODY_HEADERS`)."""
    body, _headers = encode(batch, "msgpack", "zstd")
    return body


BODY_HEADERS = {"Content-Type": "application/msgpack", "Content-Encoding": "zstd"}
