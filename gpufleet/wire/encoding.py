"""Encoding a batch, agent side: typed numeric columns, msgpack or JSON, compression, and its headers.

Typed arrays are packed with the standard library's :mod:`array`, not numpy:
the agent runs from the light install (``pip install gpufleet``), which has no
numpy; the collector reads what this writes with numpy's ``frombuffer``.
"""

from __future__ import annotations

import gzip
import operator
import sys
from array import array
from typing import Any

import msgpack
import orjson
import zstandard

from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME, Field
from gpufleet.wire.types import JSON, MSGPACK


def encode(
    batch: dict[str, Any], fmt: str = "msgpack", compression: str | None = "zstd", typed: bool = True
) -> tuple[bytes, dict[str, str]]:
    """Serialise a batch dict; returns body and the HTTP headers describing it.

    With msgpack and ``typed``, numeric columns travel as typed arrays.
    """
    if fmt == "msgpack":
        if typed:
            batch = {
                k: (
                    _typed_section(v, GPU_BY_NAME if k == "gpu" else HOST_BY_NAME)
                    if k in ("gpu", "host") and isinstance(v, dict)
                    else v
                )
                for k, v in batch.items()
            }
        body = msgpack.packb(batch, use_bin_type=True)
        headers = {"Content-Type": MSGPACK}
    elif fmt == "json":
        body = orjson.dumps(batch)
        headers = {"Content-Type": JSON}
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if compression == "zstd":
        body = zstandard.ZstdCompressor(level=3).compress(body)
        headers["Content-Encoding"] = "zstd"
    elif compression == "gzip":
        body = gzip.compress(body, 5)
        headers["Content-Encoding"] = "gzip"
    elif compression is not None:
        raise ValueError(f"unknown compression {compression!r}")
    return body, headers


TYPED_DTYPES = {
    "f4": "<f4",
    "f8": "<f8",
    "i1": "<i1",
    "i2": "<i2",
    "i4": "<i4",
    "i8": "<i8",
    "u1": "<u1",
    "u2": "<u2",
    "u4": "<u4",
}
KIND_DTYPE = {"real": "f4", "double": "f8", "smallint": "i2", "integer": "i4", "bigint": "i8"}


#: The :mod:`array` type code of each wire dtype (sizes checked below, where the module is loaded).
_TYPECODES = {
    "f4": "f",
    "f8": "d",
    "i1": "b",
    "i2": "h",
    "i4": "i",
    "i8": "q",
    "u1": "B",
    "u2": "H",
    "u4": "I",
}
assert all(array(code).itemsize == int(dt[1]) for dt, code in _TYPECODES.items()), "unexpected C type sizes"


def _packed(values: list[Any], dtype: str) -> bytes:
    """Little-endian bytes of ``values`` as ``dtype``; TypeError or OverflowError when one does not fit
    (a float in an integer column is not truncated)."""
    code = _TYPECODES[dtype]
    if code in "fd":
        arr = array(code, [float(v) for v in values])
    else:
        arr = array(code, [operator.index(v) for v in values])
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def null_bitmap(nulls: list[bool]) -> bytes:
    """One bit per value, 1 = NULL, first value in the high bit of the first byte (numpy ``packbits`` order)."""
    out = bytearray((len(nulls) + 7) // 8)
    for i, null in enumerate(nulls):
        if null:
            out[i >> 3] |= 0x80 >> (i & 7)
    return bytes(out)


def typed_column(values: list[Any], dtype: str) -> dict[str, Any] | list[Any]:
    """A numeric list as a typed array (the list itself if it does not fit)."""
    try:
        if None in values:
            nulls = [v is None for v in values]
            data = _packed([0 if v is None else v for v in values], dtype)
            return {"dtype": dtype, "data": data, "nulls": null_bitmap(nulls)}
        return {"dtype": dtype, "data": _packed(values, dtype)}
    except (TypeError, ValueError, OverflowError):
        return values


def _typed_section(cols: dict[str, Any], known: dict[str, Field]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in cols.items():
        if not isinstance(values, list):
            out[name] = values
        elif name == "time":
            out[name] = typed_column(values, "f8")
        elif name == "gpu":
            out[name] = typed_column(values, "i2")
        elif (
            name in known and known[name].kind in KIND_DTYPE and not any(isinstance(v, bool) for v in values)
        ):
            out[name] = typed_column(values, KIND_DTYPE[known[name].kind])
        else:
            out[name] = values
    return out
