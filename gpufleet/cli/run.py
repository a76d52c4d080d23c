"""``gpufleet run``: register a run and its GPUs, and end it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, parse_when, settings_from

app = typer.Typer(help="Runs and their GPU allocations.", no_args_is_help=True)


@app.command("create")
def run_create(
    run_id: Annotated[str | None, typer.Option(help="run id (generated if omitted)")] = None,
    name: Annotated[str | None, typer.Option()] = None,
    site: Annotated[str | None, typer.Option()] = None,
    team: Annotated[str | None, typer.Option()] = None,
    start: Annotated[str | None, typer.Option(help="RFC 3339 or epoch; default now")] = None,
    alloc: Annotated[list[str] | None, typer.Option(help="NODE:GPU,GPU,... (repeatable)")] = None,
    sharing: Annotated[
        str, typer.Option(help="exclusive | time_slice | mps | mig: how the run holds the --alloc GPUs")
    ] = "exclusive",
    share: Annotated[
        float | None,
        typer.Option(help="share of each GPU (time_slice, mps; mig: default the profile's slices of 7)"),
    ] = None,
    mig_profile: Annotated[str | None, typer.Option(help="MIG profile, e.g. 3g.40gb")] = None,
    mig_instance: Annotated[int | None, typer.Option(help="MIG GPU-instance id")] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Register a run and its GPUs (whole, or declared shared: time-slicing, MPS, a MIG instance)."""
    from gpufleet.store.runs import Conflict, Invalid, NotFound, create_run

    allocations = []
    for a in alloc or []:
        node, colon, gpus = a.partition(":")
        try:
            listed = sorted({int(g) for g in gpus.split(",") if g.strip()})
        except ValueError:
            fail(f"--alloc {a!r}: expected NODE:GPU,GPU,...")
        if not node or not colon or not listed:
            fail(f"--alloc {a!r}: expected NODE:GPU,GPU,... (name the GPUs the run holds)")
        entry: dict[str, Any] = {"node": node, "gpus": listed, "sharing": sharing}
        for key, value in (("share", share), ("mig_profile", mig_profile), ("mig_instance", mig_instance)):
            if value is not None:
                entry[key] = value
        allocations.append(entry)
    spec = {
        "run_id": run_id,
        "name": name,
        "site": site,
        "team": team,
        "start": parse_when(start, "start"),
        "allocations": allocations,
    }
    with connect(settings_from(config, db)) as conn:
        try:
            run, _ = create_run(conn, spec)
        except Invalid as e:
            flag = "alloc" if e.field == "allocations" else e.field.replace("_", "-")
            fail(f"--{flag} {e}".replace(f"{e.field}: ", "", 1))
        except (NotFound, Conflict) as e:
            fail(str(e))
    for w in run.pop("warnings", []):
        typer.echo(f"gpufleet: warning: {w}", err=True)
    typer.echo(json.dumps(run, default=str))


@app.command("end")
def run_end(
    run_id: str,
    end: Annotated[str | None, typer.Option(help="RFC 3339 or epoch; default now")] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Mark a run ended."""
    from gpufleet.store.runs import Conflict, NotFound, update_run

    with connect(settings_from(config, db)) as conn:
        try:
            run = update_run(conn, run_id, {"end": parse_when(end, "end") or datetime.now(UTC)})
        except (NotFound, Conflict) as e:
            fail(str(e))
    typer.echo(json.dumps(run, default=str))
