"""The collector's own CPU per ingest request, outside HTTP and the database.

    python bench/request_cpu.py [--requests 640] [--repeat 5] [--group 64]

Takes the batches ``bench/vs_prometheus.py`` ships (8 GPUs a node, 25 values
a GPU and the UUID, the agents' 10-s batches: 80 GPU-samples a request,
msgpack, zstd) and times, in this process, each step the collector runs on
them: decoding (decompress and parse), validation, the bounds a batch is held to
(``collector.ingest_bounds``: GPU indices, runs named, counter glitches), and the COPY encoding a
group commit of ``--group`` requests does.  Validation is timed twice: as the
collector runs it (a section at a time) and, as the baseline in the same run,
column by column (the path that names a malformed sample; it was the only
one before the section-at-a-time path).  So is the encoding: as the writer
runs it, merging the requests' matrices, and with every section handed over
as a plain dict, which the writer merges column by column (as it did for
every section before it merged matrices).  Then the two steps of answering a
request, each beside what it replaced: waiting for the writer's confirmation
(``wait_at_most`` against ``asyncio.wait_for(asyncio.shield(...))``, on the
event loop uvicorn runs: uvloop where installed) and formatting the answer
(``stored_answer`` against starlette's ``JSONResponse``).  Each figure is the best of
``--repeat`` passes over all requests, per request and per GPU-sample.  The
last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import gpufleet.wire.validation as wire_validation
from bench import vs_prometheus
from gpufleet.collector import ingest_bounds
from gpufleet.collector.batch_store import GPU_SPECS, copy_data
from gpufleet.collector.ingest import stored_answer, wait_at_most
from gpufleet.wire import ParseLimits, decompress, parse, validate


def best_us(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def column_by_column(doc: dict[str, Any]) -> Any:
    saved = wire_validation._typed_section_fast
    wire_validation._typed_section_fast = lambda *a: None
    try:
        return validate(doc)
    finally:
        wire_validation._typed_section_fast = saved


def waits_us(n: int, repeat: int) -> dict[str, float]:
    """CPU of ``n`` waits for an already-scheduled confirmation, each way, per wait."""

    async def waits(shielded: bool) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            fut: asyncio.Future[int] = loop.create_future()
            loop.call_soon(fut.set_result, 1)
            if shielded:
                await asyncio.wait_for(asyncio.shield(fut), 30)
            else:
                await wait_at_most(fut, 30)

    try:
        import uvloop

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:
        new_loop = asyncio.new_event_loop
    loop = new_loop()
    try:
        return {
            name: best_us(lambda s=shielded: loop.run_until_complete(waits(s)), repeat) / n
            for name, shielded in (("wait", False), ("wait_for_shield", True))
        }
    finally:
        loop.close()


def answers_us(n: int, repeat: int) -> dict[str, float]:
    from starlette.responses import JSONResponse

    def ours() -> None:
        for i in range(n):
            stored_answer(f"node-{i}:1", "stored", 80, 10, 0)

    def theirs() -> None:
        for i in range(n):
            JSONResponse(
                {
                    "batch_id": f"node-{i}:1",
                    "status": "stored",
                    "gpu_rows": 80,
                    "host_rows": 10,
                    "rejected_skew": 0,
                }
            )

    return {"answer": best_us(ours, repeat) / n, "answer_json_response": best_us(theirs, repeat) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--group", type=int, default=64)
    args = ap.parse_args()
    per_tick = max(1, args.requests // vs_prometheus.SHIP_EVERY_S)
    due = vs_prometheus.gpufleet_bodies(
        vs_prometheus.value_model(),
        per_tick * vs_prometheus.SHIP_EVERY_S,
        ["token"] * per_tick * vs_prometheus.SHIP_EVERY_S,
        int(time.time()),
        vs_prometheus.SHIP_EVERY_S,
    )
    bodies = [body for items in due.values() for _, body, _ in items][: args.requests]
    limits = ParseLimits.for_samples(100_000)
    docs = [parse(decompress(b, "zstd", 1 << 26), "application/msgpack", limits) for b in bodies]
    batches = [validate(d) for d in docs]
    samples = sum(b.n_gpu for b in batches)
    n = len(bodies)

    def decode() -> None:
        for b in bodies:
            parse(decompress(b, "zstd", 1 << 26), "application/msgpack", limits)

    def sections() -> None:
        for d in docs:
            validate(d)

    def columns() -> None:
        for d in docs:
            column_by_column(d)

    def encode() -> None:
        for i in range(0, n, args.group):
            copy_data(GPU_SPECS, [(b.node, b.gpu, b.n_gpu) for b in batches[i : i + args.group]])

    plain = [dict(b.gpu) for b in batches]

    def encode_column_by_column() -> None:
        for i in range(0, n, args.group):
            copy_data(
                GPU_SPECS,
                [
                    (b.node, cols, b.n_gpu)
                    for b, cols in zip(batches[i : i + args.group], plain[i : i + args.group], strict=True)
                ],
            )

    def bounds() -> None:
        for b in batches:
            ingest_bounds.check(b, 255, 256)
        for i in range(0, n, args.group):
            ingest_bounds.energy_glitches(batches[i : i + args.group])

    out = {
        name: best_us(fn, args.repeat) / n
        for name, fn in [
            ("decode", decode),
            ("validate", sections),
            ("validate_column_by_column", columns),
            ("bounds", bounds),
            ("encode", encode),
            ("encode_column_by_column", encode_column_by_column),
        ]
    }
    per_sample = samples / n
    print(f"{n} requests of {per_sample:.0f} GPU-samples each (best of {args.repeat}):")
    for name, us in out.items():
        print(f"  {name:26s} {us:8.1f} us per request  {us / per_sample:6.2f} us per GPU-sample")
    print(
        f"  bounds (GPU indices, runs named, counter glitches): {out['bounds'] / out['validate']:.2f}x "
        "the validation before them"
    )
    speedup = out["validate_column_by_column"] / out["validate"]
    print(f"  validation a section at a time: {speedup:.2f}x less CPU than column by column")
    print(
        f"  encoding merged a matrix at a time: "
        f"{out['encode_column_by_column'] / out['encode']:.2f}x less CPU than column by column"
    )
    answering = {**waits_us(max(n, 1000), args.repeat), **answers_us(max(n, 1000), args.repeat)}
    print(
        f"  waiting for the writer       {answering['wait']:8.2f} us per request "
        f"(asyncio.wait_for(shield()): {answering['wait_for_shield']:.2f})"
    )
    print(
        f"  formatting the answer        {answering['answer']:8.2f} us per request "
        f"(JSONResponse: {answering['answer_json_response']:.2f})"
    )
    print(
        json.dumps(
            {
                "name": "request_cpu_validate",
                "value": round(out["validate"], 1),
                "unit": "us/request",
                "baseline_column_by_column": round(out["validate_column_by_column"], 1),
                "decode": round(out["decode"], 1),
                "encode": round(out["encode"], 1),
                "bounds": round(out["bounds"], 1),
                "encode_column_by_column": round(out["encode_column_by_column"], 1),
                **{k: round(v, 2) for k, v in answering.items()},
                "gpu_samples_per_request": per_sample,
                "requests": n,
            }
        )
    )


if __name__ == "__main__":
    main()
