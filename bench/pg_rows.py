"""PostgreSQL's CPU per stored GPU-sample, and the per-GPU btree's share of it.

    python bench/pg_rows.py [--nodes 3000] [--seconds 100] [--group 120]

Writes the same batches ``bench/vs_prometheus.py`` ships (8 GPUs a node, 25
values a GPU, the agents' 10-s batches, decoded and validated as the
collector does) through the collector's own storing step
(``write_batches``), ``--group`` requests to a transaction as group commit
gathers them, into a scratch database of the plain-PostgreSQL layout, and
reads the CPU of the database backend that did it from /proc.  Then the same
into a second scratch database without the ``(node, gpu, time)`` btree,
which serves per-GPU reads: the baseline, in the same run.  Only the
backend is counted: no HTTP, no collector, no WAL writer.  Each figure comes
with the WAL the backend wrote per row.

``--variants`` adds the cheap changes to that btree one might try first, each
into a scratch database of its own, all in the same run: the index without
deduplication (its keys are all distinct), the node column collated "C"
(byte comparisons instead of the locale's), and each request's rows sorted
by GPU and time before the COPY (each GPU's rows into one leaf page in
turn); and, to tell the heap from its indexes, the table without its time
BRIN and without any index.

``--shipment-rows`` measures two layouts the collector does not have, to size
a redesign before making it: one row per GPU per shipment (a node's 10 s of
one GPU) holding each field's values as a typed array, and the same holding
each field's values as bytes (what PostgreSQL can store without looking at
each value, and SQL then cannot read), both with the same
``(node, gpu, time)`` btree and time BRIN, so a row and its index entry are
paid once per ten samples.  The same batches, the same group size and the
same bookkeeping (batch registry, nodes) as the other variants; its figure
is per GPU-sample, like theirs, and it reports the bytes the table and its
indexes take per GPU-sample.

Each layout is then read the way the rollups read it every minute: every
GPU's one-minute averages of every value field, over all the samples
stored.  Rows and arrays are averaged in SQL (the arrays unnested in
step); the bytes are fetched and averaged here with numpy, since SQL cannot
read them.  The read's CPU is the backend's plus this process's (the client
decodes the answer, and for the bytes does the averaging), per GPU-sample
read: what a layout that is cheaper to write costs every reader.  The last
line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from datetime import UTC, datetime
from typing import Any

import msgpack
import numpy as np
import psycopg
import zstandard

from bench import vs_prometheus
from gpufleet.collector import sightings
from gpufleet.collector.batch_store import GPU_SPECS, NodeTouch, write_batches
from gpufleet.collector.copy_binary import Spec
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.wire import Batch, validate
from testsupport.pg import server_url


def batches(nodes: int, seconds: int) -> list[Batch]:
    due = vs_prometheus.gpufleet_bodies(
        vs_prometheus.value_model(), nodes, ["unused"] * nodes, int(time.time()) - 2 * seconds, seconds
    )
    d = zstandard.ZstdDecompressor()
    return [
        validate(msgpack.unpackb(d.decompress(body), raw=False)) for t in sorted(due) for _, body, _ in due[t]
    ]


#: What each variant changes in a freshly migrated database before the rows are written.
VARIANTS: dict[str, list[str]] = {
    "as_migrated": [],
    "no_btree": ["DROP INDEX gpu_samples_node_gpu_time_idx"],
    "btree_without_deduplication": [
        "ALTER INDEX gpu_samples_node_gpu_time_idx SET (deduplicate_items = off)"
    ],
    "node_collated_c": ['ALTER TABLE gpu_samples ALTER COLUMN node TYPE text COLLATE "C"'],
    "rows_sorted_by_gpu": [],
    "no_brin": ["DROP INDEX gpu_samples_time_brin"],
    "no_indexes": ["DROP INDEX gpu_samples_time_brin", "DROP INDEX gpu_samples_node_gpu_time_idx"],
}

#: Not changes to the migrated table: samples stored a GPU's shipment to a row (``--shipment-rows``),
#: each field's values as a typed array, or as their bytes (the stored precision, little-endian).
SHIPMENT_ARRAYS = "one_row_per_gpu_shipment"
SHIPMENT_BYTES = "one_row_per_gpu_shipment_as_bytes"
SHIPMENTS = (SHIPMENT_ARRAYS, SHIPMENT_BYTES)

#: Column types stored as arrays of that type (``float4[]`` and so on, names both PostgreSQL and psycopg know).
_ARRAY_TYPES = frozenset({"float4", "float8", "int2", "int4", "int8"})
_LITTLE_ENDIAN = {"float4": "<f4", "float8": "<f8", "int2": "<i2", "int4": "<i4", "int8": "<i8"}


def shipment_fields(b: Batch) -> list[Spec]:
    """The value fields a batch carries, in the collector's COPY order (keys and text left out)."""
    return [sp for sp in GPU_SPECS if sp.name in b.gpu and sp.pgtype in _ARRAY_TYPES and sp.name != "gpu"]


def _value_type(sp: Spec, as_bytes: bool) -> str:
    return "bytea" if as_bytes else f"{sp.pgtype}[]"


def create_shipment_table(conn: psycopg.Connection, fields: list[Spec], as_bytes: bool) -> None:
    """The shipment table, with the sample table's indexes: the per-GPU btree and the time BRIN.
    As bytes, a NULL bitmap per row (all fields' bits, field after field) stands in for the arrays' NULLs."""
    cols = ", ".join(f"{sp.name} {_value_type(sp, as_bytes)}" for sp in fields)
    conn.execute(
        f"CREATE TABLE gpu_shipments (time timestamptz NOT NULL, node text NOT NULL, gpu smallint NOT NULL, "
        f"offsets_ms integer[] NOT NULL, uuid text, nulls bytea, {cols})"
    )
    conn.execute("CREATE INDEX gpu_shipments_node_gpu_time_idx ON gpu_shipments (node, gpu, time)")
    conn.execute(
        "CREATE INDEX gpu_shipments_time_brin ON gpu_shipments USING brin (time) WITH (pages_per_range = 32)"
    )


def shipment_rows(b: Batch, fields: list[Spec], as_bytes: bool) -> list[list[Any]]:
    """One row per GPU of the batch: its first time, each sample's offset from it, each field's values."""
    gpus = b.gpu["gpu"].values
    t = b.gpu["time"].values
    uuid = b.gpu["uuid"].values if "uuid" in b.gpu else None
    out = []
    for g in np.unique(gpus).tolist():
        idx = np.flatnonzero(gpus == g)
        idx = idx[np.argsort(t[idx], kind="stable")]
        t0 = float(t[idx[0]])
        row: list[Any] = [
            datetime.fromtimestamp(t0, UTC),
            b.node,
            g,
            np.round((t[idx] - t0) * 1000).astype(np.int64).tolist(),
            None if uuid is None else uuid[int(idx[0])],
        ]
        values: list[Any] = []
        nulls = []
        for sp in fields:
            col = b.gpu[sp.name]
            null = np.zeros(len(idx), dtype=bool) if col.null is None else col.null[idx]
            if as_bytes:
                values.append(np.asarray(col.values[idx], dtype=_LITTLE_ENDIAN[sp.pgtype]).tobytes())
                nulls.append(null)
            else:
                values.append(
                    [None if n else v for v, n in zip(col.values[idx].tolist(), null.tolist(), strict=True)]
                )
        any_null = as_bytes and bool(np.concatenate(nulls).any())
        row.append(np.packbits(np.concatenate(nulls)).tobytes() if any_null else None)
        out.append(row + values)
    return out


def copy_shipments(
    conn: psycopg.Connection, rows: list[list[Any]], fields: list[Spec], as_bytes: bool
) -> None:
    names = ["time", "node", "gpu", "offsets_ms", "uuid", "nulls", *(sp.name for sp in fields)]
    types = [
        "timestamptz",
        "text",
        "int2",
        "int4[]",
        "text",
        "bytea",
        *(_value_type(sp, as_bytes) for sp in fields),
    ]
    with conn.cursor().copy(f"COPY gpu_shipments ({', '.join(names)}) FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(types)
        for row in rows:
            cp.write_row(row)


def minute_averages(
    conn: psycopg.Connection, variant: str, fields: list[Spec]
) -> dict[tuple[str, int, int], np.ndarray]:
    """Every (node, GPU, minute as epoch seconds)'s averages of ``fields`` (NaN where every value was NULL),
    read from the layout ``variant`` wrote: what the rollups compute, each layout read as it can be."""
    if variant == SHIPMENT_BYTES:
        return _bytes_minute_averages(conn, fields)
    names = [sp.name for sp in fields]
    if variant == SHIPMENT_ARRAYS:  # each sample's values come from unnesting the arrays in step
        source = (
            f"gpu_shipments s, unnest(s.offsets_ms, {', '.join(f's.{n}' for n in names)}) "
            f"AS u(off, {', '.join(names)})"
        )
        t, values = "s.time + u.off * interval '1 ms'", "u."
    else:
        source, t, values = "gpu_samples s", "s.time", "s."
    avgs = ", ".join(f"avg({values}{n})::float8" for n in names)
    cur = conn.execute(
        f"SELECT s.node, s.gpu, extract(epoch FROM date_trunc('minute', {t}))::bigint, {avgs} "
        f"FROM {source} GROUP BY 1, 2, 3"
    )
    # An average over no value comes back None, which float64 arrays take as NaN.
    return {(r[0], r[1], r[2]): np.array(r[3:], dtype=np.float64) for r in cur}


def _bytes_minute_averages(
    conn: psycopg.Connection, fields: list[Spec]
) -> dict[tuple[str, int, int], np.ndarray]:
    """The bytes layout's minute averages, decoded and grouped here: fetch every row, cut each field's
    bytes into values, mask the NULLs, and sum per (node, GPU, minute) with one bincount per field."""
    # Binary results: bytea as its bytes, not as hex text to decode.
    cur = conn.cursor(binary=True).execute(
        "SELECT extract(epoch FROM time)::float8, node, gpu, offsets_ms, nulls, "
        f"{', '.join(sp.name for sp in fields)} FROM gpu_shipments"
    )
    got = cur.fetchall()
    if not got:
        return {}
    by_column = list(zip(*got, strict=True))
    lengths = np.fromiter(map(len, by_column[3]), dtype=np.int64, count=len(got))
    n = int(lengths.sum())
    t = np.repeat(np.array(by_column[0]), lengths) + np.concatenate(by_column[3]) / 1000.0
    pairs = list(zip(by_column[1], by_column[2], strict=True))
    series = {key: i for i, key in enumerate(dict.fromkeys(pairs))}
    keys = list(series)
    sid = np.repeat(np.array([series[p] for p in pairs], dtype=np.int64), lengths)
    minute = np.floor(t / 60.0).astype(np.int64)
    first, span = int(minute.min()), int(minute.max() - minute.min()) + 1
    codes, inverse = np.unique(sid * span + (minute - first), return_inverse=True)
    group = np.stack([codes // span, (codes % span + first) * 60])
    inverse = inverse.reshape(-1)
    null = np.zeros((len(fields), n), dtype=bool)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
    for i in [i for i, bits in enumerate(by_column[4]) if bits is not None]:
        k, start = int(lengths[i]), starts[i]
        null[:, start : start + k] = (
            np.unpackbits(np.frombuffer(by_column[4][i], dtype=np.uint8), count=len(fields) * k)
            .reshape(len(fields), k)
            .astype(bool)
        )
    out = np.empty((group.shape[1], len(fields)))
    for j, sp in enumerate(fields):
        v = np.frombuffer(b"".join(by_column[5 + j]), dtype=_LITTLE_ENDIAN[sp.pgtype]).astype(np.float64)
        ok = ~null[j]
        total = np.bincount(inverse, weights=np.where(ok, v, 0.0), minlength=group.shape[1])
        count = np.bincount(inverse, weights=ok, minlength=group.shape[1])
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, j] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return {
        (keys[int(s_)][0], keys[int(s_)][1], int(m)): out[i] for i, (s_, m) in enumerate(group.T.tolist())
    }


def sorted_by_gpu(b: Batch) -> Batch:
    """The batch with its GPU rows in (gpu, time) order."""
    order = np.lexsort((b.gpu["time"].values, b.gpu["gpu"].values))
    return dataclasses.replace(b, gpu={k: c.take(order) for k, c in b.gpu.items()}, span=None)


def backend_us_per_row(server: str, todo: list[Batch], group: int, variant: str) -> dict[str, float]:
    """The backend's CPU and WAL per GPU-sample stored (``rows``: GPU-samples, whatever the layout)."""
    if variant == "rows_sorted_by_gpu":
        todo = [sorted_by_gpu(b) for b in todo]
    shipments, as_bytes = variant in SHIPMENTS, variant == SHIPMENT_BYTES
    fields = shipment_fields(todo[0])
    if shipments:
        # Encoded before the clock starts: only the backend is measured, and the
        # client's row-at-a-time encoding here is no model of the collector's.
        encoded = [shipment_rows(b, fields, as_bytes) for b in todo]
        todo = [dataclasses.replace(b, gpu={}, n_gpu=0) for b in todo]
    with scratch_database(server, "gpufleet_pgrows") as url:
        migrate.upgrade(url, load_settings())
        with psycopg.connect(url, autocommit=True) as c:
            for stmt in VARIANTS.get(variant, []):
                c.execute(stmt)
            if shipments:
                create_shipment_table(c, fields, as_bytes)
        with psycopg.connect(url) as conn:
            pid, lsn = conn.execute("SELECT pg_backend_pid(), pg_current_wal_insert_lsn()").fetchone()  # type: ignore[misc]
            conn.commit()
            cache, touch = sightings.SightingCache(), NodeTouch(10.0)
            c0, t0 = vs_prometheus.cpu_s(pid), time.perf_counter()
            for i in range(0, len(todo), group):
                with conn.transaction():
                    write_batches(conn, todo[i : i + group], sightings_cache=cache, touch=touch)
                    if shipments:
                        copy_shipments(
                            conn, [r for rows in encoded[i : i + group] for r in rows], fields, as_bytes
                        )
            c1, wall = vs_prometheus.cpu_s(pid), time.perf_counter() - t0
            wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn,)).fetchone()[
                0
            ]  # type: ignore[index]
            table = "gpu_shipments" if shipments else "gpu_samples"
            count = "sum(cardinality(offsets_ms))" if shipments else "count(*)"
            rows = conn.execute(f"SELECT {count} FROM {table}").fetchone()[0]  # type: ignore[index]
            size = conn.execute(f"SELECT pg_total_relation_size('{table}')").fetchone()[0]  # type: ignore[index]
            conn.commit()
            r0, p0 = vs_prometheus.cpu_s(pid), time.process_time()
            minutes = minute_averages(conn, variant, fields)
            r1, p1 = vs_prometheus.cpu_s(pid), time.process_time()
            conn.commit()
    return {
        "rows": int(rows),
        "backend_us_per_row": (c1 - c0) / rows * 1e6,
        "wall_us_per_row": wall / rows * 1e6,
        "wal_bytes_per_row": float(wal) / rows,
        "stored_bytes_per_row": float(size) / rows,
        "read_backend_us_per_row": (r1 - r0) / rows * 1e6,
        "read_client_us_per_row": (p1 - p0) / rows * 1e6,
        "read_series_minutes": len(minutes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3000, help="nodes of 8 GPUs")
    ap.add_argument("--seconds", type=int, default=100, help="seconds of samples per node")
    ap.add_argument("--group", type=int, default=120, help="requests per transaction")
    ap.add_argument(
        "--variants",
        action="store_true",
        help='also measure the btree without deduplication, node collated "C", rows sorted by GPU, '
        "and the table without its BRIN and without any index",
    )
    ap.add_argument(
        "--shipment-rows",
        action="store_true",
        help="also measure one row per GPU per shipment, each field's values as an array, and as bytes",
    )
    args = ap.parse_args()
    if min(args.nodes, args.seconds, args.group) <= 0:
        ap.error("--nodes, --seconds and --group must be positive")
    todo = batches(args.nodes, args.seconds)
    server = server_url()
    names = list(VARIANTS) if args.variants else ["as_migrated", "no_btree"]
    if args.shipment_rows:
        names += SHIPMENTS
    got = {name: backend_us_per_row(server, todo, args.group, name) for name in names}
    with_btree, without = got["as_migrated"], got["no_btree"]
    print(f"{len(todo)} batches, {with_btree['rows']} GPU rows, {args.group} requests a transaction")
    labels = {"as_migrated": "as migrated (per-GPU btree)", "no_btree": "baseline, no per-GPU btree"}
    for name, r in got.items():
        print(
            f"  {labels.get(name, name):34s} {r['backend_us_per_row']:5.2f} us of the backend per GPU-sample, "
            f"{r['wal_bytes_per_row']:5.0f} B of WAL, {r['stored_bytes_per_row']:5.0f} B stored; read as the "
            f"rollups do: {r['read_backend_us_per_row']:5.2f} us backend + {r['read_client_us_per_row']:5.2f} "
            "us client"
        )
    print(
        json.dumps(
            {
                "name": "pg_rows",
                "value": round(with_btree["backend_us_per_row"], 2),
                "unit": "backend us per GPU row",
                "baseline_without_btree": round(without["backend_us_per_row"], 2),
                # None where the run was too short for the CPU clock's 10-ms ticks to see
                "btree_share": round(1 - without["backend_us_per_row"] / with_btree["backend_us_per_row"], 3)
                if with_btree["backend_us_per_row"]
                else None,
                "rows": with_btree["rows"],
                "group": args.group,
                "with_btree": with_btree,
                "without_btree": without,
                "variants": got,
            }
        )
    )


if __name__ == "__main__":
    main()
