"""The agents' typed sections are checked a section at a time (one frombuffer
and one range check per dtype); whatever that path accepts must be exactly
what the column-by-column path accepts, and whatever it refuses must be
refused with the column-by-column path's own message and location."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

import gpufleet.wire as wire
import gpufleet.wire.validation as wire_validate
from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME
from gpufleet.wire import WireError, as_lists, encode, parse, validate
from testsupport import loadgen


def _doc(seed: int) -> dict[str, Any]:
    doc = loadgen.batch_doc("node-a", seed, seed, 1.7e9 + seed, seconds=3)
    body, _ = encode(doc, "msgpack", None)
    return parse(body, wire.MSGPACK)


def _slow(doc: dict[str, Any]) -> Any:
    saved = wire_validate._typed_section_fast
    wire_validate._typed_section_fast = lambda *a: None  # type: ignore[assignment]
    try:
        return _outcome(doc)
    finally:
        wire_validate._typed_section_fast = saved


def _outcome(doc: dict[str, Any]) -> Any:
    try:
        b = validate(copy.deepcopy(doc))
    except WireError as e:
        return ("error", e.kind, e.detail())
    out: dict[str, Any] = {"n": (b.n_gpu, b.n_host)}
    for section in ("gpu", "host"):
        cols = getattr(b, section)
        out[section] = {
            k: (c.tolist(), None if isinstance(c.values, list) else c.values.dtype.str)
            for k, c in sorted(cols.items())
        }
    return out


def _typed(values: list[Any], dtype: str, nulls: list[bool] | None = None) -> dict[str, Any]:
    col: dict[str, Any] = {"dtype": dtype, "data": np.array(values, dtype=wire.TYPED_DTYPES[dtype]).tobytes()}
    if nulls is not None:
        col["nulls"] = np.packbits(np.array(nulls, dtype=bool)).tobytes()
    return col


def test_agent_batches_take_the_fast_path_and_match_the_slow_one() -> None:
    doc = _doc(3)
    assert wire_validate._typed_section_fast("gpu", doc["gpu"], GPU_BY_NAME, ("time", "gpu")) is not None
    assert wire_validate._typed_section_fast("host", doc["host"], HOST_BY_NAME, ("time",)) is not None
    fast = _outcome(doc)
    assert fast == _slow(doc)
    assert fast["gpu"]["power_w"][1] == "<f8" and fast["gpu"]["energy_mj"][1] == "<i8"
    assert fast["n"] == (24, 3)


def _mutations(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    g = d["gpu"]
    name = rng.choice([k for k in g if k != "uuid"])
    n = len(as_lists({"gpu": {"time": g["time"]}})["gpu"]["time"])
    kind = rng.randrange(13)
    if kind == 0:  # out of range
        g["sm_active"] = _typed([0.5] * (n - 1) + [rng.choice([1.5, -0.5])], "f4")
    elif kind == 1:  # NaN / inf
        g["power_w"] = _typed([100.0] * (n - 1) + [rng.choice([float("nan"), float("inf")])], "f4")
    elif kind == 2:  # a short column
        g[name] = _typed([1] * (n - 1), "i4" if name not in ("time",) else "f8")
    elif kind == 3:  # an integer field sent as floats, integral or not
        g["temp_c"] = _typed([60.0] * (n - 1) + [rng.choice([61.0, 61.5])], "f8")
    elif kind == 4:  # NULLs in a key column, or in a value column
        col = rng.choice(["gpu", "power_w", "temp_c"])
        dt = {"gpu": "i2", "power_w": "f4", "temp_c": "i4"}[col]
        g[col] = _typed([1] * n, dt, [i == 1 for i in range(n)])
    elif kind == 5:  # an unknown dtype, or data that is not bytes
        g[name] = rng.choice(
            [
                {"dtype": "f16", "data": b"\0" * 16 * n},
                {"dtype": "f4", "data": "text"},
                {"dtype": ["f4"], "data": b"\0" * 4 * n},
                {"dtype": 4, "data": b"\0" * 4 * n},
            ]
        )
    elif kind == 6:  # an unknown key in the typed map
        g[name] = dict(g[name], extra=1) if isinstance(g[name], dict) else g[name]
    elif kind == 7:  # an old name beside its new one, or alone
        g["ecc_dbe"] = g["ecc_dbe_vol"]
        if rng.random() < 0.5:
            del g["ecc_dbe_vol"]
    elif kind == 8:  # text as a typed array, text too long, a number where text is due
        g["uuid"] = rng.choice([_typed([1] * n, "i4"), ["x" * 300] * n, [1] * n])
    elif kind == 9:  # unknown field, missing key
        if rng.random() < 0.5:
            g["no_such_field"] = _typed([1] * n, "i4")
        else:
            del g["gpu"]
    elif kind == 10:  # a plain list for a numeric column, with or without a NULL
        g[name] = [1] * (n - 1) + [rng.choice([None, 2])]
    elif kind == 11:  # a negative GPU index, a smallint overflow
        g["gpu"] = _typed([0] * (n - 1) + [rng.choice([-1, 40000])], "i4")
    else:  # values at and past the edges of a column's type, sent in a wider dtype than usual
        col, dt, last = rng.choice(
            [
                ("energy_mj", "i8", 2**63 - 1),
                ("power_w", "f8", 3.4028234663852886e38),
                ("power_w", "f8", 1e300),
                ("power_w", "f8", float("-inf")),
                ("temp_c", "u4", 2**32 - 1),
                ("temp_c", "i8", -(2**63)),
            ]
        )
        g[col] = _typed([1] * (n - 1) + [last], dt)
    return d


@pytest.mark.parametrize("seed", range(300))
def test_malformed_sections_are_refused_as_the_slow_path_refuses_them(seed: int) -> None:
    rng = random.Random(seed)
    d = _mutations(_doc(seed % 7), rng)
    assert _outcome(d) == _slow(d)
