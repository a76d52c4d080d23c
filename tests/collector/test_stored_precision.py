"""Sampled ratios and rates are stored with the mantissa bits the catalog gives them.

Compressed storage spends its bytes on the low mantissa bits that change from
sample to sample (docs/capacity.md, "Storage"); the catalog's ``bits`` rounds
them off before the COPY.  Rounded means rounded to nearest, within the
stated relative error, the same for every path that stores samples, and
nothing else touched: counters, integers and fields without ``bits`` are
stored exactly as sent.
"""

from __future__ import annotations

import numpy as np
import psycopg

from gpufleet.catalog import GPU_FIELDS, HOST_FIELDS
from gpufleet.collector.batch_store import GPU_SPECS, write_batches
from gpufleet.collector.copy_binary import round_mantissa
from gpufleet.wire import validate
from tests.collector.test_ingest import batch


def test_rounding_is_to_nearest_within_the_stated_error() -> None:
    rng = np.random.default_rng(7)
    # normal float32 values over many magnitudes, both signs
    x = (rng.uniform(1, 2, 200_000) * 2.0 ** rng.integers(-60, 60, 200_000)).astype(np.float32)
    x *= rng.choice(np.array([-1, 1], dtype=np.float32), x.size)
    for bits in (4, 10, 14, 22):
        r = round_mantissa(x, bits)
        rel = np.abs(r.astype(np.float64) - x) / np.abs(x.astype(np.float64))
        assert rel.max() <= 2.0 ** -(bits + 1), bits
        assert np.array_equal(np.sign(r), np.sign(x))
        assert np.array_equal(round_mantissa(r, bits), r), "rounding twice changes nothing"
        # nearest: no value of the coarser grid lies closer than the one chosen
        step = 2.0 ** (np.floor(np.log2(np.abs(r.astype(np.float64)))) - bits)
        assert (np.abs(r - x.astype(np.float64)) <= step / 2 + 1e-300).all()


def test_short_values_zero_and_the_range_edge_stay_as_they_are() -> None:
    short = np.array([0.0, -0.0, 1.0, 0.5, 0.75, 90.0, 300.0, 1536.0, 2.0**100], dtype=np.float32)
    assert np.array_equal(round_mantissa(short, 10), short)
    top = np.array([np.finfo(np.float32).max], dtype=np.float32)
    out = round_mantissa(top, 10)
    assert np.isfinite(out).all() and out[0] == top[0]


def test_only_sampled_reals_are_rounded_in_the_catalog() -> None:
    for f in GPU_FIELDS + HOST_FIELDS:
        if f.bits is not None:
            assert f.kind == "real", f.name
            assert 8 <= f.bits < 23, f.name
    rounded = {s.name for s in GPU_SPECS if s.bits is not None}
    assert {"sm_active", "power_w", "pcie_tx_bytes_s", "job_cpu_pressure_pct"} <= rounded
    # the energy counter, memory, clocks, limits and GPU-Util are stored exactly
    assert not rounded & {
        "energy_mj",
        "mem_used_mib",
        "mem_total_mib",
        "power_limit_w",
        "util_pct",
        "sm_clock_mhz",
    }


def test_stored_values_are_the_rounded_ones_and_the_rest_exact(db: str) -> None:
    doc = batch("p:1", n=8)
    power = [412.3456, 699.9999, 0.0, 55.55, 700.0, 1.0e-3, 123.456, 9999.0]
    sm = [0.8123456, 0.0001234, 1.0, 0.33333334, 0.5, 0.999999, 0.0, 0.1]
    mem = [81559.3, 1.1, 2.2, 3.3, 4.4, 5.5, 6.6, 7.7]
    doc["gpu"] |= {"power_w": power, "sm_active": sm, "mem_used_mib": mem}
    with psycopg.connect(db) as conn:
        with conn.transaction():
            write_batches(conn, [validate(doc)])
        rows = conn.execute(
            "SELECT gpu, power_w, sm_active, mem_used_mib, energy_mj FROM gpu_samples ORDER BY gpu"
        ).fetchall()
    bits = {f.name: f.bits for f in GPU_FIELDS}

    def col(j: int) -> np.ndarray:
        # float4 comes back as its shortest decimal; as float32 it is the stored value exactly
        return np.array([r[j] for r in rows], dtype=np.float32)

    assert np.array_equal(col(1), round_mantissa(np.array(power), bits["power_w"]))  # type: ignore[arg-type]
    assert np.array_equal(col(2), round_mantissa(np.array(sm), bits["sm_active"]))  # type: ignore[arg-type]
    assert not np.array_equal(col(2), np.array(sm, dtype=np.float32)), "sm_active was rounded"
    assert np.array_equal(col(3), np.array(mem, dtype=np.float32)), "mem_used_mib is stored as sent"
    assert [r[4] for r in rows] == doc["gpu"]["energy_mj"]
    stored_power = np.array([r[1] for r in rows])
    assert (np.abs(stored_power - np.array(power)) <= np.array(power) * 2.0**-15 + 1e-6).all()
