from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from gpufleet.auth import create_token
from gpufleet.collector.app import create_app
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import ServerThread, serve


@dataclass
class Collector:
    url: str
    db: str
    server: ServerThread
    tokens: dict[str, str]

    def headers(self, who: str = "node-a", **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **extra}


@pytest.fixture
def collector(db: str, settings: Settings) -> Iterator[Collector]:
    s = settings.model_copy(
        update={
            "ingest": settings.ingest.model_copy(
                update={
                    "max_body_bytes": 1_000_000,
                    "max_decompressed_bytes": 4_000_000,
                    "max_samples_per_batch": 5_000,
                }
            )
        }
    )
    with psycopg.connect(db, autocommit=True) as c:
        tokens = {
            "node-a": create_token(c, "node-a", "node", "node-a"),
            "node-b": create_token(c, "node-b", "node", "node-b"),
            "sre": create_token(c, "sre", "sre"),
            "admin": create_token(c, "admin", "admin"),
        }
    app = create_app(db, s, run_leader=False)
    with serve(app, **server_options(s)) as srv:
        yield Collector(srv.url, db, srv, tokens)
