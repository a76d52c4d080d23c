"""``gpufleet runs``: the runs as a reader sees them, with their accounting and incidents."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, psycopg, settings_from
from gpufleet.cli.output import JsonOpt, as_text, print_json, print_table
from gpufleet.config import Settings

app = typer.Typer(help="Runs: list them, show one (with its accounting and incidents).", no_args_is_help=True)

STATES = ("pending", "running", "ended", "all")


@app.command("list")
def runs_list(
    state: Annotated[str, typer.Option(help="pending | running | ended | all")] = "all",
    site: Annotated[str | None, typer.Option(help="only runs of this site")] = None,
    limit: Annotated[int, typer.Option(help="newest this many", min=1, max=10000)] = 100,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """The runs, newest first, with their GPUs and open incidents."""
    from gpufleet.store.runs import list_runs

    if state not in STATES:
        fail(f"--state: must be one of {', '.join(STATES)}, not {state!r}")
    with connect(settings_from(config, db)) as conn:
        rows = list_runs(conn, None if state == "all" else state, site, limit=limit)
        open_kinds: dict[str, str] = dict(
            conn.execute(
                "SELECT run_id, string_agg(DISTINCT kind, ',') FROM incidents WHERE state = 'open' AND run_id = ANY(%s) "
                "GROUP BY run_id",
                ([r["run_id"] for r in rows],),
            ).fetchall()
        )
    if as_json:
        print_json(
            [
                {
                    **r,
                    "open_incidents": (open_kinds.get(r["run_id"]) or "").split(",")
                    if open_kinds.get(r["run_id"])
                    else [],
                }
                for r in rows
            ]
        )
        return
    if not rows:
        typer.echo("no runs" + ("" if state == "all" else f" {state}"))
        return
    print_table(
        ["run", "name", "team", "site", "state", "start", "end", "GPUs", "open incidents"],
        [
            [
                r["run_id"],
                r["name"],
                r["team"],
                r["site"],
                r["state"],
                r["start"],
                r["end"],
                r["gpu_count"],
                open_kinds.get(r["run_id"]) or "-",
            ]
            for r in rows
        ],
    )


@app.command("show")
def runs_show(run_id: str, as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """One run: its GPUs, its accounting up to now, and its incidents with their causes."""
    from gpufleet.store.incidents import list_incidents
    from gpufleet.store.runs import NotFound, get_run

    s = settings_from(config, db)
    with connect(s) as conn:
        try:
            run = get_run(conn, run_id)
        except NotFound as e:
            fail(str(e))
        incidents = list_incidents(conn, run_id=run_id, limit=50)
        accounting = _run_accounting(conn, s, run_id)
    if as_json:
        print_json({**run, "accounting": accounting, "incidents": incidents})
        return
    from gpufleet.api.web.cause import explain

    typer.echo(
        f"run {run['run_id']}  {run['name'] or ''}  team {run['team'] or '-'}  site {run['site'] or '-'}  "
        f"{run['state']}"
    )
    typer.echo(
        f"  from {as_text(run['start'])} to {as_text(run['end'])}; {run['gpu_count']} GPUs: "
        + "; ".join(f"{a['node']}:{','.join(str(g) for g in a['gpus'])}" for a in run["allocations"])
    )
    if accounting:
        typer.echo(
            f"  so far: {as_text(accounting.get('gpu_hours'))} GPU-hours, {as_text(accounting.get('facility_kwh'))}"
            f" kWh, {as_text(accounting.get('co2e_kg'))} kg CO2e, {as_text(accounting.get('total_cost'))} "
            f"{accounting.get('currency') or ''}"
        )
    for i in incidents:
        ex = explain(i)
        typer.echo(f"  #{i['id']} {i['state']:<8} {i['severity']:<8} {ex.title}: {ex.sentence}")


def _run_accounting(conn: psycopg.Connection, s: Settings, run_id: str) -> dict[str, Any] | None:
    from gpufleet.accounting import account_runs, load_runs

    rows = account_runs(
        conn, load_runs(conn, [run_id]), now=datetime.now(UTC), max_gap_s=s.accounting.max_gap_s
    )
    return dict(rows[0]) if rows else None
