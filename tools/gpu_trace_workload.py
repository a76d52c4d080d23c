"""The workload a GPU trace recording measures: the training backends, the training loop, the CPU-bound
loader and the training process's own log of what it injected.

Imported by ``tools/record_gpu_traces.py``, which schedules the scenarios, samples the GPU and the host,
and writes the bundles; it is found beside that script (its folder is on ``sys.path``), and the decode
worker processes import it by this name.  ``torch`` is imported only by :class:`TorchBackend`, ``numpy``
only by the dry run's stand-in and the decode workers.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.collector.bundle_files import rfc3339_ms


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- event log


class EventLog:
    """The training process's own record of what it injected, written as it happens."""

    def __init__(self, path: Path, scenario: str) -> None:
        self.path = path
        self.scenario = scenario
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._f = path.open("w", encoding="utf-8")

    def add(self, event: str, start: float, end: float | None, /, **detail: Any) -> dict[str, Any]:
        ev = {"scenario": self.scenario, "type": event, "start": start, "end": end, "detail": detail}
        with self._lock:
            self.events.append(ev)
            self._f.write(json.dumps(ev) + "\n")
            self._f.flush()
        dur = f"{end - start:.3f} s" if end is not None else "open"
        say(
            f"  event {event}: {rfc3339_ms(start, always_ms=True)} +{dur} {json.dumps(detail) if detail else ''}"
        )
        return ev

    def close(self) -> None:
        with self._lock:
            self._f.close()


# --------------------------------------------------------------------------- training backends


def timed_write(path: Path, write: Callable[[Any], None], fsync: bool) -> dict[str, Any]:
    """A checkpoint write as a training job makes it: serialise and write,
    then (optionally) wait for the disk; each part timed."""
    t0 = time.monotonic()
    with path.open("wb") as f:
        write(f)
        f.flush()
        t1 = time.monotonic()
        if fsync:
            os.fsync(f.fileno())
    t2 = time.monotonic()
    return {
        "bytes": path.stat().st_size,
        "serialize_write_s": round(t1 - t0, 3),
        "fsync_s": round(t2 - t1, 3),
    }


class TorchBackend:
    """bf16 MLP training on ``cuda:0`` with a pinned-memory input pipeline."""

    kind = "torch"

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise SystemExit("torch sees no CUDA device (use --dry-run for a CPU rehearsal)")
        self.dev = torch.device("cuda", 0)
        dim, batch = args.dim, args.batch
        mods: list[Any] = []
        for i in range(args.layers):
            mods.append(torch.nn.Linear(dim, dim, bias=False, device=self.dev, dtype=torch.bfloat16))
            if i < args.layers - 1:
                mods.append(torch.nn.GELU())
        self.model = torch.nn.Sequential(*mods)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        self.pinned = True
        self.host_batches = []
        for _ in range(2):
            x = torch.randn(batch, dim, dtype=torch.bfloat16)
            try:
                x = x.pin_memory()
            except RuntimeError:
                self.pinned = False
            self.host_batches.append(x)
        self.flops_per_step = 3 * 2 * batch * dim * dim * args.layers
        self.extra: list[Any] = []
        self._i = 0
        props = torch.cuda.get_device_properties(self.dev)
        self.device_name = props.name
        self.device_uuid = None
        try:
            self.device_uuid = str(props.uuid)
        except AttributeError:
            pass

    def busy(self, on: bool) -> None:
        """The GPU's state follows the work itself."""

    def step(self) -> None:
        torch = self.torch
        x = self.host_batches[self._i % 2].to(self.dev, non_blocking=True)
        self._i += 1
        y = self.model(x)
        loss = y.float().square().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize(self.dev)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    def state_bytes(self) -> int:
        n = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for st in self.opt.state.values():
            n += sum(v.numel() * v.element_size() for v in st.values() if hasattr(v, "numel"))
        return n + sum(t.numel() * t.element_size() for t in self.extra)

    def grow_state(self, total_bytes: int) -> int:
        """Add optimizer-sized GPU shards until the checkpoint state is ``total_bytes``."""
        torch = self.torch
        chunk = 512 * 1024 * 1024
        have = self.state_bytes()
        while have + 1 < total_bytes:
            n = min(chunk, total_bytes - have) // 2
            t = torch.empty(n, dtype=torch.bfloat16, device=self.dev).normal_()
            self.extra.append(t)
            have += n * 2
        self.sync()
        return have

    def shrink_state(self, target_bytes: int) -> int:
        """Drop shards until the state is at most ``target_bytes`` (the model and optimizer stay)."""
        while self.extra and self.state_bytes() > target_bytes:
            self.extra.pop()
        return self.state_bytes()

    def drop_state(self) -> None:
        self.extra = []
        self.torch.cuda.empty_cache()

    def save(self, path: Path, fsync: bool) -> dict[str, Any]:
        torch = self.torch
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "shards": {f"shard{i}": t for i, t in enumerate(self.extra)},
        }
        return timed_write(path, lambda f: torch.save(state, f), fsync)

    def describe(self) -> dict[str, Any]:
        torch = self.torch
        return {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "device": self.device_name,
            "device_uuid": self.device_uuid,
            "pinned_host_batches": self.pinned,
        }


class CpuBackend:
    """The dry run's stand-in: a small numpy product plus a sleep per step; fake GPUs loaded while training."""

    kind = "cpu-dry-run"

    def __init__(self, args: argparse.Namespace, fakes: list[Any]) -> None:
        import numpy as np

        self.np = np
        self.step_s = args.dry_step_ms / 1000.0
        self.fakes = fakes
        self.a = np.random.default_rng(0).random((128, 128))
        self.flops_per_step = 2 * 128**3
        self.extra_bytes = 0
        self.device_uuid = None
        self._lock = threading.Lock()

    def busy(self, on: bool) -> None:
        with self._lock:
            for fake in self.fakes:
                g = fake.gpu(0)
                if on:
                    g.load()
                else:
                    g.idle()

    def step(self) -> None:
        self.a = self.a @ self.a
        self.a /= float(self.np.abs(self.a).max()) or 1.0
        time.sleep(self.step_s)

    def sync(self) -> None:
        pass

    def state_bytes(self) -> int:
        return int(self.a.nbytes) + self.extra_bytes

    def grow_state(self, total_bytes: int) -> int:
        self.extra_bytes = max(0, total_bytes - int(self.a.nbytes))
        return self.state_bytes()

    def shrink_state(self, target_bytes: int) -> int:
        self.extra_bytes = max(0, min(self.extra_bytes, target_bytes - int(self.a.nbytes)))
        return self.state_bytes()

    def drop_state(self) -> None:
        self.extra_bytes = 0

    def save(self, path: Path, fsync: bool) -> dict[str, Any]:
        block = os.urandom(1 << 20)
        total = self.state_bytes()

        def write(f: Any) -> None:
            left = total
            while left > 0:
                f.write(block[:left])
                left -= len(block)

        return timed_write(path, write, fsync)

    def describe(self) -> dict[str, Any]:
        return {"step_s": self.step_s, "fake_gpus": "FakeNvml H200 profile"}


Backend = TorchBackend | CpuBackend


# --------------------------------------------------------------------------- the loop


class Trainer:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.step_times: list[float] = []

    def train_for(self, seconds: float) -> int:
        """Train until ``seconds`` have passed; returns the steps done (the GPU is idle on return)."""
        b = self.backend
        b.busy(True)
        end = time.monotonic() + seconds
        steps = 0
        while True:
            s0 = time.monotonic()
            if s0 >= end:
                break
            b.step()
            self.step_times.append(time.monotonic() - s0)
            steps += 1
        b.sync()
        b.busy(False)
        return steps


#: Set in decode worker processes: the loader's stop signal.
_DECODE_STOP: Any = None


def _decode_worker_init(stop: Any) -> None:
    global _DECODE_STOP
    _DECODE_STOP = stop


def burn_cpu(deadline: float) -> int:
    """One decode worker's share of a shard: numpy work until ``deadline`` (CLOCK_MONOTONIC, system-wide)."""
    import numpy as np

    a = np.random.default_rng().random(1 << 16)
    b = np.empty_like(a)
    n = 0
    while time.monotonic() < deadline:
        np.sin(a, out=b)
        np.sqrt(np.abs(b, out=b), out=a)
        a += 0.5
        n += 1
        if n % 16 == 0 and _DECODE_STOP is not None and _DECODE_STOP.is_set():
            break
    return n


class SlowLoader:
    """A CPU-bound input pipeline: each shard takes ``period_s`` of every decode worker and feeds one burst of training.

    Decode runs in worker processes (as DataLoader workers do), so it takes
    CPUs but not the recording threads' interpreter lock.  The pool is started
    before the recording so process start-up is not in the trace.
    """

    def __init__(self, period_s: float, workers: int) -> None:
        import multiprocessing
        from multiprocessing.pool import Pool, ThreadPool

        self.period_s = period_s
        self.workers = workers
        self._mp_stop: Any
        self._pool: Pool
        try:
            ctx = multiprocessing.get_context("spawn")
            self._mp_stop = ctx.Event()
            self._pool = ctx.Pool(workers, initializer=_decode_worker_init, initargs=(self._mp_stop,))
            self.kind = "processes"
        except OSError as e:
            # No process-shared semaphores here: threads still load the CPUs (numpy releases the lock).
            say(f"  note: decode worker processes unavailable ({e}); using threads")
            self._mp_stop = threading.Event()
            _decode_worker_init(self._mp_stop)
            self._pool = ThreadPool(workers)
            self.kind = "threads"
        self._pool.map(burn_cpu, [0.0] * workers, chunksize=1)
        self.q: queue.Queue[int] = queue.Queue(maxsize=1)
        self.stop_event = threading.Event()
        self.log: EventLog | None = None
        self._thread = threading.Thread(target=self._produce, name="slow-loader", daemon=True)

    def start(self, log: EventLog) -> None:
        self.log = log
        self._thread.start()

    def _produce(self) -> None:
        assert self.log is not None
        shard = 0
        while not self.stop_event.is_set():
            t0 = time.time()
            deadline = time.monotonic() + self.period_s
            self._pool.map(burn_cpu, [deadline] * self.workers, chunksize=1)
            cut = self.stop_event.is_set()
            self.log.add(
                "decode", t0, time.time(), shard=shard, workers=self.workers, kind=self.kind, cut=cut
            )
            while not self.stop_event.is_set():
                try:
                    self.q.put(shard, timeout=0.05)
                    break
                except queue.Full:
                    continue
            shard += 1

    def get(self, timeout: float) -> int | None:
        try:
            return self.q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def stop(self) -> None:
        self.stop_event.set()
        self._mp_stop.set()
        self._thread.join(timeout=30)
        self._pool.terminate()
        self._pool.join()
