"""The ingest wire format shared by agents and the collector.

A batch is one object, JSON or msgpack, optionally gzip- or zstd-compressed::

    {"batch_id": "<agent-id>:<seq>",        # idempotency key, [A-Za-z0-9._:-]{1,128}
     "node": "gpu-node-01",                  # the sending node (must match its token)
     "gpu":  {"time": [...], "gpu": [...], "power_w": [...], ...},   # columnar
     "host": {"time": [...], "cpu_user_pct": [...], ...},            # columnar
     "facts": {...}}                          # optional node facts

``gpu`` and ``host`` may also be lists of row objects.  Times are epoch
seconds (numbers).  Columns are named by the metric catalog; ``null`` is a
missing value.  Columnar payloads decode without a Python object per sample,
which is what keeps ingest near the database's COPY rate.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import orjson
import zstandard

from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME, INT_RANGES, Field

BATCH_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,252}$")
MAX_TEXT = 256
TOP_LEVEL = frozenset({"batch_id", "node", "gpu", "host", "facts", "agent"})

JSON = "application/json"
MSGPACK = "application/msgpack"


class WireError(ValueError):
    """A batch is malformed.  ``loc`` names where (e.g. ("gpu", 17, "power_w"))."""

    def __init__(self, msg: str, loc: tuple[Any, ...] = (), status: int = 422) -> None:
        super().__init__(msg)
        self.msg = msg
        self.loc = loc
        self.status = status

    def detail(self) -> dict[str, Any]:
        where = ""
        if len(self.loc) >= 3 and isinstance(self.loc[1], int):
            where = f"{self.loc[0]} sample {self.loc[1]}, field '{self.loc[2]}': "
        elif len(self.loc) >= 2:
            where = f"{self.loc[0]} field '{self.loc[1]}': "
        elif self.loc:
            where = f"'{self.loc[0]}': "
        return {"loc": list(self.loc), "msg": where + self.msg}


class TooLarge(WireError):
    def __init__(self, msg: str) -> None:
        super().__init__(msg, (), 413)


@dataclass
class Batch:
    batch_id: str
    node: str
    #: Columnar samples; every list has the same length (``n_gpu``/``n_host``).
    gpu: dict[str, list[Any]] = field(default_factory=dict)
    host: dict[str, list[Any]] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    n_gpu: int = 0
    n_host: int = 0
    #: Samples refused by the clock-skew check, counted per node.
    rejected_skew: int = 0

    def time_range(self) -> tuple[float, float] | None:
        ts = [*self.gpu.get("time", ()), *self.host.get("time", ())]
        if not ts:
            return None
        return min(ts), max(ts)


# ----------------------------------------------------------------------------
# Encoding (agent side)


def encode(batch: dict[str, Any], fmt: str = "msgpack", compression: str | None = "zstd") -> tuple[bytes, dict[str, str]]:
    """Serialise a batch dict; returns body and the HTTP headers describing it."""
    if fmt == "msgpack":
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


# ----------------------------------------------------------------------------
# Decompression with an output cap (decompression bombs stop at the cap)


def decompress(body: bytes, encoding: str | None, max_out: int) -> bytes:
    enc = (encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        if len(body) > max_out:
            raise TooLarge(f"body of {len(body)} bytes exceeds the {max_out}-byte limit")
        return body
    if enc == "gzip":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(body, max_out + 1)
        except zlib.error as e:
            raise WireError(f"gzip body is corrupt: {e}", ("body",), 400) from e
        if len(out) > max_out or d.unconsumed_tail:
            raise TooLarge(f"gzip body expands beyond the {max_out}-byte limit")
        if not d.eof:
            raise WireError("gzip body is truncated", ("body",), 400)
        return out
    if enc == "zstd":
        dctx = zstandard.ZstdDecompressor()
        try:
            reader = dctx.stream_reader(body, read_across_frames=True)
            out = reader.read(max_out + 1)
        except zstandard.ZstdError as e:
            raise WireError(f"zstd body is corrupt: {e}", ("body",), 400) from e
        if len(out) > max_out:
            raise TooLarge(f"zstd body expands beyond the {max_out}-byte limit")
        return out
    raise WireError(f"unsupported Content-Encoding {encoding!r} (use gzip, zstd or none)", ("Content-Encoding",), 415)


def parse(raw: bytes, content_type: str | None) -> Any:
    ctype = (content_type or JSON).split(";")[0].strip().lower()
    if ctype in (JSON, "text/json"):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise WireError(f"body is not valid JSON: {e}", ("body",), 400) from e
    if ctype in (MSGPACK, "application/x-msgpack", "application/vnd.msgpack"):
        try:
            return msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except (msgpack.UnpackException, ValueError, TypeError) as e:
            raise WireError(f"body is not valid msgpack: {e}", ("body",), 400) from e
    raise WireError(f"unsupported Content-Type {content_type!r} (use {JSON} or {MSGPACK})", ("Content-Type",), 415)


# ----------------------------------------------------------------------------
# Validation


_NUMERIC = (int, float)
_NONE = type(None)


def _columns(obj: Any, section: str, known: dict[str, Field], key: tuple[str, ...]) -> tuple[dict[str, list[Any]], int]:
    """Normalise a section (columns or rows) to columns, checking names and lengths."""
    if obj is None:
        return {}, 0
    if isinstance(obj, list):
        cols: dict[str, list[Any]] = {}
        n = len(obj)
        for i, row in enumerate(obj):
            if not isinstance(row, dict):
                raise WireError("must be an object of field values", (section, i))
            for name in row:
                if name not in known and name not in key and name != "node":
                    raise WireError("unknown field", (section, i, name))
                if name not in cols:
                    cols[name] = [None] * n
            for name, v in row.items():
                cols[name][i] = v
        return cols, n
    if isinstance(obj, dict):
        n = -1
        for name, col in obj.items():
            if not isinstance(name, str) or (name not in known and name not in key and name != "node"):
                raise WireError("unknown field", (section, name))
            if not isinstance(col, list):
                raise WireError("column must be a list", (section, name))
            if n == -1:
                n = len(col)
            elif len(col) != n:
                raise WireError(f"column has {len(col)} values, others have {n}", (section, name))
        return dict(obj), max(n, 0)
    raise WireError("must be a list of samples or an object of columns", (section,))


def _bad_index(col: list[Any], pred: Any) -> int:
    for i, v in enumerate(col):
        if pred(v):
            return i
    return -1


def _check_numeric(section: str, name: str, col: list[Any], kind: str, lo: float | None, hi: float | None,
                   required: bool) -> list[Any]:
    types = set(map(type, col))
    if not types <= {int, float, _NONE}:
        i = _bad_index(col, lambda v: type(v) not in (int, float, _NONE))
        raise WireError(f"must be a number or null, got {type(col[i]).__name__}", (section, i, name))
    if required and _NONE in types:
        raise WireError("is required", (section, col.index(None), name))
    if not col:
        return col
    if kind in INT_RANGES:
        ilo, ihi = INT_RANGES[kind]
        lo = ilo if lo is None else max(lo, ilo)
        hi = ihi if hi is None else min(hi, ihi)
        if float in types:
            def not_integral(v: Any) -> bool:
                return type(v) is float and (not math.isfinite(v) or v != int(v))
            i = _bad_index(col, not_integral)
            if i >= 0:
                raise WireError(f"must be an integer, got {col[i]!r}", (section, i, name))
            col = [None if v is None else int(v) for v in col]
        if lo is not None or hi is not None:
            def out(v: Any) -> bool:
                return v is not None and ((lo is not None and v < lo) or (hi is not None and v > hi))
            i = _bad_index(col, out)
            if i >= 0:
                raise WireError(f"{col[i]} is outside [{lo}, {hi}]", (section, i, name))
        return col
    arr = np.array(col, dtype=np.float64)  # None -> NaN
    nones = col.count(None) if _NONE in types else 0
    finite = np.isfinite(arr)
    if int((~finite).sum()) != nones:
        i = _bad_index(col, lambda v: type(v) is float and not math.isfinite(v))
        raise WireError(f"{col[i]!r} is not allowed (use null for a missing value)", (section, i, name))
    if lo is not None or hi is not None:
        vals = arr[finite]
        if vals.size and ((lo is not None and vals.min() < lo) or (hi is not None and vals.max() > hi)):
            def out(v: Any) -> bool:
                return v is not None and ((lo is not None and v < lo) or (hi is not None and v > hi))
            i = _bad_index(col, out)
            raise WireError(f"{col[i]} is outside [{lo}, {hi}]", (section, i, name))
    return col


def _check_text(section: str, name: str, col: list[Any]) -> None:
    for i, v in enumerate(col):
        if v is None:
            continue
        if type(v) is not str:
            raise WireError(f"must be a string or null, got {type(v).__name__}", (section, i, name))
        if len(v) > MAX_TEXT or "\x00" in v:
            raise WireError(f"must be at most {MAX_TEXT} characters without NUL", (section, i, name))


def _check_section(section: str, cols: dict[str, list[Any]], n: int, node: str, known: dict[str, Field],
                   key: tuple[str, ...]) -> dict[str, list[Any]]:
    if n == 0:
        return {}
    for k in key:
        if k not in cols:
            raise WireError("is required", (section, 0, k))
    node_col = cols.pop("node", None)
    if node_col is not None:
        i = _bad_index(node_col, lambda v: v != node)
        if i >= 0:
            raise WireError(f"sample names node {node_col[i]!r}, batch is for {node!r}", (section, i, "node"), 403)
    out: dict[str, list[Any]] = {}
    out["time"] = _check_numeric(section, "time", cols["time"], "double", 0, 4102444800.0, True)
    if "gpu" in key:
        out["gpu"] = _check_numeric(section, "gpu", cols["gpu"], "smallint", 0, None, True)
    for name, col in cols.items():
        if name in key:
            continue
        f = known[name]
        if f.kind == "text":
            _check_text(section, name, col)
            out[name] = col
        else:
            out[name] = _check_numeric(section, name, col, f.kind, f.lo, f.hi, False)
    return out


def validate(doc: Any) -> Batch:
    """Check a parsed batch against the catalog; raise WireError naming the spot."""
    if not isinstance(doc, dict):
        raise WireError("batch must be an object", ("body",))
    for k in doc:
        if k not in TOP_LEVEL:
            raise WireError("unknown field", (k,))
    batch_id = doc.get("batch_id")
    if not isinstance(batch_id, str) or not BATCH_ID_RE.match(batch_id):
        raise WireError("is required: 1-128 characters of [A-Za-z0-9._:-]", ("batch_id",))
    node = doc.get("node")
    if not isinstance(node, str) or not NODE_RE.match(node):
        raise WireError("is required: a host name of [A-Za-z0-9._-]", ("node",))
    facts = doc.get("facts")
    if facts is not None and not isinstance(facts, dict):
        raise WireError("must be an object", ("facts",))
    gcols, ng = _columns(doc.get("gpu"), "gpu", GPU_BY_NAME, ("time", "gpu"))
    hcols, nh = _columns(doc.get("host"), "host", HOST_BY_NAME, ("time",))
    gpu = _check_section("gpu", gcols, ng, node, GPU_BY_NAME, ("time", "gpu"))
    host = _check_section("host", hcols, nh, node, HOST_BY_NAME, ("time",))
    return Batch(batch_id=batch_id, node=node, gpu=gpu, host=host, facts=facts, n_gpu=ng, n_host=nh)


def drop_skewed(batch: Batch, now: float, future_s: float, past_s: float) -> Batch:
    """Remove samples outside [now - past_s, now + future_s]; count them."""
    lo, hi = now - past_s, now + future_s
    rejected = 0
    for section in ("gpu", "host"):
        cols = getattr(batch, section)
        if not cols:
            continue
        t = np.asarray(cols["time"], dtype=np.float64)
        keep = (t >= lo) & (t <= hi)
        if keep.all():
            continue
        rejected += int((~keep).sum())
        idx = np.flatnonzero(keep).tolist()
        new = {k: [v[i] for i in idx] for k, v in cols.items()}
        setattr(batch, section, new if idx else {})
        setattr(batch, f"n_{section}", len(idx))
    batch.rejected_skew = rejected
    return batch
