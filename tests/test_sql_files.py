"""The checked-in SQL of gpufleet/db/sql is what its builders render, every file runs, and it is what is installed.

Migrations and the rollup worker execute these files (``gpufleet.db.sql_files``), not the builders'
constants: a builder changed without ``python tools/render_sql.py`` would leave the files, and so
every database, on the old text while the code that renders reads the new one; a file nothing reads
is a statement nobody runs; and a migrated database's functions must be the files' latest versions,
else a migration installing a file is missing.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import psycopg

from gpufleet.db import accounting_joins_sql, accounting_sql, claim_energy_sql, sql_files

ROOT = Path(__file__).resolve().parents[1]
#: Where the code that executes the files lives (real folders: gpufleet links some of them).
CODE = ("gpufleet", "migrations", "collector", "api", "agent")
FUNCTION = re.compile(r"\A\s*CREATE (?:OR REPLACE )?FUNCTION (\w+)\(.*?\$fn\$(.*)\$fn\$", re.S)
VERSION = re.compile(r"\.v(\d+)\Z")
RETIRED = re.compile(r"\ADROP FUNCTION IF EXISTS (\w+)\(\)\Z")


def load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_sql", ROOT / "tools" / "render_sql.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["render_sql"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_files_are_what_the_builders_render() -> None:
    diffs = load_renderer().differences()
    assert not diffs, (
        "gpufleet/db/sql differs from its builders: run python tools/render_sql.py\n" + "\n".join(diffs[:60])
    )


def test_the_loader_reads_each_statement_as_rendered() -> None:
    """What a migration executes through the loader is the builder's statement, byte for byte."""
    for name, stmt in load_renderer().statements().items():
        if isinstance(stmt, str):
            assert sql_files.text(name) == stmt, name
        else:
            assert sql_files.statements(name) == stmt, name
    # the texts first installed with CREATE, as later steps put them back
    assert sql_files.replacing("gpufleet_claim_energy.v1") == claim_energy_sql.CLAIM_ENERGY_V1_REPLACE
    for name, stmt in (
        ("gpufleet_accounting.v2", accounting_sql.ACCOUNTING_V2),
        ("gpufleet_incident_accounting.v2", accounting_sql.INCIDENT_ACCOUNTING_V2),
    ):
        assert sql_files.replacing(name) == stmt.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    undo = tuple(
        sql_files.text(n)
        for n in ("gpufleet_claim_energy.v2", "gpufleet_accounting.v3", "gpufleet_incident_accounting.v3")
    )
    assert undo == accounting_joins_sql.UNDO


def _string_constants() -> set[str]:
    out: set[str] = set()
    for top in CODE:
        for folder, _dirs, files in os.walk(ROOT / top):
            for f in files:
                if f.endswith(".py"):
                    tree = ast.parse(Path(folder, f).read_text(encoding="utf-8"))
                    out |= {
                        n.value
                        for n in ast.walk(tree)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    }
    return out


def test_every_file_is_used() -> None:
    """Each file is named by the code that executes it (a migration, the rollup worker, a reader)."""
    named = _string_constants()
    unused = [name for name in sql_files.names() if name not in named]
    assert not unused, (
        f"gpufleet/db/sql files nothing executes: {unused} (remove them from tools/render_sql.py)"
    )


def test_installed_functions_are_the_latest_files(conn: psycopg.Connection) -> None:
    latest: dict[str, tuple[int, str, str]] = {}
    for name in sql_files.names():
        m, v = FUNCTION.match(sql_files.text(name)), VERSION.search(name)
        if m and v and int(v.group(1)) >= latest.get(m.group(1), (0, "", ""))[0]:
            latest[m.group(1)] = (int(v.group(1)), name, m.group(2))
    assert {"gpufleet_accounting", "gpufleet_incident_accounting", "gpufleet_claim_energy"} <= set(latest)
    got = dict(
        conn.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", (list(latest),)
        ).fetchall()
    )
    # a function a later migration replaced by another: that migration's upgrade step drops it
    retired = {
        m.group(1)
        for name in sql_files.names()
        if name.endswith(".upgrade")
        for stmt in sql_files.statements(name)
        if (m := RETIRED.match(stmt))
    }
    for fn, (_version, name, body) in sorted(latest.items()):
        if fn in retired and fn not in got:
            continue
        assert fn in got, f"{fn} is not installed: no migration executes {name}.sql"
        assert got[fn] == body, (
            f"{fn}: the database's body differs from {name}.sql (a migration installing it?)"
        )
