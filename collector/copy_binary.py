"""PostgreSQL binary COPY rows built from validated columns with numpy.

Formatting wide rows one Python tuple at a time costs several microseconds a
row, more than the database spends storing it.  Rows that share a layout
(which fields are NULL, how long each text value is) have a fixed byte
layout, so a numpy structured array with big-endian fields *is* their COPY
encoding: filling it is one strided copy per column.  Agents send the same
fields sample after sample, so a batch is usually one layout; mixed batches
are grouped by layout first.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, cast

import numpy as np

from gpufleet.wire import Column

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
PG_EPOCH_S = 946684800.0  # 2000-01-01T00:00:00Z

FIXED = {"timestamptz": ">i8", "float4": ">f4", "float8": ">f8", "int2": ">i2", "int4": ">i4", "int8": ">i8"}


@dataclass(frozen=True)
class Spec:
    name: str
    pgtype: str  # one of FIXED or "text"
    #: float4 only: mantissa bits kept (gpufleet.catalog.Field.bits); None keeps all.
    bits: int | None = None


def round_mantissa(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` as float32 rounded to nearest with ``bits`` mantissa bits.

    Done on the bit pattern: adding half of the dropped part and clearing it
    rounds the magnitude (a carry into the exponent is the next power of
    two, as it should be); zero, the sign and values already that short stay
    as they are.  A value that would round past float4's range keeps its
    own bits.
    """
    v = np.ascontiguousarray(values, dtype=np.float32)
    drop = 23 - bits
    if drop <= 0:
        return v
    u = v.view(np.uint32)
    mask = np.uint32((1 << drop) - 1)
    r = ((u + np.uint32(1 << (drop - 1))) & ~mask).view(np.float32)
    return np.where(np.isfinite(r), r, v)


def _prepare(
    spec: Spec, col: Column | str | None, n: int
) -> tuple[Any, np.ndarray | None, np.ndarray | None]:
    """(values ready for the dtype, null mask, text byte lengths)."""
    if col is None:
        return None, np.ones(n, dtype=bool), None
    if isinstance(col, str):  # a constant text value (the batch's node)
        b = col.encode()
        return [b] * n, None, np.full(n, len(b), dtype=np.int64)
    if spec.pgtype == "text":
        if isinstance(col.values, np.ndarray):
            return col.values, col.null, col.lengths
        vals = [b"" if v is None else v.encode() for v in col.values]
        lengths = np.fromiter(map(len, vals), dtype=np.int64, count=n)
        return vals, col.null, lengths
    v = col.values
    if spec.pgtype == "timestamptz":
        v = np.round((v - PG_EPOCH_S) * 1e6).astype(np.int64)
    elif spec.bits is not None:
        v = round_mantissa(v, spec.bits)
    return v, col.null, None


#: Per (fields, lengths): a one-row structured array with the field count and lengths filled in.
_TEMPLATES: dict[tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]], np.ndarray] = {}


def concat_parts(
    specs: Sequence[Spec], parts: Sequence[tuple[str, dict[str, Column], int]]
) -> tuple[dict[str, Column], int]:
    """Merge the columns of many batches (one node each) into one set of columns,
    so a whole group commit is encoded in one pass."""
    counts = [n for _, _, n in parts]
    total = sum(counts)
    merged: dict[str, Column] = {}
    from_blocks = _merged_blocks(parts)
    for spec in specs:
        if spec.name in from_blocks:
            merged[spec.name] = from_blocks[spec.name]
            continue
        if spec.name == "node":
            names = [node.encode() for node, _, _ in parts]
            arr = np.repeat(np.array(names, dtype=f"S{max(map(len, names))}"), counts)
            merged["node"] = Column(
                arr, None, np.repeat(np.fromiter(map(len, names), np.int64, len(names)), counts)
            )
            continue
        cols = [c.get(spec.name) for _, c, _ in parts]
        if None not in cols:
            # Every part carries the column (a group of one layout always does): none to fill in.
            merged[spec.name] = _column(spec, *_merge_full(spec, cast(list[Column], cols), counts))
        elif cols.count(None) != len(cols):
            merged[spec.name] = _column(spec, *_merge_sparse(spec, cols, counts))
    return merged, total


def _merged_blocks(parts: Sequence[tuple[str, dict[str, Column], int]]) -> dict[str, Column]:
    """The numeric columns of parts that all hold them as rows of matrices of one layout
    (:class:`gpufleet.wire.Columns`, as validation leaves an agent's batch), merged a
    matrix at a time: one concatenation per matrix instead of one per column.  Equal
    row names are what make two parts' matrices one layout: a part's row ``i`` is then
    the same column as every other part's."""
    all_blocks = [getattr(cols, "blocks", None) for _, cols, _ in parts]
    first = all_blocks[0] if all_blocks else None
    if not first:
        return {}
    alike = []
    for blocks in all_blocks:
        if (
            blocks is None
            or len(blocks) != len(first)
            or any(names != want for (_, names), (_, want) in zip(blocks, first, strict=True))
        ):
            return {}
        alike.append(blocks)
    out: dict[str, Column] = {}
    for k, (_, names) in enumerate(first):
        if names:
            rows = np.concatenate([blocks[k][0] for blocks in alike], axis=1)
            out.update(zip(names, map(Column, rows), strict=True))
    return out


def _merge_full(spec: Spec, cols: list[Column], counts: list[int]) -> tuple[Any, np.ndarray | None]:
    """One column every part carries: its values end to end, and a NULL mask where any part has one."""
    nulls = [c.null for c in cols]
    null = (
        None
        if all([m is None for m in nulls])
        else np.concatenate(
            [np.zeros(n, dtype=bool) if m is None else m for m, n in zip(nulls, counts, strict=True)]
        )
    )
    if spec.pgtype == "text":
        return list(chain.from_iterable([c.values for c in cols])), null
    return np.concatenate([c.values for c in cols]), null


def _merge_sparse(spec: Spec, cols: list[Column | None], counts: list[int]) -> tuple[Any, np.ndarray]:
    """One column that some parts lack: theirs are NULL."""
    null = np.concatenate(
        [
            np.ones(n, dtype=bool)
            if c is None
            else (c.null if c.null is not None else np.zeros(n, dtype=bool))
            for c, n in zip(cols, counts, strict=True)
        ]
    )
    if spec.pgtype == "text":
        values: list[Any] = []
        for c, n in zip(cols, counts, strict=True):
            values.extend([None] * n if c is None else c.values)
        return values, null
    dt = next(c.values.dtype for c in cols if c is not None)
    return np.concatenate(
        [np.zeros(n, dtype=dt) if c is None else c.values for c, n in zip(cols, counts, strict=True)]
    ), null


def _column(spec: Spec, values: Any, null: np.ndarray | None) -> Column:
    """A merged column; ASCII text packed for the COPY (other text stays a list, encoded row by row)."""
    if spec.pgtype == "text":
        packed = _ascii_array(values)
        if packed is not None:
            return Column(packed[0], null, packed[1])
    return Column(values, null)


def _ascii_array(values: list[str | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """Pack ASCII text into a fixed-width bytes array plus lengths (None: not ASCII)."""
    present: list[str] = [v or "" for v in values] if None in values else values  # type: ignore[assignment]
    joined = "".join(present)
    if not joined.isascii():
        return None
    lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
    width = int(lengths.max()) if len(lengths) else 0
    if width and int(lengths.min()) == width:
        # Values of one length (a GPU's UUID, a group commit's every row): their joined
        # bytes are the array already, a third of the cost of converting each string.
        return np.frombuffer(joined.encode("ascii"), dtype=f"S{width}"), lengths
    return np.array(present, dtype=f"S{max(width, 1)}"), lengths


def encode_rows(specs: Sequence[Spec], cols: Mapping[str, Column | str | None], n: int) -> bytes | memoryview:
    """COPY BINARY tuples (no header/trailer) for ``n`` rows of ``cols``: the encoded
    rows' own memory where they are of one layout (a group commit's rows are a
    megabyte, and a copy of them costs as much as filling them), else bytes."""
    if n == 0:
        return b""
    prepared = [_prepare(s, cols.get(s.name), n) for s in specs]
    if not all(_constant(null, lengths) for _vals, null, lengths in prepared):
        # Rows of more than one layout (a NULL here, a longer text there): one pass per layout.
        key = np.column_stack(
            [
                part
                for _vals, null, lengths in prepared
                for part in (None if null is None else null.astype(np.int64), lengths)
                if part is not None
            ]
        )
        _, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        out = []
        for g in range(int(inverse.max()) + 1):
            idx = np.flatnonzero(inverse == g)
            out.append(_encode_uniform(specs, prepared, idx, len(idx)))
        return b"".join(out)
    return _encode_uniform(specs, prepared, None, n)


def _constant(null: np.ndarray | None, lengths: np.ndarray | None) -> bool:
    """Whether a column's layout is the same in every row: NULL in all or none, one byte length."""
    if null is not None and null.any() and not null.all():
        return False
    return lengths is None or int(lengths.min()) == int(lengths.max())


def _encode_uniform(
    specs: Sequence[Spec],
    prepared: list[tuple[Any, np.ndarray | None, np.ndarray | None]],
    idx: np.ndarray | None,
    m: int,
) -> memoryview:
    """Rows ``idx`` (all rows when None) share one layout: fill a structured array.

    The field count and every length are the same in each row, so they are
    one template row repeated (one ``np.tile``, not a strided store per field);
    each value column is converted to its big-endian type contiguously before
    its one strided store, which costs half of converting while storing."""
    fields: list[tuple[str, str]] = [("nf", ">i2")]
    fills: list[tuple[str, Any, str]] = []
    lens: list[tuple[str, int]] = []
    for j, (spec, (vals, null, lengths)) in enumerate(zip(specs, prepared, strict=True)):
        first = 0 if idx is None else int(idx[0])
        is_null = null is not None and bool(null[first])
        fields.append((f"l{j}", ">i4"))
        if is_null:
            lens.append((f"l{j}", -1))
            continue
        if spec.pgtype == "text":
            assert lengths is not None
            size = int(lengths[first])
            fmt = f"S{size}" if size else "S1"
            if size:
                fields.append((f"v{j}", fmt))
                if isinstance(vals, np.ndarray):
                    sel = vals if idx is None else vals[idx]
                else:
                    sel = vals if idx is None else [vals[i] for i in idx.tolist()]
                fills.append((f"v{j}", sel, fmt))
            lens.append((f"l{j}", size))
        else:
            fmt = FIXED[spec.pgtype]
            fields.append((f"v{j}", fmt))
            fills.append((f"v{j}", vals if idx is None else vals[idx], fmt))
            lens.append((f"l{j}", np.dtype(fmt).itemsize))
    key = (tuple(fields), tuple(lens))
    row = _TEMPLATES.get(key)
    if row is None:
        row = np.zeros(1, dtype=np.dtype(fields))
        row["nf"] = len(specs)
        for name, value in lens:
            row[name] = value
        if len(_TEMPLATES) < 1024:
            _TEMPLATES[key] = row
    arr = np.tile(row, m)
    for name, value, fmt in fills:
        arr[name] = np.asarray(value, dtype=fmt) if fmt[0] == ">" else value
    return arr.view(np.uint8).data
