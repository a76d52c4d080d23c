"""The time range drop_skewed notes on a batch is the range of the samples it kept."""

from __future__ import annotations

import random

import pytest

import gpufleet.wire as wire
from gpufleet.wire import drop_skewed, encode, parse, validate
from testsupport import loadgen

NOW = 1.8e9


def _read_range(batch: wire.Batch) -> tuple[float, float] | None:
    """The range read off the columns, as time_range reads it when nothing was noted."""
    batch.span = None
    return batch.time_range()


@pytest.mark.parametrize("seed", range(12))
def test_the_noted_span_is_what_the_kept_columns_hold(seed: int) -> None:
    rng = random.Random(seed)
    doc = loadgen.batch_doc("node-a", seed, seed, NOW - 30, seconds=5)
    for section in ("gpu", "host"):
        times = doc[section]["time"]
        for i in rng.sample(range(len(times)), rng.randint(0, len(times))):
            times[i] = rng.choice([NOW + 3600, NOW - 30 * 86400, NOW - 20, NOW + 1])
    body, _ = encode(doc, "msgpack", None)
    batch = drop_skewed(validate(parse(body, wire.MSGPACK)), NOW, 300.0, 14 * 86400.0)
    noted = batch.span
    assert noted == _read_range(batch)
    if batch.n_gpu or batch.n_host:
        assert noted is not None and NOW - 14 * 86400.0 <= noted[0] <= noted[1] <= NOW + 300.0


def test_a_batch_skewed_whole_notes_no_span() -> None:
    doc = loadgen.batch_doc("node-a", 1, 1, NOW + 7200, seconds=2)
    batch = drop_skewed(validate(doc), NOW, 300.0, 14 * 86400.0)
    assert batch.n_gpu == batch.n_host == 0
    assert batch.span is None and batch.time_range() is None
