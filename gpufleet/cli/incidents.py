"""``gpufleet incidents``: incidents with their causes in words."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, settings_from
from gpufleet.cli.output import JsonOpt, as_text, print_json, print_table

app = typer.Typer(help="Incidents: list them, show one with its cause in words.", no_args_is_help=True)


@app.command("list")
def incidents_list(
    state: Annotated[str, typer.Option(help="open | resolved | all")] = "open",
    kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
    run: Annotated[str | None, typer.Option(help="only this run's")] = None,
    node: Annotated[str | None, typer.Option(help="only this node's")] = None,
    limit: Annotated[int, typer.Option(help="at most this many", min=1, max=5000)] = 200,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Incidents (open by default), most recent first, each with its cause in one sentence."""
    from gpufleet.api.web.cause import explain
    from gpufleet.store.incidents import list_incidents

    if state not in ("open", "resolved", "all"):
        fail(f"--state: must be open, resolved or all, not {state!r}")
    with connect(settings_from(config, db)) as conn:
        rows = list_incidents(conn, None if state == "all" else state, kind, run, node, limit)
    if as_json:
        print_json([{**r, "cause_text": explain(r).sentence} for r in rows])
        return
    if not rows:
        typer.echo(f"no {state if state != 'all' else ''} incidents".replace("  ", " "))
        return
    print_table(
        ["id", "state", "severity", "kind", "run", "where", "since", "why"],
        [
            [
                r["id"],
                r["state"],
                r["severity"],
                r["kind"],
                r["run_id"],
                f"{r['node']}/{r['gpu']}" if r["gpu"] is not None else r["node"],
                r["start"],
                explain(r).sentence,
            ]
            for r in rows
        ],
    )


@app.command("show")
def incidents_show(
    incident_id: int, as_json: JsonOpt = False, config: ConfigOpt = None, db: DbOpt = None
) -> None:
    """One incident: which job, why (the cause as a sentence and the numbers behind it), since when, and
    what it cost."""
    from gpufleet.accounting.incidents import incident_costs
    from gpufleet.api.web.cause import explain
    from gpufleet.store.incidents import get_incident

    s = settings_from(config, db)
    with connect(s) as conn:
        row = get_incident(conn, incident_id)
        if row is None:
            fail(f"no incident {incident_id}")
        lost = incident_costs(conn, [row], now=datetime.now(UTC), max_gap_s=s.accounting.max_gap_s).get(
            row["id"]
        )
    ex = explain(row)
    if as_json:
        print_json({**row, "lost": lost, "cause_text": ex.sentence, "figures": dict(ex.figures)})
        return
    typer.echo(f"#{row['id']} {ex.title} ({row['severity']}, {row['state']})")
    typer.echo(f"  {ex.sentence}")
    typer.echo(
        f"  run {row['run_id'] or '-'}; since {as_text(row['start'])}"
        + (f", ended {as_text(row['end'])}" if row["end"] else ", still open")
    )
    if lost:
        typer.echo(
            f"  lost so far: {as_text(lost.get('gpu_hours'))} GPU-hours, {as_text(lost.get('facility_kwh'))} kWh, "
            f"{as_text(lost.get('total_cost'))} {lost.get('currency') or ''}"
        )
    for label, value in ex.figures:
        typer.echo(f"    {label}: {value}")
