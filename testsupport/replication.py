"""A primary and its streaming-replication hot standby of their own, on loopback ports (tests, benchmarks).

The machine's shared server is never touched: both clusters are made with the
Debian PostgreSQL 15 binaries in a temporary directory, the standby by
``pg_basebackup -R`` from the running primary, exactly as an operator makes
one.  PostgreSQL refuses to run as root; as root the servers run as the
``postgres`` account the Debian package created.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from gpufleet.serverthread import free_port

PG_BIN = Path(os.environ.get("GPUFLEET_TEST_PG15_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> str | None:
    """Why the clusters cannot be made here (None: they can)."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup", "postgres"):
        if not (PG_BIN / tool).exists():
            return f"{PG_BIN / tool} is missing (Debian package postgresql-15)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' account to run the servers as"
    return None


def _as_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    pw = pwd.getpwnam("postgres")
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


@dataclass
class Server:
    data: Path
    port: int
    sockets: Path

    def run(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            [str(PG_BIN / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.sockets,
            check=False,
            **_as_user(),
        )
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
        return out.stdout

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.data.parent / f"{self.data.name}.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        try:
            self.run("pg_ctl", "-D", str(self.data), "status")
            return True
        except RuntimeError:
            return False


@dataclass
class Pair:
    primary: Server
    standby: Server

    def wait_replayed(self, database: str = "postgres", timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary had written when this was called."""
        with psycopg.connect(self.primary.url(database), autocommit=True) as p:
            target = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        while True:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.standby.url(database), autocommit=True) as s,
            ):
                if s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:  # type: ignore[index]
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby did not replay up to {target} within {timeout} s")
            time.sleep(0.1)


@contextlib.contextmanager
def primary_and_standby() -> Iterator[Pair]:
    root = Path(tempfile.mkdtemp(prefix="gpufleet-replica-", dir="/tmp"))
    user = _as_user()
    if user:
        os.chown(root, user["user"], user["group"])
    primary = Server(root / "primary", free_port(), root)
    standby = Server(root / "standby", free_port(), root)
    try:
        primary.run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=utf8",
            "--no-instructions",
        )
        with open(primary.data / "postgresql.conf", "a") as f:
            f.write(
                f"\nlisten_addresses = '127.0.0.1'\nport = {primary.port}\nunix_socket_directories = '{root}'\n"
                "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nhot_standby_feedback = on\n"
                "shared_buffers = '32MB'\nfsync = off\nmax_connections = 60\n"
            )
        primary.start()
        primary.run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(standby.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        with open(standby.data / "postgresql.conf", "a") as f:  # the copied settings, another port
            f.write(f"\nport = {standby.port}\n")
        standby.start()
        yield Pair(primary, standby)
    finally:
        for s in (standby, primary):
            if s.data.exists() and s.running():
                with contextlib.suppress(RuntimeError):
                    s.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
