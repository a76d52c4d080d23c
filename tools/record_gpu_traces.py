#!/usr/bin/env python3
"""Record golden GPU traces on a real GPU with the agent's own NVML and host sources.

Runs a bf16 PyTorch training loop on GPU 0 through three scenarios, injecting
timed events from inside the training process, while two sampler threads read
the GPU and the host at two intervals (1 s and 100 ms by default) exactly the
way the agent does: one :class:`gpufleet.agent.sources.nvml.NvmlSource` over
:class:`gpufleet.agent.sources.nvml_api.PynvmlApi` and one
:class:`gpufleet.agent.sources.host.HostSource` per sampler, each tick stamped with the
wall-clock time taken just before the read (as ``agent.runtime`` stamps
ticks).  Node facts are ``agent.sources.facts.node_facts()`` merged with
``NvmlSource.facts()``, as the agent merges them.

Scenarios (``--scenarios``):

* ``healthy``: the loop fed by a fast loader (pinned host batches copied to
  the GPU every step) for ``--seconds``.
* ``slow_loader``: ``--lead-in`` seconds of healthy training, then
  ``--seconds`` fed by a CPU-bound loader: decode worker processes (every
  CPU but two, like DataLoader workers) burn ``--loader-period`` seconds per
  shard; each shard feeds ``--loader-busy`` seconds of training, so the GPU
  waits for input in a sawtooth while the host's CPUs stay saturated.  Every
  wait, burst and decode is logged.
* ``checkpoint``: ``--lead-in`` seconds of healthy training, then
  ``--seconds`` in which the loop stops every ``--ckpt-every`` seconds of
  training to ``torch.save`` a ``--ckpt-gb`` GiB state (model, optimizer and
  optimizer-sized shards, all on the GPU) to ``--ckpt-dir`` and fsync it.  The
  GPU idles while saving, as in a single-process job.  Every save is logged;
  a save faster than ``--ckpt-min-s`` grows the state for the next ones (up
  to ``--ckpt-max-gb`` and free disk / 2.5), one slower than ``--ckpt-max-s``
  shrinks it, and each such change is logged too.

Each scenario and interval becomes a trace bundle (contracts.md section 1:
``gpu.csv``, ``host.csv``, ``runs.csv``, ``allocations.csv``, ``nodes.json``)
plus ``labels.json`` (the simulator's label layout and vocabulary, see
``gpufleet/sim/labels.py``) and ``nvml_readings.jsonl``: one JSON line per
tick per GPU holding the row the NVML source returned, unchanged, so tests
can replay the source's output.  Each scenario also keeps ``events.jsonl``,
the training process's own log of what it injected and when;
``nvidia-smi/idle.txt`` and ``load.txt`` hold ``nvidia-smi -q`` before the
first scenario and half-way through ``healthy``, as a reference for the
readings, and ``recording.json`` what was run, on what, and how it went.  Everything is
packed into ONE ``<name>.tar.gz`` under ``--out``, rewritten after every
scenario so a run cut short still leaves the finished scenarios.  The last
line printed is one JSON object summarising the recording.

Nothing here changes GPU settings: no power limits, clocks, persistence or
MIG changes; the GPU is only read.

Dependencies: the script runs from a repository checkout without the
package installed; it puts the repository root on ``sys.path`` and imports
only ``gpufleet.agent.sources.{base,nvml,nvml_api,host,facts}``,
``gpufleet.catalog``, ``gpufleet.timeparse`` and
``gpufleet.collector.bundle_files`` (the bundle's files as the collector's
reader and the other writers know them), which use the standard library
alone (``pynvml`` is imported by ``PynvmlApi`` on first use), and
``gpu_trace_workload`` beside it: the training backends, the loop, the slow
loader and the event log.  Beyond those: ``torch`` (real run)
and ``numpy`` (loader decode, dry run).  No pydantic, msgpack, orjson or
zstandard is imported: ``recording.json`` lists the top-level modules loaded
so a test can check that.

``--dry-run`` replaces the GPU by ``gpufleet.sim.nvml_fake.FakeNvml`` (an
H200 profile, loaded while the stand-in trains) and the training step by a
small numpy product plus a sleep; the schedule, samplers, loader, event log,
bundles, labels and archive are the same code.

If the first NVML read fails with an NVML error other than "not supported"
(seen on sandboxed runtimes), the recording goes on through a thin adapter
that turns such errors of single readings into "not supported" (NULL), and
``recording.json`` names each reading so affected.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# The workload module beside this script: already on the path when the script is run, not when it is
# loaded by file location (the tests).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from gpu_trace_workload import (  # noqa: E402
    Backend,
    CpuBackend,
    EventLog,
    SlowLoader,
    TorchBackend,
    Trainer,
    say,
)

from gpufleet.agent.sources.base import GpuRow, HostRow, SourceError  # noqa: E402
from gpufleet.agent.sources.facts import node_facts  # noqa: E402
from gpufleet.agent.sources.host import HostSource  # noqa: E402
from gpufleet.agent.sources.nvml import NvmlSource, _compute_pids  # noqa: E402
from gpufleet.agent.sources.nvml_api import (  # noqa: E402
    GpuLost,
    NotSupported,
    NvmlApi,
    NvmlError,
    NvmlUnavailable,
    PynvmlApi,
)
from gpufleet.catalog import GPU_CSV_COLUMNS, HOST_CSV_COLUMNS, canonical_gpu_name  # noqa: E402
from gpufleet.collector.bundle_files import (  # noqa: E402
    ALLOCATIONS_CSV,
    GPU_CSV,
    HOST_CSV,
    LABELS_JSON,
    NODES_JSON,
    RUNS_CSV,
    BundleWriter,
    line,
    number,
    rfc3339_ms,
    text,
)

FORMAT_VERSION = 1


#: Label vocabulary (gpufleet/sim/labels.py).
STARVATION = "starvation"
CHECKPOINT_STALL = "checkpoint_stall"
STRAGGLER = "straggler"

SCENARIOS = ("healthy", "slow_loader", "checkpoint")
GIB = 1024**3

#: Modules that must not be needed on the recording machine.
UNAVAILABLE_THERE = (
    "pydantic",
    "pydantic_settings",
    "msgpack",
    "orjson",
    "zstandard",
    "psycopg",
    "sqlalchemy",
    "fastapi",
    "httpx",
)


def rfc3339(t: float) -> str:
    """UTC RFC 3339 with milliseconds, ``Z`` suffix."""
    return rfc3339_ms(t, always_ms=True)


def interval_label(seconds: float) -> str:
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# --------------------------------------------------------------------------- NVML plumbing


class TolerantNvml:
    """An ``NvmlApi`` that reports a failing single reading as NotSupported (NULL) instead of failing the read.

    Used only when the first read through the plain API failed; every method
    so affected is listed in :attr:`tolerated` with NVML's message.
    """

    #: Failing these means there is nothing to record.
    CRITICAL = frozenset({"init", "shutdown", "device_count", "device_handle", "device_key"})

    def __init__(self, api: NvmlApi) -> None:
        self._api = api
        self.tolerated: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._api, name)
        if name.startswith("_") or name in self.CRITICAL or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "create_event_set" and "wait_xid" in self.tolerated:
                raise NotSupported("nvml: XID events cannot be read here (wait_xid failed)")
            try:
                return attr(*args, **kwargs)
            except (NotSupported, GpuLost):
                raise
            except NvmlError as e:
                self.tolerated.setdefault(name, str(e))
                raise NotSupported(f"{e} (recorded as not supported)") from e

        return call

    def compute_processes(self, handle: Any) -> list[int]:
        if isinstance(self._api, PynvmlApi):
            return _compute_pids(self._api, handle)
        raise NotSupported("nvml: this NVML binding cannot list processes")


@dataclass
class NvmlSetup:
    """How sources are made: the API factory, and what the preflight found."""

    make_api: Callable[[], Any]
    kind: str
    first_error: str | None = None
    tolerant: TolerantNvml | None = None
    preflight_s: float = 0.0

    def source(self) -> NvmlSource:
        return NvmlSource(self.make_api())


def close_quietly(src: NvmlSource) -> None:
    try:
        src.close()
    except Exception as e:  # noqa: BLE001 - closing must never end the recording
        say(f"  note: closing an NVML source: {e}")


def nvml_preflight(make_plain: Callable[[], Any], kind: str) -> NvmlSetup:
    """Read once through the plain API; on an NVML error, through :class:`TolerantNvml` (raises when both fail)."""
    t0 = time.perf_counter()
    src = NvmlSource(make_plain())
    try:
        src.collect()
        return NvmlSetup(make_plain, kind, preflight_s=time.perf_counter() - t0)
    except NvmlUnavailable:
        raise
    except NvmlError as e:
        first = str(e)
        say(f"NVML read failed through the plain API ({first}); retrying with failing readings as NULL")
    finally:
        close_quietly(src)
    tol = TolerantNvml(make_plain())
    last = first
    for _ in range(6):
        src = NvmlSource(tol)
        try:
            src.collect()
            break
        except NvmlError as e:
            last = str(e)
        finally:
            close_quietly(src)
    else:
        raise SourceError(f"NVML cannot be read here: {first}; then: {last}")
    say(f"NVML readings recorded as NULL here: {json.dumps(tol.tolerated)}")
    return NvmlSetup(lambda: tol, kind + "+tolerant", first, tol, time.perf_counter() - t0)


# --------------------------------------------------------------------------- sampling


@dataclass
class Tick:
    n: int
    time: float
    collect_s: float
    gpus: list[GpuRow]
    host: HostRow | None
    error: str | None = None
    host_error: str | None = None


class Sampler(threading.Thread):
    """One agent-like sampling loop: NVML and host sources read every ``interval_s`` on an absolute schedule."""

    def __init__(self, interval_s: float, nvml: NvmlSource, host: HostSource | None) -> None:
        super().__init__(name=f"sampler-{interval_label(interval_s)}", daemon=True)
        self.interval_s = interval_s
        self.nvml = nvml
        self.host = host
        self.ticks: list[Tick] = []
        self.skipped = 0
        self.stop_event = threading.Event()
        self.first = threading.Event()

    def run(self) -> None:
        mono0 = time.monotonic()
        slot = 0
        while not self.stop_event.is_set():
            self.tick()
            self.first.set()
            slot += 1
            behind = time.monotonic() - (mono0 + slot * self.interval_s)
            if behind > self.interval_s:
                missed = int(behind // self.interval_s)
                self.skipped += missed
                slot += missed
            self.stop_event.wait(max(0.0, mono0 + slot * self.interval_s - time.monotonic()))

    def tick(self) -> None:
        t = time.time()
        c0 = time.perf_counter()
        rows: list[GpuRow] = []
        error = host_error = None
        try:
            rows = self.nvml.collect().gpus
        except Exception as e:  # noqa: BLE001 - a failed read is recorded, the recording goes on
            error = f"{type(e).__name__}: {e}"
        collect_s = time.perf_counter() - c0
        host: HostRow | None = None
        if self.host is not None:
            try:
                host = self.host.collect().host
            except Exception as e:  # noqa: BLE001 - as above
                host_error = f"{type(e).__name__}: {e}"
        self.ticks.append(Tick(len(self.ticks), t, collect_s, rows, host, error, host_error))

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)


# --------------------------------------------------------------------------- scenarios


@dataclass
class ScenarioResult:
    name: str
    run_id: str
    t0: float
    t_end: float
    lead_in_end: float | None
    log: EventLog
    samplers: list[Sampler]
    facts: dict[str, Any]
    incidents: list[dict[str, Any]] = field(default_factory=list)
    hard_negatives: list[dict[str, Any]] = field(default_factory=list)
    processes: dict[str, Any] = field(default_factory=dict)
    steps: int = 0


class Recorder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node = args.node
        self.fakes: list[Any] = []
        self.backend: Backend
        self.nvml: NvmlSetup
        self.host_ok = True
        self.host_error: str | None = None
        self.meta: dict[str, Any] = {}
        self.work: Path
        self.name = args.name or (
            "gpu-traces-"
            + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            + ("-dryrun" if args.dry_run else "")
        )
        self.gpu_index = 0
        self.ckpt_dir: Path | None = None
        self.ckpt_gb = args.ckpt_gb
        self.ckpt_cap_gb = args.ckpt_max_gb

    # -- setup -------------------------------------------------------------------------

    def _fake_api(self) -> Any:
        from gpufleet.sim.nvml_fake import H200, FakeNvml

        fake = FakeNvml([H200] * self.args.dry_gpus, energy_mj=5.0e9)
        if self.fakes and self.fakes[0].gpu(0).util_pct:
            fake.gpu(0).load()
        self.fakes.append(fake)
        return fake

    def setup(self) -> None:
        args = self.args
        self._smi("idle")
        if args.dry_run:
            self.nvml = nvml_preflight(self._fake_api, "FakeNvml")
            self.backend = CpuBackend(args, self.fakes)
        else:
            self.nvml = nvml_preflight(PynvmlApi, "PynvmlApi")
            self.backend = TorchBackend(args)
        try:
            h = HostSource()
            h.collect()
            time.sleep(0.05)
            h.collect()
        except SourceError as e:
            self.host_ok, self.host_error = False, str(e)
            say(f"host source unavailable, host.csv will be absent: {e}")
        self.gpu_index = self._nvml_index_of_gpu0()
        self.ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else Path(args.out) / "ckpt-scratch"

    def _nvml_index_of_gpu0(self) -> int:
        uuid = getattr(self.backend, "device_uuid", None)
        if not uuid:
            return 0
        want = uuid.lower().removeprefix("gpu-")
        probe = self.nvml.source()
        try:
            for g in probe.facts().get("gpus", []):
                if str(g.get("uuid") or "").lower().removeprefix("gpu-") == want:
                    return int(g["gpu"])
        except Exception as e:  # noqa: BLE001 - index 0 is the answer when NVML cannot say
            say(f"  note: cannot match torch's GPU to NVML's ({e}); using index 0")
        finally:
            close_quietly(probe)
        return 0

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        try:
            facts.update(node_facts())
        except Exception as e:  # noqa: BLE001 - facts are context, not the recording
            facts["node_facts_error"] = str(e)
        probe = self.nvml.source()
        try:
            facts.update(probe.facts())
        except Exception as e:  # noqa: BLE001 - as above
            facts["nvml_facts_error"] = str(e)
        finally:
            close_quietly(probe)
        if not self.args.keep_hostname and "hostname" in facts:
            facts["hostname"] = self.node
        return facts

    def processes(self) -> dict[str, Any]:
        probe = self.nvml.source()
        try:
            return {"by_gpu": {str(k): v for k, v in probe.processes().items()}, "own_pid": os.getpid()}
        except Exception as e:  # noqa: BLE001 - attribution context only
            return {"error": str(e), "own_pid": os.getpid()}
        finally:
            close_quietly(probe)

    def _smi(self, label: str) -> None:
        self.meta.setdefault("nvidia_smi", {})[label] = nvidia_smi_capture(
            self.work / "nvidia-smi" / f"{label}.txt"
        )

    def calibrate(self) -> None:
        t = Trainer(self.backend)
        steps = t.train_for(self.args.warmup)
        step_s = median(t.step_times[len(t.step_times) // 2 :]) or 0.0
        tflops = self.backend.flops_per_step / step_s / 1e12 if step_s > 0 else None
        self.meta["calibration"] = {
            "warmup_s": self.args.warmup,
            "steps": steps,
            "step_s": step_s,
            "tflops": round(tflops, 1) if tflops else None,
        }
        say(
            f"warm-up: {steps} steps, median step {step_s * 1000:.1f} ms"
            + (f", {tflops:.0f} TFLOP/s" if tflops else "")
        )

    # -- one scenario ------------------------------------------------------------------

    def run_scenario(self, name: str) -> ScenarioResult:
        """Prepare (unrecorded), start the samplers, train with the scenario's injections, stop the samplers."""
        args = self.args
        sdir = self.work / name
        sdir.mkdir(parents=True, exist_ok=True)
        log = EventLog(sdir / "events.jsonl", name)
        run_id = f"realtrace-{name}"
        loader: SlowLoader | None = None
        state = 0
        if name == "slow_loader":
            workers = args.loader_workers or max(1, cpu_count() - 2)
            loader = SlowLoader(args.loader_period, workers)
        elif name == "checkpoint":
            state = self.backend.grow_state(int(self.ckpt_gb * GIB))
            say(f"scenario {name}: checkpoint state {state / GIB:.2f} GiB")
        facts = self.facts()
        samplers = [
            Sampler(iv, self.nvml.source(), HostSource() if self.host_ok else None) for iv in args.intervals
        ]
        pad = 1.5 * max(args.intervals)
        say(f"scenario {name}: sampling at {', '.join(interval_label(i) for i in args.intervals)}")
        for s in samplers:
            s.start()
        for s in samplers:
            s.first.wait(timeout=10)
        time.sleep(pad)
        trainer = Trainer(self.backend)
        t0 = time.time()
        lead_end: float | None = None
        res = ScenarioResult(name, run_id, t0, t0, None, log, samplers, facts)
        try:
            if name == "healthy":
                smi = threading.Timer(args.seconds / 2, self._smi, ("load",))
                smi.start()
                steps = trainer.train_for(args.seconds)
                smi.join(timeout=35)
                t_end = time.time()
                log.add("training", t0, t_end, steps=steps, loader="fast")
                res.processes = self.processes()
            else:
                steps = trainer.train_for(args.lead_in)
                lead_end = time.time()
                log.add("lead_in", t0, lead_end, steps=steps, loader="fast")
                res.processes = self.processes()
                if loader is not None:
                    t_end = self._slow_loader(trainer, log, res, loader)
                else:
                    t_end = self._checkpoint(trainer, log, res, state)
        finally:
            self.backend.busy(False)
            if loader is not None:
                loader.stop()
            time.sleep(pad)
            for s in samplers:
                s.stop()
            for s in samplers:
                close_quietly(s.nvml)
            log.close()
            if name == "checkpoint":
                self.backend.drop_state()
        res.t_end, res.lead_in_end, res.steps = t_end, lead_end, len(trainer.step_times)
        res.hard_negatives.append(
            {
                "reason": "healthy_training" if name == "healthy" else "healthy_lead_in",
                "not_kinds": [STARVATION, CHECKPOINT_STALL, STRAGGLER],
                "start": t0,
                "end": t_end if lead_end is None else lead_end,
                "run_id": run_id,
                "node": None,
                "gpu": None,
                "detail": {"loader": "fast"},
            }
        )
        return res

    def _slow_loader(self, trainer: Trainer, log: EventLog, res: ScenarioResult, loader: SlowLoader) -> float:
        """Training fed by the slow loader; returns when training ended."""
        args = self.args
        phase0 = time.time()
        phase_end = time.monotonic() + args.seconds
        loader.start(log)
        waits: list[tuple[float, float]] = []
        bursts: list[tuple[float, float]] = []
        while time.monotonic() + args.loader_period <= phase_end or not bursts:
            ws = time.time()
            shard = loader.get(timeout=phase_end + args.loader_period - time.monotonic())
            we = time.time()
            if shard is None:
                break
            log.add("loader_wait", ws, we, shard=shard)
            waits.append((ws, we))
            steps = trainer.train_for(args.loader_busy)
            be = time.time()
            log.add("train_burst", we, be, shard=shard, steps=steps)
            bursts.append((we, be))
        t_end = time.time()
        log.add(
            "slow_loader",
            phase0,
            t_end,
            period_s=args.loader_period,
            busy_s=args.loader_busy,
            decode_workers=loader.workers,
            decode_kind=loader.kind,
        )
        if waits:
            # Shards arrive every decode period; the first wait is a whole period, later ones shorter.
            arrivals = [w[1] for w in waits]
            cycles = [b[1] - w[0] for w, b in zip(waits, bursts, strict=True)]
            busy = [b[1] - b[0] for b in bursts]
            res.incidents.append(
                {
                    "kind": STARVATION,
                    "cause": "cpu",
                    "start": waits[0][0],
                    "end": bursts[-1][1],
                    "run_id": res.run_id,
                    "node": None,
                    "gpu": None,
                    "fault": "starvation_cpu",
                    "fault_index": None,
                    "evidence": {
                        "period_s": round(median([b - a for a, b in pairwise(arrivals)]) or 0.0, 3),
                        "duty": round(
                            median([u / c for u, c in zip(busy, cycles, strict=True) if c > 0]) or 0.0, 3
                        ),
                        "nodes": [self.node],
                        "decode_workers": loader.workers,
                        "decode_s": args.loader_period,
                        "busy_s": args.loader_busy,
                        "cycles": len(waits),
                        "waits": [[rfc3339(a), rfc3339(b)] for a, b in waits],
                    },
                }
            )
        return t_end

    def _resize_checkpoint(self, log: EventLog, save_s: float, at: float) -> None:
        """Keep saves between ``--ckpt-min-s`` and ``--ckpt-max-s``: a fast disk gets a bigger state (a stall
        the detectors can see), a slow one a smaller state (the scenario keeps its length)."""
        args = self.args
        before = self.backend.state_bytes()
        if save_s > args.ckpt_max_s:
            after = self.backend.shrink_state(int(before * args.ckpt_max_s * 0.8 / save_s))
        elif 0 < save_s < args.ckpt_min_s and before < self.ckpt_cap_gb * GIB:
            want = min(before * args.ckpt_min_s * 1.2 / save_s, self.ckpt_cap_gb * GIB)
            after = self.backend.grow_state(int(want))
        else:
            return
        log.add(
            "checkpoint_resize",
            at,
            time.time(),
            before_bytes=before,
            after_bytes=after,
            save_s=round(save_s, 3),
        )

    def _checkpoint(self, trainer: Trainer, log: EventLog, res: ScenarioResult, state: int) -> float:
        """Training with a blocking save every ``--ckpt-every`` s; returns when training ended."""
        args = self.args
        assert self.ckpt_dir is not None
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        phase0 = time.time()
        phase_end = time.monotonic() + args.seconds
        saves: list[tuple[float, float]] = []
        sizes: list[int] = []
        previous: Path | None = None
        deleters: list[threading.Thread] = []
        k = 0
        try:
            while True:
                trainer.train_for(min(args.ckpt_every, max(0.0, phase_end - time.monotonic())))
                if phase_end - time.monotonic() < args.ckpt_every / 2:
                    break
                path = self.ckpt_dir / f"step-{k:03d}.pt"
                self.backend.sync()
                s = time.time()
                info = self.backend.save(path, not args.no_fsync)
                e = time.time()
                log.add("checkpoint_save", s, e, index=k, fsync=not args.no_fsync, **info)
                saves.append((s, e))
                sizes.append(int(info["bytes"]))
                if previous is not None:
                    d = threading.Thread(target=previous.unlink, kwargs={"missing_ok": True}, daemon=True)
                    d.start()
                    deleters.append(d)
                previous = path
                k += 1
                self._resize_checkpoint(log, e - s, e)
        finally:
            for d in deleters:
                d.join(timeout=60)
            if previous is not None:
                previous.unlink(missing_ok=True)
        t_end = time.time()
        log.add("checkpointing", phase0, t_end, every_s=args.ckpt_every, state_bytes=state)
        if saves:
            starts = [a for a, _ in saves]
            res.incidents.append(
                {
                    "kind": CHECKPOINT_STALL,
                    "cause": None,
                    "start": saves[0][0],
                    "end": saves[-1][1],
                    "run_id": res.run_id,
                    "node": None,
                    "gpu": None,
                    "fault": "checkpoint_stall",
                    "fault_index": None,
                    "evidence": {
                        "period_s": round(median([b - a for a, b in pairwise(starts)]) or 0.0, 3),
                        "duration_s": round(median([b - a for a, b in saves]) or 0.0, 3),
                        "writer_gpu": f"{self.node}/{self.gpu_index}",
                        "bytes": sizes,
                        "fsync": not args.no_fsync,
                        "dir_fs": fs_type(self.ckpt_dir),
                        "stalls": [[rfc3339(a), rfc3339(b)] for a, b in saves],
                    },
                }
            )
        return t_end

    # -- writing -----------------------------------------------------------------------

    def write_scenario(self, res: ScenarioResult) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in res.samplers:
            label = interval_label(s.interval_s)
            out[label] = self._write_bundle(self.work / res.name / label, res, s)
        return out

    def _write_bundle(self, d: Path, res: ScenarioResult, s: Sampler) -> dict[str, Any]:
        """The sampler's bundle with its labels and NVML readings, renamed into ``d`` once all is written."""
        with BundleWriter(d) as bundle:
            return self._write_files(bundle, res, s)

    def _write_files(self, bundle: BundleWriter, res: ScenarioResult, s: Sampler) -> dict[str, Any]:
        node = text(self.node)
        ticks = s.ticks
        extra = (
            ["mig_instance"] if any(r.get("mig_instance") is not None for t in ticks for r in t.gpus) else []
        )
        gpu_cols = list(GPU_CSV_COLUMNS) + extra
        gpu_rows = host_rows = 0
        with bundle.open_csv(GPU_CSV, gpu_cols) as f:
            for t in ticks:
                ts = rfc3339(t.time)
                for r in t.gpus:
                    f.write(line([ts, node, *(cell(r.get(canonical_gpu_name(c))) for c in gpu_cols[2:])]))
                    gpu_rows += 1
        if self.host_ok:
            with bundle.open_csv(HOST_CSV) as f:
                for t in ticks:
                    if t.host is not None:
                        host = t.host
                        f.write(
                            line([rfc3339(t.time), node, *(cell(host.get(c)) for c in HOST_CSV_COLUMNS[2:])])
                        )
                        host_rows += 1
        run_id = text(res.run_id)
        bundle.write_csv(
            RUNS_CSV, [[run_id, text(f"{res.name} (recorded)"), "", rfc3339(res.t0), rfc3339(res.t_end)]]
        )
        bundle.write_csv(ALLOCATIONS_CSV, [[run_id, node, str(self.gpu_index)]])
        bundle.write_json(NODES_JSON, {self.node: res.facts})
        errors = 0
        with bundle.path("nvml_readings.jsonl").open("w", encoding="utf-8") as f:
            for t in ticks:
                if t.error is not None:
                    errors += 1
                    f.write(
                        json.dumps(
                            {
                                "tick": t.n,
                                "time": t.time,
                                "collect_s": round(t.collect_s, 6),
                                "error": t.error,
                            }
                        )
                        + "\n"
                    )
                for r in t.gpus:
                    f.write(
                        json.dumps(
                            {"tick": t.n, "time": t.time, "collect_s": round(t.collect_s, 6), "row": r}
                        )
                        + "\n"
                    )
        span = (ticks[0].time, ticks[-1].time) if ticks else (res.t0, res.t_end)
        bundle.write_json(LABELS_JSON, self._labels(res, s.interval_s, span))
        collect = [t.collect_s for t in ticks]
        spacing = [b.time - a.time for a, b in pairwise(ticks)]
        return {
            "ticks": len(ticks),
            "gpu_rows": gpu_rows,
            "host_rows": host_rows,
            "skipped": s.skipped,
            "nvml_errors": errors,
            "host_errors": sum(1 for t in ticks if t.host_error),
            "first_nvml_error": next((t.error for t in ticks if t.error), None),
            "first_host_error": next((t.host_error for t in ticks if t.host_error), None),
            "collect_s_median": round(median(collect) or 0.0, 6),
            "collect_s_max": round(max(collect, default=0.0), 6),
            "spacing_s_median": round(median(spacing) or 0.0, 6),
            "start": span[0],
            "end": span[1],
        }

    def _labels(self, res: ScenarioResult, interval_s: float, span: tuple[float, float]) -> dict[str, Any]:
        """labels.json: the simulator's label layout over what the training process logged."""

        def times(x: dict[str, Any]) -> dict[str, Any]:
            y = dict(x)
            for k in ("start", "end"):
                if y.get(k) is not None:
                    y[k] = rfc3339(y[k])
            return y

        events = [
            {
                "type": e["type"],
                "start": e["start"],
                "end": e["end"],
                "node": self.node,
                "gpu": None,
                "detail": {"scenario": res.name, **e["detail"]},
            }
            for e in res.log.events
        ]
        events.sort(key=lambda e: (e["start"], e["type"]))
        return {
            "scenario": res.name,
            "seed": 0,
            "start": rfc3339(span[0]),
            "end": rfc3339(span[1]),
            "sample_interval_s": interval_s,
            "incidents": [times(i) for i in res.incidents],
            "hard_negatives": [times(h) for h in res.hard_negatives],
            "events": [times(e) for e in events],
            "runs": [
                times(
                    {
                        "run_id": res.run_id,
                        "name": f"{res.name} (recorded)",
                        "site": None,
                        "start": res.t0,
                        "end": res.t_end,
                        "train_start": rfc3339(res.t0),
                        "workload": "training",
                        "gpu_count": 1,
                        "gpu": self.gpu_index,
                        "steps": res.steps,
                        "flops_per_step": self.backend.flops_per_step,
                        "model": {
                            "kind": "mlp",
                            "layers": self.args.layers,
                            "dim": self.args.dim,
                            "batch": self.args.batch,
                            "dtype": "bf16",
                        }
                        if not self.args.dry_run
                        else {"kind": "cpu-stand-in"},
                    }
                )
            ],
            "recorded": {
                "source": "nvml" if not self.args.dry_run else "fake-nvml",
                "dry_run": self.args.dry_run,
                "node": self.node,
                "lead_in_end": rfc3339(res.lead_in_end) if res.lead_in_end else None,
            },
        }

    def archive(self) -> Path:
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        final = out / f"{self.name}.tar.gz"
        part = out / f"{self.name}.tar.gz.part"
        with tarfile.open(part, "w:gz", compresslevel=6) as tar:
            tar.add(self.work, arcname=self.name)
        os.replace(part, final)
        return final

    def write_meta(self, extra: dict[str, Any]) -> None:
        self.meta.update(extra)
        modules = sorted({m.split(".")[0] for m in list(sys.modules) if not m.startswith("_")})
        self.meta["modules"] = modules
        self.meta["modules_missing_on_gpu_machine"] = [m for m in UNAVAILABLE_THERE if m in modules]
        (self.work / "recording.json").write_text(
            json.dumps(self.meta, indent=1, default=str) + "\n", encoding="utf-8"
        )


def nvidia_smi_capture(path: Path) -> str:
    """``nvidia-smi -q`` into ``path`` (a reference for the NVML readings); returns what happened."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        proc = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(proc.stdout + (f"\n# stderr:\n{proc.stderr}" if proc.stderr else ""), encoding="utf-8")
    return f"exit {proc.returncode} at {rfc3339(time.time())}"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cell(v: Any) -> str:
    """A reading as a bundle cell: numbers to 4 decimal places (finer than any source reads), none empty."""
    if v is None or isinstance(v, int | float):
        return number(v, 4)
    return text(str(v))


def fs_type(path: Path) -> str | None:
    """File system type holding ``path`` per /proc/mounts (longest mount point prefix)."""
    try:
        p = str(path.resolve())
        best, kind = "", None
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if (
                len(parts) >= 3
                and (p == parts[1] or p.startswith(parts[1].rstrip("/") + "/"))
                and len(parts[1]) >= len(best)
            ):
                best, kind = parts[1], parts[2]
        return kind
    except OSError:
        return None


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", required=True, help="folder for the one .tar.gz archive")
    p.add_argument("--name", help="archive and top folder name (default gpu-traces-<UTC time>)")
    p.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="length of each scenario's injected phase (healthy: its whole length), s",
    )
    p.add_argument(
        "--lead-in",
        type=float,
        default=35.0,
        help="healthy training before the injected phase, s (the detectors' warm-up needs 30 s busy)",
    )
    p.add_argument("--intervals", default="1,0.1", help="sampling intervals, s, comma separated")
    p.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma separated subset of " + ",".join(SCENARIOS)
    )
    p.add_argument("--node", default="node-01", help="node name in the bundles (and the hostname fact)")
    p.add_argument(
        "--keep-hostname", action="store_true", help="keep the machine's real hostname in nodes.json"
    )
    p.add_argument(
        "--warmup", type=float, default=5.0, help="unrecorded warm-up training before the first scenario, s"
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--loader-period", type=float, default=8.0, help="slow loader: decode time per shard, s")
    p.add_argument("--loader-busy", type=float, default=3.0, help="slow loader: training time per shard, s")
    p.add_argument(
        "--loader-workers", type=int, default=0, help="slow loader: decode processes (0: CPUs - 2)"
    )
    p.add_argument(
        "--ckpt-every", type=float, default=15.0, help="checkpoint: training time between saves, s"
    )
    p.add_argument("--ckpt-gb", type=float, default=8.0, help="checkpoint: state size, GiB")
    p.add_argument(
        "--ckpt-dir", help="checkpoint: folder on local disk (default <out>/ckpt-scratch, removed)"
    )
    p.add_argument(
        "--ckpt-min-s",
        type=float,
        default=6.0,
        help="checkpoint: a save faster than this grows the state for the next ones, s",
    )
    p.add_argument(
        "--ckpt-max-s",
        type=float,
        default=12.0,
        help="checkpoint: a save slower than this shrinks the state for the next ones, s",
    )
    p.add_argument(
        "--ckpt-max-gb",
        type=float,
        default=24.0,
        help="checkpoint: largest state it may grow to, GiB (also kept under free disk / 2.5)",
    )
    p.add_argument("--no-fsync", action="store_true", help="checkpoint: do not fsync each save")
    p.add_argument("--keep-tree", action="store_true", help="also keep the unpacked tree next to the archive")
    p.add_argument(
        "--dry-run", action="store_true", help="fake NVML and a CPU stand-in for the GPU (no torch)"
    )
    p.add_argument("--dry-gpus", type=int, default=1, help="dry run: fake GPUs on the node")
    p.add_argument("--dry-step-ms", type=float, default=20.0, help="dry run: stand-in step time, ms")
    p.add_argument(
        "--dry-ckpt-mb",
        type=float,
        default=8.0,
        help="dry run: checkpoint size, MiB (it may grow to 4 times that)",
    )
    args = p.parse_args(argv)
    args.intervals = sorted({float(x) for x in args.intervals.split(",") if x.strip()}, reverse=True)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad or not args.scenarios:
        p.error(f"unknown scenario(s) {bad}; choose from {', '.join(SCENARIOS)}")
    if not args.intervals or min(args.intervals) <= 0:
        p.error("--intervals must be positive")
    if args.loader_busy >= args.loader_period:
        p.error("--loader-busy must be shorter than --loader-period (else the GPU never waits)")
    if args.dry_run:
        args.ckpt_gb = args.dry_ckpt_mb / 1024
        args.ckpt_max_gb = 4 * args.ckpt_gb
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall0 = time.monotonic()
    rec = Recorder(args)
    planned = (
        sum(
            args.seconds + (0 if s == "healthy" else args.lead_in) + 3 * max(args.intervals)
            for s in args.scenarios
        )
        + args.warmup
    )
    say(
        f"recording {rec.name}: scenarios {', '.join(args.scenarios)}; about {planned:.0f} s of recording"
        f"{' (dry run)' if args.dry_run else ''}"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec.work = Path(tempfile.mkdtemp(prefix="gpu-traces-")) / rec.name
    rec.work.mkdir(parents=True)
    rec.meta = {
        "format": FORMAT_VERSION,
        "name": rec.name,
        "dry_run": args.dry_run,
        "args": {k: v for k, v in vars(args).items()},
        "started": rfc3339(time.time()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "node": args.node,
        "hostname_replaced": not args.keep_hostname,
    }
    try:
        rec.setup()
        rec.calibrate()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - say why, and still leave the archive
        say(f"cannot record: {type(e).__name__}: {e}")
        rec.write_meta({"failed": str(e)})
        saved = rec.archive()
        print(json.dumps({"ok": False, "error": str(e), "archive": str(saved)}), flush=True)
        return 2
    assert rec.ckpt_dir is not None
    if "checkpoint" in args.scenarios and not args.dry_run:
        rec.ckpt_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(rec.ckpt_dir).free
        # Two files exist at once (the new save, the previous one being deleted), plus a margin.
        rec.ckpt_cap_gb = max(0.5, min(rec.ckpt_cap_gb, free / GIB / 2.5))
        if rec.ckpt_gb > rec.ckpt_cap_gb:
            rec.ckpt_gb = rec.ckpt_cap_gb
            say(f"checkpoint state cut to {rec.ckpt_gb:.1f} GiB: {free / GIB:.1f} GiB free at {rec.ckpt_dir}")
    rec.meta.update(
        {
            "nvml": {
                "api": rec.nvml.kind,
                "first_error": rec.nvml.first_error,
                "tolerated": rec.nvml.tolerant.tolerated if rec.nvml.tolerant else {},
                "preflight_s": round(rec.nvml.preflight_s, 3),
            },
            "host_source": {"enabled": rec.host_ok, "error": rec.host_error},
            "backend": {"kind": rec.backend.kind, **rec.backend.describe()},
            "gpu_index": rec.gpu_index,
            "checkpoint": {
                "dir": str(rec.ckpt_dir),
                "fs": fs_type(rec.ckpt_dir.parent if not rec.ckpt_dir.exists() else rec.ckpt_dir),
                "gb": rec.ckpt_gb,
                "cap_gb": rec.ckpt_cap_gb,
                "fsync": not args.no_fsync,
            },
        }
    )
    summary: dict[str, Any] = {}
    failed: dict[str, str] = {}
    try:
        for name in args.scenarios:
            try:
                res = rec.run_scenario(name)
            except Exception as e:  # noqa: BLE001 - one scenario failing must not cost the others
                failed[name] = traceback.format_exc(limit=8)
                say(f"scenario {name} FAILED: {type(e).__name__}: {e}")
                rec.write_meta({"failed_scenarios": failed})
                rec.archive()
                continue
            bundles = rec.write_scenario(res)
            summary[name] = {
                "run_id": res.run_id,
                "start": rfc3339(res.t0),
                "end": rfc3339(res.t_end),
                "seconds": round(res.t_end - res.t0, 3),
                "steps": res.steps,
                "events": len(res.log.events),
                "incidents": [i["kind"] for i in res.incidents],
                "processes": res.processes,
                "bundles": bundles,
            }
            rec.write_meta(
                {
                    "scenarios": summary,
                    "nvml_tolerated_now": rec.nvml.tolerant.tolerated if rec.nvml.tolerant else {},
                }
            )
            rec.archive()
            for label, b in bundles.items():
                say(
                    f"  {name}/{label}: {b['ticks']} ticks, {b['gpu_rows']} GPU rows, {b['host_rows']} host rows, "
                    f"spacing {b['spacing_s_median']:.3f} s, collect median {b['collect_s_median'] * 1000:.1f} ms, "
                    f"{b['skipped']} skipped, {b['nvml_errors']} NVML errors"
                )
    finally:
        if rec.ckpt_dir is not None and rec.ckpt_dir.name == "ckpt-scratch":
            shutil.rmtree(rec.ckpt_dir, ignore_errors=True)
    rec.write_meta({"finished": rfc3339(time.time()), "wall_s": round(time.monotonic() - wall0, 1)})
    path = rec.archive()
    if args.keep_tree:
        shutil.copytree(rec.work, out / rec.name, dirs_exist_ok=True)
    shutil.rmtree(rec.work.parent, ignore_errors=True)
    size = path.stat().st_size
    say(f"archive {path} ({size / 1e6:.2f} MB)")
    final = {
        "ok": not failed and bool(summary),
        "archive": str(path),
        "archive_bytes": size,
        "dry_run": args.dry_run,
        "failed": sorted(failed),
        "intervals": [interval_label(i) for i in args.intervals],
        "rows": {
            n: {lab: {"gpu": b["gpu_rows"], "host": b["host_rows"]} for lab, b in s["bundles"].items()}
            for n, s in summary.items()
        },
        "events": {n: s["events"] for n, s in summary.items()},
        "incidents": {n: s["incidents"] for n, s in summary.items()},
        "nvml_errors": sum(b["nvml_errors"] for s in summary.values() for b in s["bundles"].values()),
        "tolerated": sorted(rec.nvml.tolerant.tolerated) if rec.nvml.tolerant else [],
        "seconds": round(time.monotonic() - wall0, 1),
    }
    if rec.meta["modules_missing_on_gpu_machine"]:
        say(f"WARNING: loaded {rec.meta['modules_missing_on_gpu_machine']}, which the GPU machine lacks")
    print(json.dumps(final), flush=True)
    return 0 if final["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
