"""How the reading commands print: a padded table for people, JSON (``--json``) for scripts."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from gpufleet.cli.common import iso_text

JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of a table")]


def as_text(v: Any) -> str:
    """A table cell: ``-`` for nothing, times in RFC 3339, floats short enough to scan a column by eye."""
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return iso_text(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Columns padded to their widest cell, one line per row."""
    cells = [[as_text(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for line in [headers, *cells]:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def print_json(value: Any) -> None:
    typer.echo(
        json.dumps(value, indent=1, default=lambda v: iso_text(v) if isinstance(v, datetime) else str(v))
    )
