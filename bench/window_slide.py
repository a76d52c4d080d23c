"""A restored detector window sliding: the slowest sweep's merge beside the typical one.

    python bench/window_slide.py [--gpus 10000] [--sweeps 80] [--columns 16]

Builds a 10-minute, 1-Hz window of ``--gpus`` GPUs (``--columns`` stored
columns each) in memory, writes it as snapshot segments and restores it as a
new owner does (:func:`gpufleet.collector.window_snapshot._assemble`), then
merges 5 new seconds into every buffer and trims it, ``--sweeps`` times, as
steady sweeps do.  Each buffer takes its own part of the room it was restored
with, so buffers run out of room, and move their samples, over many sweeps.

Baseline, in the same run: the same window restored with every buffer given
all of its room, the same for all (``staggered=False``), so every buffer runs
out of room in the same sweep.  Printed for both: the median and the slowest sweep's
merge time and how much the process grew while sliding.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.collector import window_snapshot
from gpufleet.collector.window_cache import GPU_COLUMNS, WindowCache, _Buf

WINDOW_S = 600


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 1e6


def segments(gpus: int, columns: int) -> list[window_snapshot.Block]:
    """The window's GPU blocks, as a new owner reads them back from the snapshot."""
    cache = WindowCache(float(WINDOW_S))
    t = np.arange(0.0, float(WINDOW_S))
    rng = np.random.default_rng(0)
    for i in range(gpus):
        c = np.full((len(GPU_COLUMNS), WINDOW_S), np.nan, dtype=np.float32)
        c[:columns] = rng.random((columns, WINDOW_S), dtype=np.float32)
        cache.gpus[(f"node-{i // 8:05d}", i % 8)] = _Buf(t, c)
    out = []
    for lo in range(0, WINDOW_S, window_snapshot.SEG_S):
        d = window_snapshot.decode_segment(window_snapshot.encode_segment(cache, float(lo), float(lo + 10)))
        assert d is not None
        out.append(d.gpus)
    return out


def slide(bufs: dict[Any, _Buf], sweeps: int) -> dict[str, float]:
    gc.collect()
    before = peak = rss_mb()
    now = float(WINDOW_S)
    cols = np.full((len(GPU_COLUMNS), 5), np.nan, dtype=np.float32)
    first = next(iter(bufs.values()))
    cols[first.rows] = 1.0
    present = ~np.isnan(cols).all(axis=1)
    times = []
    for _ in range(sweeps):
        new_t = np.arange(now, now + 5)
        t0 = time.perf_counter()
        for b in bufs.values():
            b.merge(new_t, cols, present)
            b.trim(now + 5 - WINDOW_S)
        times.append(time.perf_counter() - t0)
        peak = max(peak, rss_mb())
        now += 5
    return {"median_s": float(np.median(times)), "max_s": max(times), "grew_mb": peak - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument(
        "--sweeps", type=int, default=80, help="5-s sweeps (80: past the point restored buffers fill)"
    )
    ap.add_argument("--columns", type=int, default=16, help="stored columns per GPU")
    args = ap.parse_args()
    blocks = segments(args.gpus, args.columns)
    results = {}
    for name in ("baseline", "staggered"):
        bufs = window_snapshot._assemble(blocks, len(GPU_COLUMNS), staggered=name == "staggered")
        results[name] = slide(bufs, args.sweeps)
        r = results[name]
        print(
            f"{name:9s}: merge per sweep median {r['median_s']:.3f} s, slowest {r['max_s']:.3f} s; "
            f"process grew {r['grew_mb']:.0f} MB while sliding",
            flush=True,
        )
        del bufs
        gc.collect()
    s, b = results["staggered"], results["baseline"]
    print(
        json.dumps(
            {
                "name": "window_slide",
                "value": round(s["max_s"], 3),
                "unit": "s_slowest_sweep_merge",
                "gpus": args.gpus,
                "sweeps": args.sweeps,
                "median_s": round(s["median_s"], 3),
                "grew_mb": round(s["grew_mb"], 1),
                "baseline_max_s": round(b["max_s"], 3),
                "baseline_median_s": round(b["median_s"], 3),
                "baseline_grew_mb": round(b["grew_mb"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
