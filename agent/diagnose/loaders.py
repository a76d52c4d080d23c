"""Data-loader workers on the checklist: the process tree of each GPU process, how many workers, how busy.

PyTorch's ``DataLoader(num_workers=N)`` forks N worker processes under the
training process; a GPU starved by its input pipeline shows either no
workers at all (the training process decodes the data itself) or workers that
are all busy the whole time.  For each GPU the processes on it are found by
the GPU source (NVML's compute processes); their descendants are the
workers.  Busyness is CPU time over the interval, per process, in cores (one
core fully used = 1.0), from ``/proc/<pid>/stat`` through psutil.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from gpufleet.agent.diagnose.result import Check, Status, skipped

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

#: A process using at least this share of one core is busy.
BUSY_SHARE = 0.9
#: GPU utilisation below which busy workers are starving the GPU, %.
GPU_WAITS_PCT = 80.0


@dataclass(frozen=True)
class ProcCpu:
    pid: int
    name: str
    #: (pid, create time): a PID reused by another process is another process.
    key: tuple[int, float]
    cpu_s: float


@dataclass(frozen=True)
class TreeSample:
    """One GPU process and its descendants at one instant."""

    root: ProcCpu
    workers: tuple[ProcCpu, ...]


@dataclass
class LoaderView:
    """One GPU process's tree over the interval: CPU per process in cores (None on the first reading)."""

    gpu: int
    pid: int
    name: str
    workers: int
    worker_names: list[str] = field(default_factory=list)
    root_cores: float | None = None
    worker_cores: list[float] | None = None
    error: str | None = None


@contextmanager
def procfs(proc_root: Path) -> Iterator[None]:
    """psutil reads ``/proc``; point it at ``proc_root`` (a host's /proc mounted in a container) meanwhile."""
    old = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(proc_root)
    try:
        yield
    finally:
        psutil.PROCFS_PATH = old


def _cpu(p: psutil.Process) -> ProcCpu:
    with p.oneshot():
        t = p.cpu_times()
        return ProcCpu(p.pid, p.name(), (p.pid, p.create_time()), t.user + t.system)


def sample_tree(pid: int) -> TreeSample:
    """The process and every descendant. Raises psutil.Error when the process is gone or unreadable."""
    proc = psutil.Process(pid)
    root = _cpu(proc)
    workers = []
    for child in proc.children(recursive=True):
        try:
            workers.append(_cpu(child))
        except psutil.NoSuchProcess:
            continue  # exited between the listing and the read
    return TreeSample(root, tuple(workers))


def loader_view(gpu: int, prev: TreeSample | None, curr: TreeSample, interval_s: float | None) -> LoaderView:
    v = LoaderView(
        gpu, curr.root.pid, curr.root.name, len(curr.workers), sorted({w.name for w in curr.workers})
    )
    if prev is None or prev.root.key != curr.root.key or not interval_s or interval_s <= 0:
        return v
    v.root_cores = max(0.0, curr.root.cpu_s - prev.root.cpu_s) / interval_s
    before = {w.key: w.cpu_s for w in prev.workers}
    # A worker that appeared in the interval counts from its start (its CPU time is all in it).
    v.worker_cores = [max(0.0, w.cpu_s - before.get(w.key, 0.0)) / interval_s for w in curr.workers]
    return v


def check_loaders(view: NodeView) -> list[Check]:
    if view.gpu_error is not None or not view.gpus:
        why = view.gpu_error or "no GPU on this node"
        return [skipped("dataloader_workers", "gpus", f"no GPU readings: {why}", "workers")]
    if not any(g.pids for g in view.gpus):
        return [skipped("dataloader_workers", "gpus", "no process runs on the GPUs", "workers")]
    out = []
    util_of = {g.index: g.row.get("util_pct") for g in view.gpus}
    for lv in view.loaders:
        subject = f"gpu{lv.gpu} pid {lv.pid}"
        ev: dict[str, Any] = {
            "pid": lv.pid,
            "name": lv.name,
            "workers": lv.workers,
            "worker_names": lv.worker_names,
            "root_cores": lv.root_cores,
            "worker_cores": lv.worker_cores,
            "gpu_util_pct": util_of.get(lv.gpu),
            "interval_s": view.interval_s,
        }
        if lv.error is not None:
            out.append(
                Check(
                    "dataloader_workers",
                    subject,
                    "unknown",
                    f"process tree not readable: {lv.error}",
                    None,
                    "workers",
                    "",
                    ev,
                )
            )
            continue
        if lv.worker_cores is None or lv.root_cores is None:
            out.append(
                Check(
                    "dataloader_workers",
                    subject,
                    "unknown",
                    f"{lv.workers} worker process(es) under {lv.name}; busyness needs two readings",
                    lv.workers,
                    "workers",
                    "",
                    ev,
                )
            )
            continue
        util = util_of.get(lv.gpu)
        gpu_waits = isinstance(util, int | float) and util < GPU_WAITS_PCT
        busy = [c for c in lv.worker_cores if c >= BUSY_SHARE]
        mean = sum(lv.worker_cores) / len(lv.worker_cores) if lv.worker_cores else 0.0
        ev["busy_workers"] = len(busy)
        ev["mean_worker_cores"] = mean
        if lv.workers == 0:
            if lv.root_cores >= BUSY_SHARE:
                status: Status = "fail" if gpu_waits else "warn"
                out.append(
                    Check(
                        "dataloader_workers",
                        subject,
                        status,
                        f"no worker processes; {lv.name} itself uses {lv.root_cores:.2f} cores",
                        0,
                        "workers",
                        "the training process loads its data itself: give the DataLoader "
                        "workers (num_workers) so decoding runs beside the GPU work",
                        ev,
                    )
                )
            else:
                out.append(
                    Check(
                        "dataloader_workers",
                        subject,
                        "ok",
                        f"no worker processes; {lv.name} uses {lv.root_cores:.2f} cores",
                        0,
                        "workers",
                        "",
                        ev,
                    )
                )
            continue
        text = (
            f"{lv.workers} workers, {len(busy)} busy (mean {mean:.2f} cores each); "
            f"{lv.name} {lv.root_cores:.2f} cores"
        )
        if len(busy) == lv.workers:
            saturated: Status = "fail" if gpu_waits else "warn"
            out.append(
                Check(
                    "dataloader_workers",
                    subject,
                    saturated,
                    text,
                    lv.workers,
                    "workers",
                    "every worker is busy all the time: the input pipeline is CPU-bound; add workers if "
                    "the job's CPU quota has room, or make the transforms cheaper (or move them to the GPU)",
                    ev,
                )
            )
        else:
            out.append(Check("dataloader_workers", subject, "ok", text, lv.workers, "workers", "", ev))
    return out
