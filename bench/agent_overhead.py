"""Agent overhead: CPU per sample and peak memory of the real agent on an 8-GPU node at 1 Hz.

    python bench/agent_overhead.py [--seconds 60] [--gpus 8] [--nvml-latency-us 20]

Runs two child processes for the same time, one after the other:

* ``agent``: the production :class:`gpufleet.agent.runtime.Agent` -- scheduler threads,
  merge, attribution, spool on disk, shipper, /metrics -- over fake NVML GPUs
  (each NVML call charged ``--nvml-latency-us`` of busy CPU, as a driver call
  costs) plus the real host source reading this machine's /proc, sampling at
  1 Hz and shipping every 5 s to a sink in this process that answers 200;
* ``baseline``: the same imports and the same 1 Hz loop doing nothing.

Each child measures its own CPU time over the loop (start-up excluded) and its
peak RSS.  Prints both, their ratio, CPU seconds per collected sample, and the
share of the CPU that the simulated NVML calls themselves cost.  The last line
is JSON with ``cpu_fraction_of_core`` and ``peak_rss_mb`` (targets: < 1 % of
one core, < 80 MB).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TARGET_CPU_FRACTION = 0.01
TARGET_RSS_MB = 80.0


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _imports() -> None:
    """What both children load, so the baseline's memory includes the same libraries."""
    import gpufleet.agent.runtime
    import gpufleet.agent.sources.host
    import gpufleet.agent.sources.nvml
    import gpufleet.sim.nvml_fake  # noqa: F401


def child_baseline(seconds: float) -> dict[str, Any]:
    _imports()
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    c0, t0 = time.process_time(), time.monotonic()
    next_at = t0
    while not stop.is_set():
        next_at += 1.0
        stop.wait(max(0.0, next_at - time.monotonic()))
    return {"cpu_s": time.process_time() - c0, "wall_s": time.monotonic() - t0, "peak_rss_mb": _peak_rss_mb()}


def child_agent(seconds: float, gpus: int, latency_us: float, url: str) -> dict[str, Any]:
    _imports()
    from gpufleet.agent.runtime import Agent
    from gpufleet.agent.sources.host import HostSource
    from gpufleet.agent.sources.nvml import NvmlSource
    from gpufleet.config import AgentSettings
    from gpufleet.serverthread import free_port
    from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml

    fake = FakeNvml([H100_SXM] * gpus, call_latency_s=latency_us / 1e6)
    for g in fake.gpus:
        g.load()
    settings = AgentSettings(
        collector_url=url,
        token="bench",
        interval_s=1.0,
        ship_interval_s=5.0,
        metrics_port=free_port(),
        metrics_host="127.0.0.1",
        start_jitter_s=0.0,
    )
    with tempfile.TemporaryDirectory() as spool:
        agent = Agent(
            settings,
            [NvmlSource(fake, sys_root="/sys"), HostSource("/proc", "/sys")],
            node="bench-node",
            spool_dir=Path(spool),
            rng=random.Random(1),
        )
        agent.start()
        stop = threading.Event()
        threading.Timer(seconds, stop.set).start()
        calls0 = sum(fake.calls.values())
        c0, t0 = time.process_time(), time.monotonic()
        agent.run(stop)
        cpu_s, wall_s = time.process_time() - c0, time.monotonic() - t0
        calls = sum(fake.calls.values()) - calls0
        spooled = agent.spool.stats.spooled
        agent.shutdown(ship_s=5.0)
        delivered = agent.spool.stats.delivered
    return {
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "peak_rss_mb": _peak_rss_mb(),
        "samples": spooled,
        "delivered": delivered,
        "nvml_calls": calls,
        "nvml_cpu_s": calls * latency_us / 1e6,
    }


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"status": "stored"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def run_child(role: str, args: argparse.Namespace, url: str = "") -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--role",
        role,
        "--seconds",
        str(args.seconds),
        "--gpus",
        str(args.gpus),
        "--nvml-latency-us",
        str(args.nvml_latency_us),
        "--url",
        url,
    ]
    out = subprocess.run(
        cmd, check=True, capture_output=True, text=True, cwd=ROOT, timeout=args.seconds + 120
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--nvml-latency-us", type=float, default=20.0, help="busy CPU charged per NVML call")
    p.add_argument("--role", choices=["agent", "baseline"], help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "baseline":
        print(json.dumps(child_baseline(args.seconds)))
        return
    if args.role == "agent":
        print(json.dumps(child_agent(args.seconds, args.gpus, args.nvml_latency_us, args.url)))
        return

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}"
    print(
        f"agent: {args.gpus} fake GPUs ({args.nvml_latency_us:g} µs per NVML call) + host, 1 Hz, "
        f"{args.seconds:g} s; baseline: the same loop doing nothing",
        flush=True,
    )
    agent = run_child("agent", args, url)
    base = run_child("baseline", args)
    sink.shutdown()

    frac = agent["cpu_s"] / agent["wall_s"]
    per_sample = agent["cpu_s"] / max(1, agent["samples"])
    net_per_sample = (agent["cpu_s"] - base["cpu_s"]) / max(1, agent["samples"])
    cpu_ratio = agent["cpu_s"] / base["cpu_s"] if base["cpu_s"] > 0 else float("inf")
    rss_ratio = agent["peak_rss_mb"] / base["peak_rss_mb"]
    print(f"{'':24}{'agent':>12}{'baseline':>12}{'ratio':>10}")
    print(f"{'CPU seconds':24}{agent['cpu_s']:12.3f}{base['cpu_s']:12.3f}{cpu_ratio:10.1f}")
    print(f"{'share of one core':24}{100 * frac:11.3f}%{100 * base['cpu_s'] / base['wall_s']:11.3f}%")
    print(f"{'peak RSS, MB':24}{agent['peak_rss_mb']:12.1f}{base['peak_rss_mb']:12.1f}{rss_ratio:10.2f}")
    print(
        f"samples collected {agent['samples']} (delivered {agent['delivered']}); "
        f"CPU per sample {1e6 * per_sample:.0f} µs ({1e6 * net_per_sample:.0f} µs over the baseline); "
        f"simulated NVML calls {agent['nvml_calls']} = {agent['nvml_cpu_s']:.3f} CPU s "
        f"({100 * agent['nvml_cpu_s'] / max(agent['cpu_s'], 1e-9):.0f} % of the agent's CPU)"
    )
    ok = frac < TARGET_CPU_FRACTION and agent["peak_rss_mb"] < TARGET_RSS_MB
    print(
        json.dumps(
            {
                "name": "agent_overhead",
                "value": round(frac, 5),
                "unit": "fraction_of_core",
                "seconds": args.seconds,
                "gpus": args.gpus,
                "nvml_latency_us": args.nvml_latency_us,
                "samples": agent["samples"],
                "delivered": agent["delivered"],
                "cpu_s": round(agent["cpu_s"], 4),
                "baseline_cpu_s": round(base["cpu_s"], 4),
                "cpu_ratio_to_baseline": round(cpu_ratio, 2),
                "cpu_s_per_sample": per_sample,
                "cpu_fraction_of_core": round(frac, 5),
                "nvml_cpu_s": round(agent["nvml_cpu_s"], 4),
                "peak_rss_mb": round(agent["peak_rss_mb"], 1),
                "baseline_peak_rss_mb": round(base["peak_rss_mb"], 1),
                "rss_ratio_to_baseline": round(rss_ratio, 3),
                "targets": {"cpu_fraction_of_core": TARGET_CPU_FRACTION, "peak_rss_mb": TARGET_RSS_MB},
                "ok": ok,
            }
        )
    )


if __name__ == "__main__":
    main()
