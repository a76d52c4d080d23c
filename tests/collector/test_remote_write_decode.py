"""The remote-write decoder reads what protobuf reads, quickly or field by field, and refuses the rest.

The reference is protobuf itself: the remote-write 1.0 messages compiled by
grpcio-tools into a temporary module, parsing the same bytes.
"""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.collector.remote_write_proto import (
    RemoteWriteError,
    Series,
    SeriesCache,
    decode,
    decompress,
    is_stale,
)
from testsupport import remote_write as rw

PROTO = """
syntax = "proto3";
package prometheus;
message WriteRequest { repeated TimeSeries timeseries = 1; reserved 2; repeated MetricMetadata metadata = 3; }
message MetricMetadata { int32 type = 1; string metric_family_name = 2; string help = 4; string unit = 5; }
message Sample { double value = 1; int64 timestamp = 2; }
message Exemplar { repeated Label labels = 1; double value = 2; int64 timestamp = 3; }
message BucketSpan { sint32 offset = 1; uint32 length = 2; }
message Histogram { uint64 count_int = 1; double sum = 3; int64 timestamp = 15; }
message TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; repeated Exemplar exemplars = 3;
                     repeated Histogram histograms = 4; }
message Label { string name = 1; string value = 2; }
"""


@pytest.fixture(scope="module")
def pb(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    from grpc_tools import protoc  # a dev dependency: every environment that runs the tests has it

    d = tmp_path_factory.mktemp("rwproto")
    (d / "rw_types.proto").write_text(PROTO)
    assert protoc.main(["protoc", f"-I{d}", f"--python_out={d}", str(d / "rw_types.proto")]) == 0
    spec = importlib.util.spec_from_file_location("rw_types_pb2", d / "rw_types_pb2.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rw_types_pb2"] = mod
    spec.loader.exec_module(mod)
    return mod


def plain_cache() -> SeriesCache[tuple[tuple[str, str], ...]]:
    """A cache whose plan is the label set itself, so a decoded request can be compared with protobuf's."""
    return SeriesCache(lambda s: tuple(sorted(s.labels.items())))


def flatten(decoded: Any) -> list[tuple[Any, float | str, int]]:
    return [
        (p, "NaN" if math.isnan(v) else v, t)
        for p, v, t in zip(decoded.plans, decoded.values.tolist(), decoded.times_ms.tolist(), strict=True)
    ]


def reference(pb: ModuleType, raw: bytes) -> list[tuple[Any, float | str, int]]:
    req = pb.WriteRequest.FromString(raw)
    out = []
    for ts in req.timeseries:
        labels = tuple(sorted((lab.name, lab.value) for lab in ts.labels if lab.value))
        for s in ts.samples:
            out.append((labels, "NaN" if math.isnan(s.value) else s.value, s.timestamp))
    return out


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True)
values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
label_sets = st.dictionaries(names, values, min_size=0, max_size=12).map(lambda d: {**d, "__name__": "m"})
samples = st.lists(
    st.tuples(
        st.one_of(st.floats(allow_nan=True), st.just(0.0), st.integers(0, 10**12).map(float)),
        st.one_of(st.integers(1_500_000_000_000, 2_500_000_000_000), st.integers(-(2**62), 2**62)),
    ),
    min_size=0,
    max_size=3,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(label_sets, samples), max_size=8), st.randoms(use_true_random=False))
def test_decoding_agrees_with_protobuf_cold_and_warm(pb: ModuleType, batch: list[Any], rnd: Any) -> None:
    raw = rw.write_request(batch)
    cache = plain_cache()
    cold = flatten(decode(raw, cache))
    assert cold == reference(pb, raw)
    # Warm: the same series, other values and times, now read the quick way.
    again = [
        (
            labels,
            [
                (rnd.choice([0.0, rnd.random() * 1e6]), rnd.randint(1_500_000_000_000, 2_500_000_000_000))
                for _ in s
            ],
        )
        for labels, s in batch
    ]
    raw2 = rw.write_request(again)
    assert flatten(decode(raw2, cache)) == reference(pb, raw2)


def test_a_body_protobuf_writes_in_another_field_order_reads_the_same(pb: ModuleType) -> None:
    """Samples before labels, exemplars, metadata: protobuf's own encoder, read field by field."""
    req = pb.WriteRequest()
    for i in range(3):
        ts = req.timeseries.add()
        ts.labels.add(name="__name__", value="DCGM_FI_DEV_GPU_UTIL")
        ts.labels.add(name="gpu", value=str(i))
        ts.samples.add(value=10.0 * i, timestamp=1_800_000_000_000 + i)
        ts.samples.add(value=11.0 * i, timestamp=1_800_000_001_000 + i)
        ex = ts.exemplars.add(value=1.5, timestamp=5)
        ex.labels.add(name="trace_id", value="abc")
    req.metadata.add(type=1, metric_family_name="DCGM_FI_DEV_GPU_UTIL", help="x")
    raw = req.SerializeToString()
    cache = plain_cache()
    assert flatten(decode(raw, cache)) == reference(pb, raw)
    assert flatten(decode(raw, cache)) == reference(pb, raw)
    # Reordered by hand: each series' samples first, then its labels.
    reordered = pb.WriteRequest()
    for ts in req.timeseries:
        body = b"".join(b"\x12" + rw.varint(s.ByteSize()) + s.SerializeToString() for s in ts.samples)
        body += b"".join(b"\x0a" + rw.varint(lab.ByteSize()) + lab.SerializeToString() for lab in ts.labels)
        reordered_raw = b"\x0a" + rw.varint(len(body)) + body
        reordered.MergeFromString(reordered_raw)
    raw2 = b"".join(
        b"\x0a" + rw.varint(len(b)) + b
        for b in (
            b"".join(b"\x12" + rw.varint(s.ByteSize()) + s.SerializeToString() for s in ts.samples)
            + b"".join(b"\x0a" + rw.varint(lab.ByteSize()) + lab.SerializeToString() for lab in ts.labels)
            for ts in req.timeseries
        )
    )
    assert flatten(decode(raw2, plain_cache())) == reference(pb, raw2)
    assert flatten(decode(raw2, cache)) == reference(pb, raw2)


def test_a_label_value_that_looks_like_a_sample_is_read_as_a_label(pb: ModuleType) -> None:
    # A label whose value has the bytes of a 16-byte sample at its end: a cached label set is no shortcut
    # to a wrong reading, because the quick path only accepts label bytes it parsed before.
    fake_tail = b"\x09" + struct.pack("<d", 99.0) + b"\x10" + rw.varint(1_800_000_000_000)
    labels = {"__name__": "m", "z": fake_tail.decode("latin-1")}
    raw = rw.write_request(
        [(labels, [(1.0, 1_800_000_000_123)]), ({"__name__": "m"}, [(2.0, 1_800_000_000_123)])]
    )
    cache = plain_cache()
    for _ in range(2):
        assert flatten(decode(raw, cache)) == reference(pb, raw)


def test_staleness_markers_are_recognised() -> None:
    stale = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
    raw = rw.write_request(
        [({"__name__": "m"}, [(stale, 1_800_000_000_000), (float("nan"), 1_800_000_000_001)])]
    )
    d = decode(raw, plain_cache())
    assert is_stale(d.values).tolist() == [True, False]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x0a\x05\x0a\x03\x0a\x01", "past the end"),
        (b"\x0a\x80", "truncated"),
        (b"\x0a" + b"\xff" * 11, "varint"),
        (b"\x0b\x00", "not length-delimited"),
        (b"\x1b\x00", "wire type 3"),
        (rw.write_request([({"__name__": "m", "a": "x"}, [])]).replace(b"x", b"\xff"), "UTF-8"),
        (rw.write_request([({"gpu": "0"}, [(1.0, 1)])]), "__name__"),
        (
            rw._field(1, rw._field(1, rw.label("a", "x")) * 2 + rw._field(1, rw.label("__name__", "m"))),
            "twice",
        ),
        (rw.write_request([({"__name__": "m", "9bad": "x"}, [(1.0, 1)])]), "label name"),
    ],
)
def test_malformed_bodies_are_refused_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(RemoteWriteError, match=message):
        decode(raw, plain_cache())


def test_snappy_length_is_bounded_before_decompressing() -> None:
    raw = rw.write_request([({"__name__": "m", "x": "y" * 1000}, [(1.0, 1)])])
    body = rw.compress(raw)
    assert decompress(body, len(raw)) == raw
    with pytest.raises(RemoteWriteError, match="over the"):
        decompress(body, len(raw) - 1)
    with pytest.raises(RemoteWriteError, match="snappy"):
        decompress(b"\xff\xff\xff\xff\xff\xff", 10**6)
    with pytest.raises(RemoteWriteError, match="snappy"):
        decompress(body[:-5], len(raw))


def test_the_cache_is_bounded() -> None:
    seen: list[Series] = []
    cache: SeriesCache[int] = SeriesCache(lambda s: seen.append(s) or len(seen), max_entries=3)
    for i in range(5):
        decode(rw.write_request([({"__name__": f"m{i}"}, [(1.0, 1_800_000_000_000)])]), cache)
    assert len(cache) <= 3 and len(seen) == 5


def targets_cache() -> SeriesCache[tuple[tuple[str, str], ...]]:
    """Plans are the label sets; a series' target is its (job, instance)."""
    return SeriesCache(
        lambda s: tuple(sorted(s.labels.items())),
        target_of=lambda plan: (dict(plan).get("job"), dict(plan).get("instance")),
    )


def scrape_stream(rnd: Any, targets: int, per_target: int, scrapes: int) -> list[list[rw.Series]]:
    """What Prometheus's queue holds: each scrape every target's series in its exposition order, one
    sample per series, values changing; counters and idle rates stay at 0, and now and then one
    series goes to 0 or leaves it (an idle GPU starting, a throttle reason ending)."""
    out = []
    zero = {(t, j) for t in range(targets) for j in range(per_target) if j % 5 == 0}
    for k in range(scrapes):
        if rnd.random() < 0.5:
            zero ^= {(rnd.randrange(targets), rnd.randrange(per_target))}
        stream: list[rw.Series] = []
        for t in range(targets):
            for j in range(per_target):
                labels = {
                    "__name__": f"DCGM_FI_X{j % 7}",
                    "gpu": str(j // 7),
                    "job": "dcgm",
                    "instance": f"node-{t}:9400",
                    "UUID": f"GPU-{t:04d}-{j // 7}",
                    "x" * (j % 3 + 1): "y",
                }
                value = (
                    0.0 if (t, j) in zero else rnd.choice([rnd.random() * 700, float(rnd.randint(1, 10**9))])
                )
                stream.append((labels, [(value, 1_800_000_000_000 + 15_000 * k + t)]))
        out.append(stream)
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(50, 400))
def test_segments_read_what_protobuf_reads_in_requests_cut_anywhere(
    pb: ModuleType, rnd: Any, per_send: int
) -> None:
    cache = targets_cache()
    for stream in scrape_stream(rnd, targets=4, per_target=35, scrapes=6):
        for a in range(0, len(stream), per_send):
            raw = rw.write_request(stream[a : a + per_send])
            assert flatten(decode(raw, cache)) == reference(pb, raw)


def test_most_series_come_from_segments_once_their_targets_were_seen(pb: ModuleType) -> None:
    rnd = __import__("random").Random(11)
    cache = targets_cache()
    stream = [s for scrape in scrape_stream(rnd, targets=12, per_target=40, scrapes=30) for s in scrape]
    for n, a in enumerate(range(0, len(stream), 2000)):  # Prometheus's max_samples_per_send
        if n == 2:  # the first two requests taught the cache every target's run
            cache.from_segments = cache.one_by_one = 0
        raw = rw.write_request(stream[a : a + 2000])
        assert flatten(decode(raw, cache)) == reference(pb, raw)
    # What is left one by one: each request's first run (begun by the request before) and runs in which
    # a value went to or left 0 (learnt again).
    assert cache.from_segments > 5 * cache.one_by_one, (cache.from_segments, cache.one_by_one)


def test_a_segment_that_differs_in_one_label_byte_is_read_one_by_one(pb: ModuleType) -> None:
    rnd = __import__("random").Random(3)
    cache = targets_cache()
    streams = scrape_stream(rnd, targets=3, per_target=20, scrapes=3)
    for stream in streams[:2]:
        decode(rw.write_request(stream), cache)
    changed = [(dict(labels), s) for labels, s in streams[2]]
    changed[30][0]["UUID"] = "GPU-0001-X"  # same length, other bytes, inside a kept segment
    raw = rw.write_request(changed)
    before = cache.from_segments
    assert flatten(decode(raw, cache)) == reference(pb, raw)
    assert cache.from_segments > before  # the other targets' runs still came from segments
