from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.serverthread import serve


@dataclass
class Api:
    url: str
    db: str
    tokens: dict[str, str]

    def client(self, who: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who in self.tokens else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture
def api(db: str, settings: Settings) -> Iterator[Api]:
    with psycopg.connect(db, autocommit=True) as c:
        tokens = {role: create_token(c, role, role) for role in ("admin", "sre", "finance")}
        tokens["node"] = create_token(c, "node-n1", "node", "n1")
    with serve(create_app(db, settings)) as srv:
        yield Api(srv.url, db, tokens)
