"""What the fabric columns of the host row cost the collector per ingest request.

    python bench/host_row_cpu.py [--requests 640] [--repeat 5] [--group 64]

Builds agents' requests the way the agent does (its tick records, ``to_batch``
and ``encode_batch``: msgpack, zstd, 10 one-second ticks of 8 GPUs and the
host row): GPU rows from the NVML source on the fake NVML, host rows from the
host source on captured ``/proc`` and ``/sys`` trees (an H100 node's
InfiniBand HCAs).  Then times, in this process, the collector's steps on them
(decompress and parse, validation, the COPY encoding of a group commit of
``--group`` requests, GPU and host tables), three ways in the same run:

* ``before``: host rows with the contract's columns, encoded for the host
  table as it was before the fabric columns (the baseline);
* ``contract``: the same rows into today's host table (an agent that does not
  read the fabric: the new columns go as NULL);
* ``fabric``: host rows with every fabric column filled.

Each figure is the best of ``--repeat`` passes over all requests, in CPU time
of the timing thread, per request and per GPU-sample.  The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.agent.batch import encode_batch, tick_record, to_batch
from gpufleet.agent.sources.host import HostSource
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.catalog import HOST_FIELDS
from gpufleet.collector.batch_store import GPU_SPECS, HOST_SPECS, copy_data, table_specs
from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml
from gpufleet.wire import ParseLimits, decompress, parse, validate

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "realdata"
#: The host table's columns before the fabric (the contract's host.csv columns).
BEFORE_SPECS = table_specs(("time", "node"), tuple(f for f in HOST_FIELDS if f.bundle))
TICKS = 10


def host_rows(root: Path, n: int, fabric: bool) -> list[dict[str, Any]]:
    """``n`` host rows of the captured tree, counters moved on each second as traffic would."""
    proc, sys_root = root / "proc", root / "sys"
    (proc / "net").mkdir(parents=True, exist_ok=True)
    shutil.copy(REAL / "procfs" / "proc" / "net" / "dev", proc / "net" / "dev")
    for name in ("stat", "uptime", "diskstats"):
        shutil.copy(REAL / "sysstat" / "root1" / "proc" / name, proc / name)
    shutil.copytree(REAL / "procfs" / "sys" / "class" / "net", sys_root / "class" / "net", dirs_exist_ok=True)
    (sys_root / "class" / "net" / "eth0" / "device").mkdir(exist_ok=True)
    shutil.copytree(
        REAL / "gpud" / "sys" / "class" / "infiniband", sys_root / "class" / "infiniband", dirs_exist_ok=True
    )
    src = HostSource(proc, sys_root, rapl=False, fabric=fabric)
    src.collect()
    data = sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "port_rcv_data"
    out = []
    for _ in range(n):
        uptime = float((proc / "uptime").read_text().split()[0]) + 1.0
        (proc / "uptime").write_text(f"{uptime} {uptime}\n")
        data.write_text(f"{int(data.read_text()) + 1_000_000_000}\n")
        row = src.collect().host
        assert row is not None
        out.append(row)
    return out


def bodies(requests: int, hosts: list[dict[str, Any]]) -> list[bytes]:
    fake = FakeNvml([H100_SXM] * 8)
    gpu = NvmlSource(fake)
    t0 = 1_800_000_000.0
    out = []
    for r in range(requests):
        records = []
        for k in range(TICKS):
            rows = gpu.collect().gpus
            records.append(tick_record(t0 + r * TICKS + k, rows, hosts[(r * TICKS + k) % len(hosts)]))
        out.append(encode_batch(to_batch(records, f"bench:{r}", f"node-{r % 64}")))
    return out


def step_fns(raw: list[bytes], group: int, host_specs: list[Any]) -> dict[str, Callable[[], None]]:
    limits = ParseLimits.for_samples(100_000)
    docs = [parse(decompress(b, "zstd", 1 << 26), "application/msgpack", limits) for b in raw]
    batches = [validate(d) for d in docs]
    n = len(raw)

    def decode() -> None:
        for b in raw:
            parse(decompress(b, "zstd", 1 << 26), "application/msgpack", limits)

    def check() -> None:
        for d in docs:
            validate(d)

    def encode() -> None:
        for i in range(0, n, group):
            part = batches[i : i + group]
            copy_data(GPU_SPECS, [(b.node, b.gpu, b.n_gpu) for b in part])
            copy_data(host_specs, [(b.node, b.host, b.n_host) for b in part if b.n_host])

    return {"decode": decode, "validate": check, "encode": encode}


def interleaved(
    variants: dict[str, tuple[list[bytes], list[Any]]], group: int, repeat: int
) -> dict[str, dict[str, float]]:
    """Best CPU time (this thread's, so time spent waiting for a busy machine's cores is not counted) of each step
    of each variant, the variants taking turns within every pass, so a load that comes and goes reaches them
    alike."""
    fns = {v: step_fns(raw, group, specs) for v, (raw, specs) in variants.items()}
    best = {v: dict.fromkeys(fns[v], float("inf")) for v in fns}
    for _ in range(repeat):
        for step in ("decode", "validate", "encode"):
            for v in fns:
                t0 = time.thread_time()
                fns[v][step]()
                best[v][step] = min(best[v][step], time.thread_time() - t0)
    out = {}
    for v, (raw, _) in variants.items():
        n = len(raw)
        r = {k: t * 1e6 / n for k, t in best[v].items()}
        r["total"] = sum(r.values())
        r["bytes"] = sum(len(b) for b in raw) / n
        out[v] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--group", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = host_rows(Path(tmp) / "plain", 50, fabric=False)
        full = host_rows(Path(tmp) / "full", 50, fabric=True)
    assert all(r.get("ib_rx_bytes_s") is not None for r in full[1:]) and "ib_rx_bytes_s" not in plain[0]
    plain_bodies, full_bodies = bodies(args.requests, plain), bodies(args.requests, full)
    samples = 8 * TICKS
    res = interleaved(
        {
            "before": (plain_bodies, BEFORE_SPECS),
            "contract": (plain_bodies, HOST_SPECS),
            "fabric": (full_bodies, HOST_SPECS),
        },
        args.group,
        args.repeat,
    )
    print(
        f"{args.requests} requests of {samples} GPU-samples and {TICKS} host rows each (best of {args.repeat}):"
    )
    for name, r in res.items():
        print(
            f"  {name:9s} decode {r['decode']:7.1f}  validate {r['validate']:7.1f}  encode {r['encode']:7.1f}  "
            f"total {r['total']:7.1f} us per request ({r['total'] / samples:5.2f} per GPU-sample), "
            f"{r['bytes']:.0f} B on the wire"
        )
    for name in ("contract", "fabric"):
        print(
            f"  {name} against before: {100 * (res[name]['total'] / res['before']['total'] - 1):+.1f} % CPU"
        )
    print(
        json.dumps(
            {
                "name": "host_row_cpu_fabric",
                "value": round(res["fabric"]["total"], 1),
                "unit": "us/request",
                "baseline_before": round(res["before"]["total"], 1),
                "contract": round(res["contract"]["total"], 1),
                "fabric_vs_before": round(res["fabric"]["total"] / res["before"]["total"], 4),
                "contract_vs_before": round(res["contract"]["total"] / res["before"]["total"], 4),
                "bytes_before": round(res["before"]["bytes"]),
                "bytes_fabric": round(res["fabric"]["bytes"]),
                "gpu_samples_per_request": samples,
                "requests": args.requests,
            }
        )
    )


if __name__ == "__main__":
    main()
