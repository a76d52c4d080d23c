"""Run the checklist once: read the GPU source and the host twice, ``sample_s`` apart, and judge.

The GPU source is any of the agent's (``nvml``, ``dcgm``, ``dcgm_exporter``),
used through its ordinary abilities: ``collect()`` for the rows,
``facts()`` for models, PCI bus ids and NUMA nodes, ``processes()`` for the
PIDs on each GPU.  A source that cannot run here (no driver) is reported as
such and the host checks still run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from gpufleet.agent.diagnose.checks import run_checks
from gpufleet.agent.diagnose.dataset import TARGET_BYTES_S, sample_dataset
from gpufleet.agent.diagnose.dcgm_diag import run_diag
from gpufleet.agent.diagnose.kernel_log import KernelLog
from gpufleet.agent.diagnose.result import Check
from gpufleet.agent.diagnose.view import GpuInput, NodeSampler, NodeView, gpu_inputs
from gpufleet.agent.sources.base import Closeable, FactsSource, Source, SourceError
from gpufleet.detectconfig import DetectorConfig


def read_gpus(source: Source | None) -> tuple[list[GpuInput], str | None]:
    """The GPU source's rows, facts and processes joined per GPU; or why there are none."""
    if source is None:
        return [], "no GPU source (--source none)"
    try:
        reading = source.collect()
        facts: dict[str, Any] = source.facts() if isinstance(source, FactsSource) else {}
        lister = getattr(source, "processes", None)
        processes = lister() if callable(lister) else {}
    except SourceError as e:
        text = str(e)
        return [], text if text.startswith(f"{source.name}:") else f"{source.name}: {text}"
    return gpu_inputs(reading.gpus, facts, processes), None


def diagnose(
    source: Source | None,
    proc_root: Path | str = "/proc",
    sys_root: Path | str = "/sys",
    sample_s: float = 2.0,
    cfg: DetectorConfig | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    *,
    kernel_log: KernelLog | Literal["auto"] | None = "auto",
    dataset: Path | None = None,
    dataset_bytes_s: float = TARGET_BYTES_S,
    dcgm_level: int = 1,
    dcgmi: str = "dcgmi",
) -> tuple[NodeView, list[Check]]:
    """Two samples ``sample_s`` apart; the checks judge the second (rates over the interval).

    ``kernel_log``: where the kernel log is read (``auto``: /dev/kmsg, dmesg, the journal; None: not read).
    ``dataset``: a data set to sample for the small-files item.  ``dcgm_level``: the ``dcgmi diag`` level to
    run (0: none).
    """
    sampler = NodeSampler(proc_root, sys_root, clock, kernel_log=kernel_log)
    try:
        gpus, error = read_gpus(source)
        sampler.sample(gpus, error, source.name if source is not None else None)
        sleep(max(0.0, sample_s))
        gpus, error = read_gpus(source) if error is None else ([], error)
        view = sampler.sample(gpus, error, source.name if source is not None else None)
        if dataset is not None:
            view.dataset = sample_dataset(dataset, target_bytes_s=dataset_bytes_s)
        if dcgm_level > 0:
            view.dcgm_diag = run_diag(dcgm_level, dcgmi, "diagnose")
        else:
            view.dcgm_diag_skip = "not asked for (--dcgm-diag 0)"
    finally:
        if isinstance(source, Closeable):
            try:
                source.close()
            except SourceError:
                pass
    return view, run_checks(view, cfg)
