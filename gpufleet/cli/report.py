"""``gpufleet report``: the finance report of a period, as the API serves it."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, parse_query_time, settings_from


def report(
    since: Annotated[str, typer.Option("--from", help="period start: RFC 3339 with offset, or a date (UTC)")],
    until: Annotated[
        str, typer.Option("--to", help="period end (exclusive): RFC 3339 with offset, or a date")
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format", help="csv | json | focus (a FOCUS 1.1 cost export, as GET /v1/reports/focus.csv)"
        ),
    ] = "csv",
    group_by: Annotated[str | None, typer.Option(help="rows per run | site | team (default run)")] = None,
    runs_only: Annotated[
        bool,
        typer.Option(
            "--runs", help="one row per run, as GET /v1/reports/runs.csv (json: the accounting bodies)"
        ),
    ] = False,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="file (default: stdout)")] = None,
    source: Annotated[str, typer.Option(help="auto | rollup | raw")] = "auto",
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """The finance report of [--from, --to): a row per run (or site or team) and currency, the GPU time no run
    held, and a total per currency, as GET /v1/reports/finance.csv and finance.json (--format focus: the FOCUS
    export of GET /v1/reports/focus.csv, a charge row per run per day).
    """
    from gpufleet.accounting import report_csv, runs_report
    from gpufleet.accounting.lines import SOURCES
    from gpufleet.accounting.report import finance_csv, finance_report

    lo, hi = parse_query_time(since, "from"), parse_query_time(until, "to")
    if hi <= lo:
        fail("--to: must be after --from")
    if fmt not in ("csv", "json", "focus"):
        fail(f"--format: must be csv, json or focus, not {fmt!r}")
    if source not in SOURCES:
        fail(f"--source: must be one of {', '.join(SOURCES)}, not {source!r}")
    if runs_only and group_by is not None:
        fail(
            "--runs and --group-by cannot go together: --runs is one row per run, as GET /v1/reports/runs.csv; "
            "leave out --runs for the finance report grouped by run, site or team"
        )
    group_by = group_by or "run"
    if group_by not in ("run", "site", "team"):
        fail(f"--group-by: must be run, site or team, not {group_by!r}")
    if fmt == "focus":
        from gpufleet.accounting.focus import MAX_DAYS

        if hi - lo > timedelta(days=MAX_DAYS):
            fail(
                f"--to: a FOCUS export (one row per run and day) covers at most {MAX_DAYS} days; export shorter periods"
            )
    s = settings_from(config, db)
    with connect(s) as conn:
        if fmt == "focus":
            from gpufleet.accounting.focus import focus_csv, focus_export

            export = focus_export(
                conn,
                lo,
                hi,
                max_gap_s=s.accounting.max_gap_s,
                source=source,
                gone_after_s=s.accounting.gone_after_s,
            )
            text, count = focus_csv(export), len(export.rows)
        elif runs_only:
            rows = runs_report(conn, lo, hi, max_gap_s=s.accounting.max_gap_s, source=source)
            text = report_csv(rows) if fmt == "csv" else json.dumps(rows, indent=2) + "\n"
            count = len(rows)
        else:
            rep = finance_report(
                conn,
                lo,
                hi,
                group_by=group_by,  # type: ignore[arg-type]
                max_gap_s=s.accounting.max_gap_s,
                source=source,
                gone_after_s=s.accounting.gone_after_s,
            )
            text = finance_csv(rep) if fmt == "csv" else json.dumps(rep.body(), indent=2) + "\n"
            count = len(rep.rows)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {count} rows to {output}", err=True)
