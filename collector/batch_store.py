"""Storing validated batches: what a committed ingest request writes, in the caller's transaction.

:func:`write_batches` registers each (node, batch id) in ``ingest_batches``
(``ON CONFLICT DO NOTHING``) and queues its time range for the rollups, copies
the rows of the batches that were new with one binary COPY per table (parts of
one layout encoded together), records the samples' run sightings and keeps
``nodes`` current.  The group-commit writer calls it for each group; replay and
the test feeds call it directly, so everything that stores samples stores them
alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS
from gpufleet.collector import ingest_bounds, sightings
from gpufleet.collector.copy_binary import HEADER, TRAILER, Spec, concat_parts, encode_rows
from gpufleet.store import fact_history
from gpufleet.wire import Batch, Column

_PG_TYPES = {
    "real": "float4",
    "double": "float8",
    "smallint": "int2",
    "integer": "int4",
    "bigint": "int8",
    "text": "text",
}


@dataclass
class Written:
    """What :func:`write_batches` stored."""

    #: (node, batch id) of the batches that were new (the others were duplicates: nothing copied).
    new: set[tuple[str, str]] = field(default_factory=set)
    #: Run sightings written, for :meth:`gpufleet.collector.sightings.SightingCache.stored` after commit.
    sightings: Any = None
    #: (node, batch id) -> energy counter glitches in it (:func:`gpufleet.collector.ingest_bounds.energy_glitches`).
    glitches: dict[tuple[str, str], int] = field(default_factory=dict)


class NodeTouch:
    """When each node's row was last refreshed, so an idle refresh happens at most every ``every_s``."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._at: dict[str, float] = {}

    def due(self, node: str, now: float) -> bool:
        return now - self._at.get(node, -1e9) >= self.every_s

    def mark(self, node: str, now: float) -> None:
        self._at[node] = now


def write_batches(
    conn: psycopg.Connection,
    batches: list[Batch],
    *,
    sightings_cache: sightings.SightingCache | None = None,
    touch: NodeTouch | None = None,
) -> Written:
    """Store ``batches`` in the caller's transaction; of two with one (node, batch id) the first is stored."""
    if not batches:
        return Written()
    batches = list({(b.node, b.batch_id): b for b in reversed(batches)}.values())[::-1]
    rows = []
    for b in batches:
        rng = b.time_range()
        rows.append((b.batch_id, b.node, b.n_gpu, b.n_host, rng[0] if rng else None, rng[1] if rng else None))
    cur = conn.execute(REGISTER_SQL, register_params(rows))
    new_ids = {(r[1], r[0]) for r in cur.fetchall()}
    new = [b for b in batches if (b.node, b.batch_id) in new_ids]
    if any(b.n_gpu for b in new):
        _copy(conn, "gpu_samples", GPU_SPECS, [(b.node, b.gpu, b.n_gpu) for b in new if b.n_gpu])
    if any(b.n_host for b in new):
        _copy(conn, "host_samples", HOST_SPECS, [(b.node, b.host, b.n_host) for b in new if b.n_host])
    written = sightings.record(conn, new, sightings_cache)
    touch_nodes(conn, new, touch)
    glitches = {
        (b.node, b.batch_id): n for b, n in zip(new, ingest_bounds.energy_glitches(new), strict=True) if n
    }
    return Written(new_ids, written, glitches)


def touch_nodes(conn: psycopg.Connection, batches: list[Batch], touch: NodeTouch | None = None) -> None:
    """Keep ``nodes`` current: last seen, GPU count, facts, skew refusals.

    The GPU count is what the node's facts say (``gpu_count``, else its
    ``gpus`` list) whenever it sends facts; between facts, a batch showing more
    GPUs than counted raises it until the next facts.  So one batch naming a
    GPU index nobody has no longer makes the node that large for good.  The
    priced part of the facts is dated (:mod:`gpufleet.store.fact_history`).

    With ``touch``, a node with nothing new to say is updated at most once per
    ``touch.every_s`` (an UPDATE per request would cost more than the COPY).
    """
    now = time.monotonic()
    per_node: dict[str, dict[str, Any]] = {}
    for b in batches:
        d = per_node.setdefault(b.node, {"batches": [], "facts": None, "skew": 0, "t": None})
        d["batches"].append(b)
        if b.facts:
            d["facts"] = b.facts
        d["skew"] += b.rejected_skew
        rng = b.time_range()
        if rng:
            d["t"] = max(d["t"] or rng[1], rng[1])
    rows = []
    # Sorted so that concurrent writers lock node rows in one order (no deadlocks).
    for node in sorted(per_node):
        d = per_node[node]
        if touch is not None:
            if d["facts"] is None and not d["skew"] and not touch.due(node, now):
                continue  # nothing to write: its GPUs are not even counted
            touch.mark(node, now)
        gpus = max(_whole_gpus(b) for b in d["batches"])
        rows.append((node, gpus or None, _json(d["facts"]), d["skew"], facts_gpu_count(d["facts"])))
    if not rows:
        return
    conn.execute(
        "INSERT INTO nodes AS n (node, first_seen, last_seen, gpu_count, facts, facts_time, rejected_skew) "
        "SELECT u.node, now(), now(), COALESCE(u.counted, u.gpus), COALESCE(u.facts, '{}'::jsonb), "
        "CASE WHEN u.facts IS NULL THEN NULL ELSE now() END, u.skew "
        "FROM unnest(%s::text[], %s::int[], %s::jsonb[], %s::bigint[], %s::int[]) "
        "AS u(node, gpus, facts, skew, counted) "
        "ON CONFLICT (node) DO UPDATE SET last_seen = now(), "
        "gpu_count = CASE WHEN EXCLUDED.facts_time IS NOT NULL AND (EXCLUDED.facts ? 'gpu_count' "
        "OR EXCLUDED.facts ? 'gpus') THEN EXCLUDED.gpu_count "
        "ELSE COALESCE(GREATEST(EXCLUDED.gpu_count, n.gpu_count), n.gpu_count) END, "
        "facts = CASE WHEN EXCLUDED.facts_time IS NULL THEN n.facts ELSE EXCLUDED.facts END, "
        "facts_time = COALESCE(EXCLUDED.facts_time, n.facts_time), "
        "rejected_skew = n.rejected_skew + EXCLUDED.rejected_skew",
        (
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [r[3] for r in rows],
            [r[4] for r in rows],
        ),
    )
    dated = [(r[0], r[2]) for r in rows if r[2] is not None]
    if dated:
        conn.execute(fact_history.RECORD_SQL, ([n for n, _ in dated], [f for _, f in dated]))


def facts_gpu_count(facts: dict[str, Any] | None) -> int | None:
    """The GPU count a node's facts state: ``gpu_count``, else the length of ``gpus``; None if neither."""
    if not facts:
        return None
    n = facts.get("gpu_count")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    gpus = facts.get("gpus")
    return len(gpus) if isinstance(gpus, list) else None


def _whole_gpus(b: Batch) -> int:
    """How many whole GPUs (not MIG instances) the batch has samples of."""
    if not b.n_gpu:
        return 0
    gpus = b.gpu["gpu"].values
    mig = b.gpu.get("mig_instance")
    if mig is not None:
        gpus = gpus[mig.null] if mig.null is not None else gpus[:0]
    return len(np.unique(gpus))


#: Registers batch ids (new ones only) and queues their time ranges for the
#: rollup worker, in one round trip.  Arrays travel as text literals: batch
#: ids and node names are validated to a quote-free alphabet, and psycopg's
#: per-element array adaptation costs more than the COPY itself.
REGISTER_SQL = """
WITH b AS (
  SELECT * FROM unnest(%(ids)s::text[], %(nodes)s::text[], %(g)s::int[], %(h)s::int[],
                       %(t0)s::float8[], %(t1)s::float8[]) AS u(batch_id, node, g, h, t0, t1)
), new AS (
  INSERT INTO ingest_batches (batch_id, node, gpu_rows, host_rows, t_min, t_max)
  SELECT batch_id, node, g, h, to_timestamp(t0), to_timestamp(t1) FROM b
  ON CONFLICT (node, batch_id) DO NOTHING
  RETURNING batch_id, node, t_min, t_max
), queued AS (
  INSERT INTO rollup_queue (node, t_min, t_max)
  SELECT node, t_min, t_max FROM new WHERE t_min IS NOT NULL
)
SELECT batch_id, node FROM new"""


def _array(values: list[Any]) -> str:
    """A PostgreSQL array literal of safe strings or numbers (NULL for None)."""
    return (
        "{"
        + ",".join(
            "NULL" if v is None else (f'"{v}"' if isinstance(v, str) else repr(float(v))) for v in values
        )
        + "}"
    )


def register_params(rows: list[tuple[str, str, int, int, float | None, float | None]]) -> dict[str, str]:
    cols = list(zip(*rows, strict=True))
    return {
        "ids": _array(list(cols[0])),
        "nodes": _array(list(cols[1])),
        "g": "{" + ",".join(map(str, cols[2])) + "}",
        "h": "{" + ",".join(map(str, cols[3])) + "}",
        "t0": _array(list(cols[4])),
        "t1": _array(list(cols[5])),
    }


def _json(obj: Any) -> Any:
    if obj is None:
        return None
    from psycopg.types.json import Jsonb

    return Jsonb(obj)


def table_specs(key: tuple[str, ...], fields: tuple[Any, ...]) -> list[Spec]:
    specs = [Spec("time", "timestamptz"), Spec("node", "text")]
    if "gpu" in key:
        specs.append(Spec("gpu", "int2"))
    specs.extend(Spec(f.name, _PG_TYPES[f.kind], f.bits if f.kind == "real" else None) for f in fields)
    return specs


GPU_SPECS = table_specs(("time", "node", "gpu"), GPU_FIELDS)
HOST_SPECS = table_specs(("time", "node"), HOST_FIELDS)


def _copy(
    conn: psycopg.Connection, table: str, specs: list[Spec], parts: list[tuple[str, dict[str, Column], int]]
) -> None:
    """Binary COPY of columnar parts; columns no part carries are left out."""
    present, chunks = copy_data(specs, parts)
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(sp.name) for sp in present)
    )
    with conn.cursor().copy(stmt) as cp:
        # Each piece as it is: joining them would copy a group commit's rows once more.
        for chunk in chunks:
            cp.write(chunk)


def copy_data(
    specs: list[Spec], parts: list[tuple[str, dict[str, Column], int]]
) -> tuple[list[Spec], list[bytes | memoryview]]:
    """The columns a COPY of ``parts`` names, and its data in pieces (header, rows, trailer)."""
    carried: set[str] = {"time", "node", "gpu"}
    for _, cols, _ in parts:
        carried.update(cols)
    present = [sp for sp in specs if sp.name in carried]
    # Parts with the same layout are merged and encoded in one pass; the
    # layout signature is only a grouping hint (encode_rows re-checks).
    groups: dict[tuple[Any, ...], list[tuple[str, dict[str, Column], int]]] = {}
    for part in parts:
        groups.setdefault(_layout_hint(present, part), []).append(part)
    chunks: list[bytes | memoryview] = [HEADER]
    for group in groups.values():
        merged, n = concat_parts(present, group)
        chunks.append(encode_rows(present, merged, n))
    chunks.append(TRAILER)
    return present, chunks


def _layout_hint(specs: list[Spec], part: tuple[str, dict[str, Column], int]) -> tuple[Any, ...]:
    """Which columns a part carries and which hold NULLs: parts alike in this
    are usually alike in byte layout (text lengths aside, which encode_rows
    re-checks), so they are merged and encoded together."""
    node, cols, _ = part
    return len(node), tuple(cols), tuple([c.null is None for c in cols.values()])
