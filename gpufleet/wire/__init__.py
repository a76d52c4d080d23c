"""The ingest wire format shared by agents and the collector.

A batch is one object, JSON or msgpack, optionally gzip- or zstd-compressed::

    {"batch_id": "<agent-id>:<seq>",        # idempotency key, [A-Za-z0-9._:-]{1,128}
     "node": "gpu-node-01",                  # the sending node (must match its token)
     "gpu":  {"time": [...], "gpu": [...], "power_w": [...], ...},   # columnar
     "host": {"time": [...], "cpu_user_pct": [...], ...},            # columnar
     "facts": {...}}                          # optional node facts

``gpu`` and ``host`` may also be lists of row objects.  Times are epoch
seconds (numbers).  Columns are named by the metric catalog; ``null`` is a
missing value.

In msgpack, a numeric column may also be a typed array: ``{"dtype": "f8",
"data": <bin>, "nulls": <bin>}`` with ``dtype`` one of f4, f8, i1, i2, i4,
i8, u1, u2, u4 (little-endian) and ``nulls`` an optional bitmap (numpy
``packbits`` order, 1 = NULL).  The collector reads such a column with one
``frombuffer`` and no Python object per value, which is what keeps ingest
near the database's COPY rate; the agents send this form.

The package is split by concern: :mod:`~gpufleet.wire.types` (the batch, its
limits and errors), :mod:`~gpufleet.wire.encoding` (the agent side),
:mod:`~gpufleet.wire.decoding` (decompression and parsing, bounded) and
:mod:`~gpufleet.wire.validation` (one checked path to typed columns).  HTTP
statuses belong to the collector (:mod:`gpufleet.collector.ingest`).

The names below load their module on first use: the agent, installed without
numpy (``pip install gpufleet``), imports :func:`encode` and :data:`MAX_TEXT`
from here and must not pull in the collector's decoding and validation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.wire.decoding import (
        CONTAINER_SLACK,
        DEFAULT_LIMITS,
        MAX_MAP_LEN,
        ParseLimits,
        decompress,
        parse,
    )
    from gpufleet.wire.encoding import KIND_DTYPE, TYPED_DTYPES, encode, typed_column
    from gpufleet.wire.types import (
        BATCH_ID_RE,
        JSON,
        MAX_TEXT,
        MSGPACK,
        NODE_RE,
        Batch,
        Column,
        Columns,
        TooLarge,
        Unreadable,
        Unsupported,
        WireError,
        WrongNode,
    )
    from gpufleet.wire.validation import as_lists, column_list, drop_skewed, validate

#: Where each exported name lives.
_HOME = {
    **dict.fromkeys(
        ("CONTAINER_SLACK", "DEFAULT_LIMITS", "MAX_MAP_LEN", "ParseLimits", "decompress", "parse"), "decoding"
    ),
    **dict.fromkeys(("KIND_DTYPE", "TYPED_DTYPES", "encode", "typed_column"), "encoding"),
    **dict.fromkeys(
        (
            "BATCH_ID_RE",
            "JSON",
            "MAX_TEXT",
            "MSGPACK",
            "NODE_RE",
            "Batch",
            "Column",
            "Columns",
            "TooLarge",
            "Unreadable",
            "Unsupported",
            "WireError",
            "WrongNode",
        ),
        "types",
    ),
    **dict.fromkeys(("as_lists", "column_list", "drop_skewed", "validate"), "validation"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BATCH_ID_RE",
    "CONTAINER_SLACK",
    "DEFAULT_LIMITS",
    "JSON",
    "KIND_DTYPE",
    "MAX_MAP_LEN",
    "MAX_TEXT",
    "MSGPACK",
    "NODE_RE",
    "TYPED_DTYPES",
    "Batch",
    "Column",
    "Columns",
    "ParseLimits",
    "TooLarge",
    "Unreadable",
    "Unsupported",
    "WireError",
    "WrongNode",
    "as_lists",
    "column_list",
    "decompress",
    "drop_skewed",
    "encode",
    "parse",
    "typed_column",
    "validate",
]
