"""Prometheus remote write 1.0 bodies: snappy, then the protobuf ``WriteRequest``, decoded by hand.

The message, as the remote-write 1.0 specification defines it (field numbers)::

    WriteRequest { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2;
                   repeated Exemplar exemplars = 3; repeated Histogram histograms = 4; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }      // milliseconds since the epoch

Why by hand, not with generated protobuf classes: a dcgm-exporter series is
one sample behind some 400 bytes of labels, and a GPU row is forty series.
Generated classes build a Python object per label (30 µs per GPU row on the
machine that measured it), where this decoder looks a series' label bytes up
in a cache of series already seen (:class:`SeriesCache`): the labels of a
series are the same bytes scrape after scrape, so the common series costs a
slice, a dictionary lookup and its value and timestamp, read for all series
of the body at once with numpy.

Every series is first checked the quick way: its last field is its one
sample, in one of the two shapes Prometheus writes (value and timestamp, or
timestamp alone for a value of 0), and the bytes before it are labels seen
before.  That reading is exact, not a guess: a cached key was parsed field by
field as nothing but labels, so labels + one sample field ending the series
is the series.  Anything else (a new series, several samples, exemplars,
histograms, another field order) is parsed field by field, and the labels it
has are cached for the next time.
"""

from __future__ import annotations

import bisect
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import cramjam
import numpy as np

#: Snappy's block format begins with the uncompressed length as a varint.
_MAX_VARINT = 10
#: Prometheus's staleness marker: a NaN with this bit pattern ends a series; it is no value.
STALE_NAN_BITS = 0x7FF0000000000002
#: Label names as Prometheus allows them.
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_DOUBLE = struct.Struct("<d")
_U64 = struct.Struct("<Q")

P = TypeVar("P")


class RemoteWriteError(ValueError):
    """The body is not a remote-write request this collector can read (400, with this reason)."""


def decompress(body: bytes, max_bytes: int) -> bytes:
    """Snappy block-format ``body``, refused before decompressing when it says it is over ``max_bytes``."""
    try:
        n = cramjam.snappy.decompress_raw_len(body)
    except cramjam.DecompressionError as e:
        raise RemoteWriteError(f"body is not snappy-compressed ({e})") from None
    if n > max_bytes:
        raise RemoteWriteError(f"body decompresses to {n} bytes, over the {max_bytes}-byte limit")
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as e:
        raise RemoteWriteError(f"snappy body is corrupt ({e})") from None


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(value, next offset) of the varint at ``i``; truncated or overlong ones are refused."""
    value = 0
    shift = 0
    while True:
        if i >= end:
            raise RemoteWriteError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift >= 7 * _MAX_VARINT:
            raise RemoteWriteError("varint longer than 10 bytes")


def _skip(buf: bytes, i: int, end: int, wire: int) -> int:
    """The offset after a field of wire type ``wire`` whose tag ended at ``i``."""
    if wire == 0:
        return _varint(buf, i, end)[1]
    if wire == 1:
        j = i + 8
    elif wire == 5:
        j = i + 4
    elif wire == 2:
        n, i = _varint(buf, i, end)
        j = i + n
    else:
        raise RemoteWriteError(f"unsupported protobuf wire type {wire}")
    if j > end:
        raise RemoteWriteError("field runs past the end of its message")
    return j


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteWriteError(f"{what} is not valid UTF-8") from None


def _label(buf: bytes, i: int, end: int) -> tuple[str, str]:
    name = value = b""
    while i < end:
        tag, i = _varint(buf, i, end)
        fno, wire = tag >> 3, tag & 7
        if fno in (1, 2) and wire == 2:
            n, i = _varint(buf, i, end)
            if i + n > end:
                raise RemoteWriteError("label runs past the end of its series")
            if fno == 1:
                name = buf[i : i + n]
            else:
                value = buf[i : i + n]
            i += n
        else:
            i = _skip(buf, i, end, wire)
    return _text(name, "a label name"), _text(value, "a label value")


def _sample(buf: bytes, i: int, end: int) -> tuple[float, int]:
    value = 0.0
    ts = 0
    while i < end:
        tag, i = _varint(buf, i, end)
        if tag == 0x09:
            if i + 8 > end:
                raise RemoteWriteError("truncated sample value")
            value = _DOUBLE.unpack_from(buf, i)[0]
            i += 8
        elif tag == 0x10:
            ts, i = _varint(buf, i, end)
            if ts >= 1 << 63:
                ts -= 1 << 64
        else:
            i = _skip(buf, i, end, tag & 7)
    return value, ts


@dataclass
class Series:
    """A series parsed field by field: its labels (name -> value), the raw bytes of its label
    fields (the cache key), its samples, and how many histogram samples it carried."""

    labels: dict[str, str]
    key: bytes
    samples: list[tuple[float, int]]
    histograms: int = 0


def parse_series(buf: bytes, i: int, end: int) -> Series:
    """The series whose payload is ``buf[i:end]``, with every label checked."""
    labels: dict[str, str] = {}
    key_parts: list[bytes] = []
    samples: list[tuple[float, int]] = []
    histograms = 0
    while i < end:
        start = i
        tag, i = _varint(buf, i, end)
        fno, wire = tag >> 3, tag & 7
        if wire != 2 or fno not in (1, 2, 3, 4):
            i = _skip(buf, i, end, wire)
            continue
        n, i = _varint(buf, i, end)
        if i + n > end:
            raise RemoteWriteError("field runs past the end of its series")
        if fno == 1:
            name, value = _label(buf, i, i + n)
            if not LABEL_NAME_RE.fullmatch(name):
                raise RemoteWriteError(f"label name {name!r} is not a Prometheus label name")
            if name in labels:
                raise RemoteWriteError(f"label {name!r} appears twice in one series")
            if value:  # an empty value is no label (Prometheus drops them)
                labels[name] = value
            key_parts.append(buf[start : i + n])
        elif fno == 2:
            samples.append(_sample(buf, i, i + n))
        elif fno == 4:
            histograms += 1
        i += n
    if "__name__" not in labels:
        raise RemoteWriteError(f"a series without a metric name (__name__), labels {labels}")
    return Series(labels, b"".join(key_parts), samples, histograms)


@dataclass
class Segment(Generic[P]):
    """A run of series one target's scrape wrote, as it last arrived: its bytes with the samples'
    values and timestamps zeroed, where those are, and each series' plan, end and sample shape."""

    data: bytes
    array: np.ndarray
    #: Offsets (from the segment's start) of every value and timestamp byte, sorted.
    variable: np.ndarray
    plans: list[Any]
    #: Each series' end, from the segment's start (increasing).
    ends: np.ndarray
    ends_list: list[int]
    full: list[bool]

    def match(self, raw: np.ndarray, buf: bytes, p: int) -> int:
        """How many of the segment's series ``buf`` repeats from ``p``, byte for byte but for the samples'
        values and timestamps: all, or those up to the end of ``buf`` (a request cut mid-scrape), else 0."""
        room = len(buf) - p
        length = len(self.data)
        k = len(self.ends_list)
        var = self.variable
        tmpl = self.array
        if room < length:
            k = bisect.bisect_right(self.ends_list, room)
            if k == 0 or self.ends_list[k - 1] != room:
                return 0
            length = room
            var = var[: int(np.searchsorted(var, length))]
            tmpl = tmpl[:length]
        # Every byte that differs from the kept segment must be a value or a timestamp byte.
        differ = raw[p : p + length] != tmpl
        return k if int(np.count_nonzero(differ)) == int(np.count_nonzero(differ[var])) else 0


@dataclass
class SeriesCache(Generic[P]):
    r"""Series label bytes -> what the caller made of those labels (its "plan"), bounded.

    ``plan_of`` is called once per new label set with the parsed :class:`Series`.  With ``target_of``
    (a plan's scrape target), the runs of series one target wrote are kept as :class:`Segment`\ s,
    keyed by their first series' labels: Prometheus sends a target's series in the same order
    scrape after scrape, so a request is mostly such runs, each read with one comparison.
    """

    plan_of: Callable[[Series], P]
    max_entries: int = 1_000_000
    target_of: Callable[[P], Any] | None = None
    #: Segments shorter than this many series are not kept (the comparison would cost more).
    min_segment: int = 8
    max_segments: int = 100_000
    #: Series read from kept segments, and read one by one (quick or field by field), so far.
    from_segments: int = 0
    one_by_one: int = 0
    _plans: dict[bytes, P] = field(default_factory=dict)
    _segments: dict[bytes, list[Segment[P]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._plans)

    def learn_segments(
        self, buf: bytes, raw: np.ndarray, learn: list[tuple[int, int, bytes, bool, Any]]
    ) -> None:
        """Keep the runs of one target's series among those read one by one: ``learn`` is (start, end,
        key, has a value, plan) per series, start -1 where a run cannot go on."""
        target_of = self.target_of
        if target_of is None:
            return
        j, n = 0, len(learn)
        while j < n:
            if learn[j][0] < 0:
                j += 1
                continue
            t = target_of(learn[j][4])
            k = j + 1
            while (
                k < n and learn[k][0] >= 0 and learn[k][0] == learn[k - 1][1] and target_of(learn[k][4]) == t
            ):
                k += 1
            # A run at the very start of the body may be the tail of a scrape another request began.
            if k - j >= self.min_segment and learn[j][0] > 0:
                run = learn[j:k]
                self._keep(
                    raw,
                    [r[0] for r in run],
                    [r[1] for r in run],
                    run[0][2],
                    [r[3] for r in run],
                    [r[4] for r in run],
                )
            j = k

    def _keep(
        self,
        raw: np.ndarray,
        starts: list[int],
        ends: list[int],
        key: bytes,
        full: list[bool],
        plans: list[P],
    ) -> None:
        p0 = starts[0]
        e = np.asarray(ends, dtype=np.int64) - p0
        has = np.asarray(full, dtype=bool)
        ts = (e[:, None] - 6 + np.arange(6)).ravel()
        val = (e[has][:, None] - 15 + np.arange(8)).ravel()
        variable = np.sort(np.concatenate([ts, val]))
        seg = raw[p0 : ends[-1]].copy()
        seg[variable] = 0
        new: Segment[P] = Segment(seg.tobytes(), seg, variable, list(plans), e, e.tolist(), list(full))
        variants = self._segments.get(key)
        if variants is None:
            if len(self._segments) >= self.max_segments:
                self._segments.clear()
            self._segments[key] = [new]
        elif all(v.data != new.data for v in variants):
            variants.insert(0, new)
            del variants[4:]

    def get(self, key: bytes) -> P | None:
        return self._plans.get(key)

    def learn(self, series: Series) -> P:
        plan = self._plans.get(series.key)
        if plan is None:
            plan = self.plan_of(series)
            if len(self._plans) >= self.max_entries:
                self._plans.clear()
            self._plans[series.key] = plan
        return plan


@dataclass
class Decoded(Generic[P]):
    """A request's samples in arrival order: each one's series plan, value and timestamp (ms)."""

    plans: list[P]
    values: np.ndarray
    times_ms: np.ndarray
    #: Native histogram samples (not used by gpufleet), and metadata entries, counted.
    histograms: int = 0
    series: int = 0


def decode(buf: bytes, cache: SeriesCache[P], quick: bool = True) -> Decoded[P]:
    """Every sample of the ``WriteRequest`` in ``buf``; :class:`RemoteWriteError` for a malformed one.

    ``quick=False`` parses every series field by field (what a body whose last
    bytes only look like a sample gets, the second time)."""
    n = len(buf)
    get = cache._plans.get
    segments = cache._segments.get if cache.target_of is not None else None
    raw = np.frombuffer(buf, dtype=np.uint8)
    i = 0
    # Quick series: their plan and the offset just past them (the sample's end), and its shape.
    plans: list[Any] = []
    ends: list[int] = []
    full: list[bool] = []
    # Quick series read one by one (not from a kept segment), for segments to be made of: where each
    # starts (-1: a break, a run cannot span it), its key.
    learn: list[tuple[int, int, bytes, bool, Any]] = []
    # Series parsed field by field: samples kept in order as (position in the quick list, ...).
    slow: list[tuple[int, Any, float, int]] = []
    histograms = 0
    series = 0
    while i < n:
        tag = buf[i]
        if tag == 0x0A:
            b1 = buf[i + 1] if i + 1 < n else 0x80
            if b1 < 0x80:
                s = i + 2
                e = s + b1
            elif i + 2 < n and buf[i + 2] < 0x80:
                s = i + 3
                e = s + ((b1 & 0x7F) | (buf[i + 2] << 7))
            else:
                ln, s = _varint(buf, i + 1, n)
                e = s + ln
            if e > n:
                raise RemoteWriteError("a series runs past the end of the request")
            # The quick reading: the last field is one sample of 16 bytes (value, 6-byte timestamp)
            # or 7 (timestamp alone), and what precedes it is a label set seen before.
            key = None
            has_value = False
            if (
                quick
                and e - s > 18
                and buf[e - 18] == 0x12
                and buf[e - 17] == 0x10
                and buf[e - 16] == 0x09
                and buf[e - 7] == 0x10
                and buf[e - 1] < 0x80
            ):
                key = buf[s : e - 18]
                has_value = True
            elif (
                quick
                and e - s > 9
                and buf[e - 9] == 0x12
                and buf[e - 8] == 0x07
                and buf[e - 7] == 0x10
                and buf[e - 1] < 0x80
            ):
                key = buf[s : e - 9]
            plan = get(key) if key is not None else None
            if plan is not None:
                if segments is not None:
                    matched = 0
                    for seg in segments(key) or ():  # type: ignore[arg-type]
                        matched = seg.match(raw, buf, i)
                        if matched:
                            plans.extend(seg.plans[:matched])
                            ends.extend([i + x for x in seg.ends_list[:matched]])
                            full.extend(seg.full[:matched])
                            series += matched
                            i += seg.ends_list[matched - 1]
                            learn.append((-1, 0, b"", False, None))
                            break
                    if matched:
                        continue
                    learn.append((i, e, key, has_value, plan))  # type: ignore[arg-type]
                plans.append(plan)
                ends.append(e)
                full.append(has_value)
                series += 1
                i = e
                continue
            series += 1
            parsed = parse_series(buf, s, e)
            plan = cache.learn(parsed)
            histograms += parsed.histograms
            for value, ts in parsed.samples:
                slow.append((len(plans), plan, value, ts))
            learn.append((-1, 0, b"", False, None))
            i = e
        else:
            tag_value, j = _varint(buf, i, n)
            if tag_value >> 3 == 1:
                raise RemoteWriteError("a time series field that is not length-delimited")
            i = _skip(buf, j, n, tag_value & 7)
    tails = _tails(buf, ends, full)
    if tails is None:
        return decode(buf, cache, quick=False)
    values, times = tails
    if segments is not None:
        one = sum(1 for st, *_ in learn if st >= 0)
        cache.one_by_one += one + len(slow)
        cache.from_segments += len(plans) - one
        if one:
            cache.learn_segments(buf, raw, learn)
    if slow:
        return _interleave(plans, values, times, slow, histograms, series)
    return Decoded(plans, values, times, histograms, series)


def _tails(buf: bytes, ends: list[int], full: list[bool]) -> tuple[np.ndarray, np.ndarray] | None:
    """Values and timestamps of the quick series, read from their last bytes all at once; None when
    one of them is not a 6-byte varint after all (the body is then read field by field)."""
    if not ends:
        return np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
    raw = np.frombuffer(buf, dtype=np.uint8)
    e = np.asarray(ends, dtype=np.int64)
    tsb = raw[(e - 6)[:, None] + np.arange(6)].astype(np.int64)
    if not bool((tsb[:, :5] >= 0x80).all()):
        return None
    times = ((tsb & 0x7F) << (7 * np.arange(6, dtype=np.int64))).sum(axis=1)
    values = np.zeros(len(e), dtype=np.float64)
    has = np.asarray(full, dtype=bool)
    if has.any():
        vb = raw[(e[has] - 15)[:, None] + np.arange(8)]
        values[has] = np.ascontiguousarray(vb).view("<f8").ravel()
    return values, times


def _interleave(
    plans: list[Any],
    values: np.ndarray,
    times: np.ndarray,
    slow: list[tuple[int, Any, float, int]],
    histograms: int,
    series: int,
) -> Decoded[Any]:
    """The quick and the field-by-field samples merged back into body order."""
    out_plans: list[Any] = []
    out_v: list[float] = []
    out_t: list[int] = []
    q = 0
    vals = values.tolist()
    tss = times.tolist()
    for pos, plan, value, ts in slow:
        while q < pos:
            out_plans.append(plans[q])
            out_v.append(vals[q])
            out_t.append(tss[q])
            q += 1
        out_plans.append(plan)
        out_v.append(value)
        out_t.append(ts)
    out_plans.extend(plans[q:])
    out_v.extend(vals[q:])
    out_t.extend(tss[q:])
    return Decoded(
        out_plans, np.asarray(out_v, dtype=np.float64), np.asarray(out_t, dtype=np.int64), histograms, series
    )


def is_stale(values: np.ndarray) -> np.ndarray:
    """Which values are Prometheus staleness markers (a series ended; no value)."""
    return values.view(np.uint64) == STALE_NAN_BITS


def describe(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(value)
