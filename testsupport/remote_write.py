"""Remote-write requests as Prometheus builds them, for the tests and the benchmark.

An encoder written from the remote-write 1.0 message definitions, independent
of the collector's decoder, producing what Prometheus's ``prompb`` marshals:
labels sorted by name, then the samples; a sample's value is left out when it
is 0 and its timestamp when it is 0 (proto3 defaults); one ``TimeSeries`` per
sample, as Prometheus's queue manager sends them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

import cramjam
from prometheus_client.parser import text_string_to_metric_families

#: (labels incl. ``__name__``, [(value, timestamp ms), ...])
Series = tuple[Mapping[str, str], Sequence[tuple[float, int]]]

HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def label(name: str, value: str) -> bytes:
    return _field(1, name.encode()) + _field(2, value.encode())


def sample(value: float, ts_ms: int) -> bytes:
    out = b""
    if value != 0.0 or value != value:
        out += b"\x09" + struct.pack("<d", value)
    if ts_ms:
        out += b"\x10" + varint(ts_ms)
    return out


def series(labels: Mapping[str, str], samples: Sequence[tuple[float, int]]) -> bytes:
    body = b"".join(_field(1, label(k, labels[k])) for k in sorted(labels) if labels[k] != "")
    body += b"".join(_field(2, sample(v, t)) for v, t in samples)
    return body


def write_request(all_series: Iterable[Series]) -> bytes:
    """The protobuf ``WriteRequest`` (not compressed)."""
    return b"".join(_field(1, series(labels, samples)) for labels, samples in all_series)


def compress(raw: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(raw))


def from_exposition(text: str, ts_ms: int, extra: Mapping[str, str] | None = None) -> list[Series]:
    """A text exposition as one scrape's series (one sample each), with the target labels Prometheus
    adds (``extra``: ``instance``, ``job``)."""
    out: list[Series] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {**s.labels, **(extra or {}), "__name__": s.name}
            out.append((labels, [(float(s.value), ts_ms)]))
    return out
