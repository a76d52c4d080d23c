"""``gpufleet replay``: ingest, detectors and accounting over a recorded trace bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, database, fail, psycopg, settings_from


def replay(
    bundle: Annotated[Path, typer.Argument(help="trace bundle directory (docs/contracts.md section 1)")],
    findings: Annotated[Path, typer.Option("--findings", help="FINDINGS.jsonl to write")],
    accounting: Annotated[Path, typer.Option("--accounting", help="ACCOUNTING.json to write")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    quiet: Annotated[bool, typer.Option(help="no progress lines")] = False,
) -> None:
    """Run ingest, every detector and accounting over a recorded trace bundle.

    Without --db the bundle is loaded into a temporary database on the
    configured (or embedded) server, dropped afterwards.
    """
    import contextlib

    from gpufleet.collector.bundle import BundleError
    from gpufleet.collector.replay import findings_jsonl, write_atomic
    from gpufleet.collector.replay import replay as run_replay
    from gpufleet.db import migrate
    from gpufleet.db.connect import with_database
    from gpufleet.db.scratch import scratch_database
    from gpufleet.store.runs import Conflict

    s = settings_from(config)
    say = (lambda _m: None) if quiet else (lambda m: typer.echo(f"replay: {m}", err=True))
    with contextlib.ExitStack() as stack:
        if db:
            url = db
        else:
            server = database(s)
            url = stack.enter_context(scratch_database(with_database(server, "postgres"), "gpufleet_replay"))
        try:
            migrate.upgrade(url, s)
            result = run_replay(url, bundle, s, say)
        except BundleError as e:
            fail(str(e))
        except Conflict as e:
            # Only a database given with --db can already hold the bundle's runs.
            fail(
                f"--db: {e}: the database already holds this bundle's run (or another on its GPUs); replay into "
                "a fresh database (or leave out --db for a temporary one)"
            )
        except psycopg.OperationalError as e:
            fail(f"database: {str(e).strip().splitlines()[0]}")
    write_atomic(findings, findings_jsonl(result.findings))
    write_atomic(accounting, json.dumps(result.accounting, indent=2, default=str) + "\n")
    say(
        f"wrote {len(result.findings)} findings to {findings} and {len(result.accounting)} runs to {accounting}"
    )
