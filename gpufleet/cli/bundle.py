"""``gpufleet bundle``: trace bundles made from other tools' logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import fail

app = typer.Typer(help="Trace bundles: make them from other tools' logs.", no_args_is_help=True)


@app.command("import-nvidia-smi")
def bundle_import_nvidia_smi(
    csv_files: Annotated[
        list[Path], typer.Argument(metavar="CSV...", help="nvidia-smi --query-gpu CSV logs")
    ],
    out: Annotated[Path, typer.Option("--out", help="bundle directory to write (new or empty)")],
    node: Annotated[
        list[str], typer.Option("--node", help="host name: once for all files, or once per file")
    ],
    run_id: Annotated[str | None, typer.Option(help="also write a run holding every GPU seen")] = None,
    run_start: Annotated[
        str | None,
        typer.Option(help="the run's start (default: the first sample); without a zone it is read in --tz"),
    ] = None,
    tz: Annotated[
        str, typer.Option(help="zone of times logged without one: UTC, +02:00, Europe/Berlin")
    ] = "UTC",
    gpu_name: Annotated[
        str | None,
        typer.Option(help="GPU model where the logs have no name column, e.g. 'NVIDIA H100 80GB HBM3'"),
    ] = None,
    force: Annotated[bool, typer.Option(help="replace --out if it holds files")] = False,
) -> None:
    """Turn nvidia-smi --query-gpu CSV logs into a trace bundle for `gpufleet replay`.

    Reads --format=csv (units, [N/A]) and csv,noheader,nounits logs behind a
    header line; prints one summary line.  Nothing is written on an error.
    """
    from gpufleet.collector.bundle import BundleError
    from gpufleet.collector.nvsmi_import import import_nvidia_smi, parse_timestamp, parse_zone

    try:
        zone = parse_zone(tz)
    except ValueError as e:
        fail(f"--tz: {e}")
    start = None
    if run_start is not None:
        try:
            start = parse_timestamp(run_start, zone)
        except ValueError as e:
            fail(f"--run-start: {e}")
    try:
        summary = import_nvidia_smi(
            csv_files,
            out,
            node=node,
            run_id=run_id,
            run_start=start,
            tz=zone,
            gpu_name=gpu_name,
            overwrite=force,
        )
    except BundleError as e:
        fail(str(e))
    typer.echo(summary.line())
