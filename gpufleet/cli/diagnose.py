"""``gpufleet diagnose``: the SRE checklist of one node."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

import typer

from gpufleet.cli.common import ConfigOpt, fail, settings_from


def diagnose(
    config: ConfigOpt = None,
    source: Annotated[
        str, typer.Option(help="GPU source: auto | nvml | dcgm | dcgm_exporter | none")
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print the checks as one JSON document")] = False,
    sample: Annotated[
        float, typer.Option(help="seconds between the two readings rates are taken over")
    ] = 2.0,
    proc_root: Annotated[
        Path | None, typer.Option(help="the host's /proc (default: agent.proc_root)")
    ] = None,
    sys_root: Annotated[Path | None, typer.Option(help="the host's /sys (default: agent.sys_root)")] = None,
    fake_nvml: Annotated[
        int | None, typer.Option(hidden=True, help="fake H100s instead of NVML (tests)")
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help="a data set directory to sample for the small-files item (a bounded listing, not a full walk)"
        ),
    ] = None,
    dataset_rate: Annotated[
        float, typer.Option(help="MB/s the data set must be read at, for the files per second it needs")
    ] = 1000.0,
    kernel_log: Annotated[
        str,
        typer.Option(
            help="kernel log to read: auto (/dev/kmsg, dmesg, the journal), none, or a saved log file"
        ),
    ] = "auto",
    dcgm_diag: Annotated[
        int,
        typer.Option(
            help="run dcgmi diag at this level where DCGM is installed (0: do not run; 1 takes seconds, 2 and 3 "
            "take the GPUs for minutes)"
        ),
    ] = 1,
) -> None:
    """Run the SRE checklist on this node; exit 1 when a check fails.

    GPU source, PCIe link against its maximum, clocks-event reasons, NVLink
    against PCIe traffic, CPU governor, the job's CPU quota against the cores
    its GPUs need, GPU NUMA node against the CPUs its processes may run on,
    data-loader workers, iowait, NFS RPC stalls, small files (--dataset),
    memory available, huge pages, swap, XIDs, hung tasks and NFS servers in
    the kernel log, NIC errors and saturation, InfiniBand/RoCE ports, DCGM's
    diagnostic: each with its finding, the number behind it and the decision.
    Every item is listed; one that cannot run here says why (skipped).
    """
    import socket

    from gpufleet.agent.diagnose import report
    from gpufleet.agent.diagnose.run import diagnose as run_diagnose
    from gpufleet.agent.sources.base import Source, SourceError

    if source not in ("auto", "nvml", "dcgm", "dcgm_exporter", "none"):
        fail(f"--source: must be auto, nvml, dcgm, dcgm_exporter or none, not {source!r}")
    if not 0 <= sample <= 60:
        fail("--sample: must be within 0-60 s")
    if not 0 <= dcgm_diag <= 4:
        fail(f"--dcgm-diag: must be a dcgmi diag level 1-4, or 0 not to run it, not {dcgm_diag}")
    if not dataset_rate > 0:
        fail("--dataset-rate: must be above 0 MB/s")
    if dataset is not None and not dataset.exists():
        fail(f"--dataset: {dataset} does not exist")
    from gpufleet.agent.diagnose.kernel_log import FileLog, KernelLog

    klog: KernelLog | Literal["auto"] | None
    if kernel_log in ("auto", "none"):
        klog = None if kernel_log == "none" else "auto"
    elif not Path(kernel_log).is_file():
        fail(f"--kernel-log: must be auto, none or a file, and {kernel_log} is not a file")
    else:
        klog = FileLog(Path(kernel_log))
    s = settings_from(config)
    gpu: Source | None = None
    if fake_nvml or source != "none":
        from gpufleet.agent.sources.registry import UnknownSource, build_source

        agent = (
            s.agent.model_copy(update={"sim": s.agent.sim.model_copy(update={"fake_nvml_gpus": fake_nvml})})
            if fake_nvml
            else s.agent
        )
        name = "fake-nvml" if fake_nvml else "nvml" if source == "auto" else source
        try:
            gpu = build_source(name, agent)
        except (UnknownSource, SourceError, ValueError) as e:
            fail(f"--source {source}: {e}")
    view, checks = run_diagnose(
        gpu,
        proc_root or s.agent.proc_root,
        sys_root or s.agent.sys_root,
        sample,
        s.detect,
        kernel_log=klog,
        dataset=dataset,
        dataset_bytes_s=dataset_rate * 1e6,
        dcgm_level=dcgm_diag,
    )
    host = socket.gethostname()
    if as_json:
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        typer.echo(json.dumps(report.document(checks, view, host, now), indent=1, default=str))
    else:
        typer.echo(report.summary_line(checks, host, view.interval_s))
        typer.echo(report.table(checks))
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)
