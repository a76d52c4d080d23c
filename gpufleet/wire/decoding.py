"""Reading a body: decompression with an output cap (bombs stop at it), parsing with object-count bounds."""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson
import zstandard

from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME
from gpufleet.wire.types import JSON, MSGPACK, TooLarge, Unreadable, Unsupported, WireError

_local = threading.local()


def _zstd() -> zstandard.ZstdDecompressor:
    """A decompression context per thread: creating one maps fresh memory,
    which costs far more than decoding a batch."""
    d = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


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
            raise Unreadable(f"gzip body is corrupt: {e}", ("body",)) from e
        if len(out) > max_out or d.unconsumed_tail:
            raise TooLarge(f"gzip body expands beyond the {max_out}-byte limit")
        if not d.eof:
            raise Unreadable("gzip body is truncated", ("body",))
        return out
    if enc == "zstd":
        dctx = _zstd()
        try:
            declared = zstandard.frame_content_size(body)
        except zstandard.ZstdError as e:
            raise Unreadable(f"zstd body is corrupt: {e}", ("body",)) from e
        if declared > max_out:
            raise TooLarge(f"zstd body declares {declared} bytes, beyond the {max_out}-byte limit")
        if declared >= 0:
            # A frame that declares its size cannot produce more than that
            # (zstd refuses a mismatch), so one-shot decoding is bounded.
            dobj = dctx.decompressobj()
            try:
                out = dobj.decompress(body)
            except zstandard.ZstdError as e:
                raise Unreadable(f"zstd body is corrupt: {e}", ("body",)) from e
            if dobj.unused_data:
                raise Unreadable("zstd body has data after its frame; send one frame", ("body",))
            if len(out) > max_out:
                raise TooLarge(f"zstd body expands beyond the {max_out}-byte limit")
            return out
        try:
            reader = dctx.stream_reader(body, read_across_frames=True)
            out = reader.read(max_out + 1)
        except zstandard.ZstdError as e:
            raise Unreadable(f"zstd body is corrupt: {e}", ("body",)) from e
        if len(out) > max_out:
            raise TooLarge(f"zstd body expands beyond the {max_out}-byte limit")
        return out
    raise Unsupported(
        f"unsupported Content-Encoding {encoding!r} (use gzip, zstd or none)", ("Content-Encoding",)
    )


#: Parse bounds (see :func:`parse`).  Nesting: both parsers stop at 1024
#: levels on their own (msgpack's and orjson's fixed stacks); ``facts`` and
#: ``agent``, the only free-form parts, are then held to 16 by validation.
MAX_MAP_LEN = 20_000
#: Containers (objects and arrays) beyond the row-form samples themselves.
CONTAINER_SLACK = 25_000
#: Values per sample a legal batch can hold (every GPU field in row form), for the element bound.
FIELDS_PER_SAMPLE = max(len(GPU_BY_NAME), len(HOST_BY_NAME)) + 4


@dataclass(frozen=True)
class ParseLimits:
    """How much structure one body may hold, whatever its byte size: a 1 KB zstd
    body can expand to 32 MiB of empty maps, each a Python object of 64 bytes."""

    #: Longest array (a column, or the rows of a section, has one value per sample).
    max_array_len: int = 50_001
    #: Most entries in one object.
    max_map_len: int = MAX_MAP_LEN
    #: Most objects and arrays in the whole body.
    max_containers: int = 50_001 + CONTAINER_SLACK
    #: Most values (array elements and object entries) in the whole body.
    max_elements: int = 50_001 * FIELDS_PER_SAMPLE + CONTAINER_SLACK

    @classmethod
    def for_samples(cls, max_samples: int) -> ParseLimits:
        n = max_samples + 1
        return cls(
            max_array_len=max(n, 1024),
            max_containers=n + CONTAINER_SLACK,
            max_elements=n * FIELDS_PER_SAMPLE + CONTAINER_SLACK,
        )


DEFAULT_LIMITS = ParseLimits()


def parse(raw: bytes, content_type: str | None, limits: ParseLimits = DEFAULT_LIMITS) -> Any:
    """Decode a body, refusing (413) one that holds more structure than ``limits``
    before building it: JSON is counted on its bytes first (brackets and commas,
    an upper bound), msgpack as it is unpacked (array/map headers are checked
    before their memory is allocated, containers as they complete)."""
    ctype = (content_type or JSON).split(";")[0].strip().lower()
    if ctype in (JSON, "text/json"):
        containers = raw.count(b"{") + raw.count(b"[")
        if containers > limits.max_containers:
            raise TooLarge(f"body holds over {limits.max_containers} objects and arrays")
        if raw.count(b",") > limits.max_elements:
            raise TooLarge(f"body holds over {limits.max_elements} values")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise Unreadable(f"body is not valid JSON: {e}", ("body",)) from e
    if ctype in (MSGPACK, "application/x-msgpack", "application/vnd.msgpack"):
        count = [0, 0]  # containers, elements

        def seen(obj: Any) -> Any:
            count[0] += 1
            count[1] += len(obj)
            if count[0] > limits.max_containers:
                raise TooLarge(f"body holds over {limits.max_containers} objects and arrays")
            if count[1] > limits.max_elements:
                raise TooLarge(f"body holds over {limits.max_elements} values")
            return obj

        try:
            if len(raw) <= min(limits.max_containers, limits.max_elements):
                # Every msgpack object and every value takes at least a byte: a
                # body this short cannot exceed the structure bounds, so nothing
                # needs counting as it is unpacked.
                return msgpack.unpackb(
                    raw,
                    raw=False,
                    strict_map_key=True,
                    max_array_len=limits.max_array_len,
                    max_map_len=limits.max_map_len,
                )
            return msgpack.unpackb(
                raw,
                raw=False,
                strict_map_key=True,
                object_hook=seen,
                list_hook=seen,
                max_array_len=limits.max_array_len,
                max_map_len=limits.max_map_len,
            )
        except WireError:
            raise
        except (msgpack.UnpackException, ValueError, TypeError) as e:
            if "exceeds max_" in str(e):
                raise TooLarge(f"body holds a longer array or object than allowed: {e}") from e
            raise Unreadable(f"body is not valid msgpack: {e}", ("body",)) from e
    raise Unsupported(
        f"unsupported Content-Type {content_type!r} (use {JSON} or {MSGPACK})", ("Content-Type",)
    )
