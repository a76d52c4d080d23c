"""The file a running ``gpufleet demo`` leaves behind, so the CLI can find its database.

The demo itself (:mod:`gpufleet.sim.demo`) runs the simulator; the CLI's other
commands only need to know where its database is, without importing it.
"""

from __future__ import annotations

from gpufleet.config import Settings

#: Where a running demo leaves its database URL (and pid) for the CLI: ``gpufleet run create``, ``site set``
#: or ``report`` without ``--db`` then talk to the demo's database, as the demo prints.
DEMO_URL_FILE = "demo-database-url"


def demo_database(settings: Settings) -> str | None:
    """The database of a demo running on this machine with these settings, or None."""
    import os

    path = settings.data_dir / DEMO_URL_FILE
    try:
        url, pid = path.read_text(encoding="utf-8").split("\n")[:2]
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return None
    return url


def demo_reader(settings: Settings) -> str | None:
    """The read-only URL over loopback TCP of a running demo's database (Grafana's data source), or None."""
    import os

    path = settings.data_dir / DEMO_URL_FILE
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
        os.kill(int(lines[1]), 0)
    except (OSError, ValueError, IndexError):
        return None
    return lines[2] if len(lines) > 2 and lines[2] else None
