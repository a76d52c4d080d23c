"""The README's main command works end to end: `gpufleet demo` shows findings and stops cleanly."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql


@pytest.mark.serial
@pytest.mark.timeout(240)
def test_demo_runs_and_shows_incidents(pg_server: str, tmp_path: Path) -> None:
    name = f"gpufleet_demo_test_{secrets.token_hex(4)}"
    env = dict(os.environ, GPUFLEET_DATABASE_URL=pg_server, GPUFLEET_DATA_DIR=str(tmp_path))
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet.cli",
                "demo",
                "--duration",
                "25",
                "--backfill-minutes",
                "12",
                "--api-port",
                "0",
                "--collector-port",
                "0",
                "--database-name",
                name,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "read token Authorization: Bearer gpf_" in out
    assert "web view http://127.0.0.1:" in out
    for kind in (
        "starvation",
        "straggler",
        "checkpoint_stall",
        "throttling",
        "pcie_degraded",
        "host_misconfig",
    ):
        assert f"+ {kind}" in out, f"no {kind} incident shown:\n{out}"
    assert "demo stopped" in out
    assert "Repeated XID errors" in out and "XID 48" in out, out  # the scenario's promise, decoded
    # incident lines cut to the terminal (120 columns when it has none); the commands to copy stay whole
    assert max(len(line) for line in out.splitlines() if line.startswith(("  + ", "  - "))) <= 120
    assert "back-filling the last 12 min" in out
    # money with its currency in the terminal table, the database line for the CLI, and no stale marker
    assert re.search(r"\d+\.\d\d EUR", out), out
    assert "export GPUFLEET_DATABASE_URL='" in out and name in out
    assert not (tmp_path / "demo-database-url").exists()
