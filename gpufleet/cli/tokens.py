"""``gpufleet token`` (also ``tokens``): bearer tokens for agents and readers."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.common import ConfigOpt, DbOpt, connect, fail, psycopg, settings_from
from gpufleet.cli.output import JsonOpt, print_json, print_table

app = typer.Typer(help="Bearer tokens for agents and readers.", no_args_is_help=True)


@app.command("create")
def token_create(
    name: str,
    role: Annotated[str, typer.Option(help="node | progress | finance | sre | admin")],
    node: Annotated[
        str | None,
        typer.Option(help="node name (role node: required; role progress: only runs on that node)"),
    ] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """Create a token and print its secret (shown only now)."""
    from gpufleet.auth import create_token

    with connect(settings_from(config, db)) as conn:
        try:
            secret = create_token(conn, name, role, node)  # type: ignore[arg-type]
        except ValueError as e:
            fail(str(e))
        except psycopg.errors.UniqueViolation:
            fail(f"a token named {name!r} exists")
    typer.echo(secret)


@app.command("revoke")
def token_revoke(name: str, config: ConfigOpt = None, db: DbOpt = None) -> None:
    """Revoke a token by name (refused within seconds everywhere)."""
    from gpufleet.auth import revoke_token

    with connect(settings_from(config, db)) as conn:
        if not revoke_token(conn, name):
            fail(f"no active token named {name!r}")
    typer.echo(f"revoked {name}")


@app.command("list")
def token_list(
    all_: Annotated[bool, typer.Option("--all", help="revoked tokens too")] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    db: DbOpt = None,
) -> None:
    """The tokens by name and role (never their secrets), newest first."""
    from psycopg.rows import dict_row

    with connect(settings_from(config, db)) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT name, role, node, created_at, revoked_at FROM agent_tokens "
            + ("" if all_ else "WHERE revoked_at IS NULL ")
            + "ORDER BY created_at DESC, name"
        ).fetchall()
    if as_json:
        print_json(rows)
        return
    if not rows:
        typer.echo("no tokens" if all_ else "no active tokens (--all lists revoked ones too)")
        return
    print_table(
        ["name", "role", "node", "created", "revoked"],
        [[r["name"], r["role"], r["node"], r["created_at"], r["revoked_at"]] for r in rows],
    )
