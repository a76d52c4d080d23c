"""The API's routes and web pages ask gpufleet.auth's capability table, not role names: change what
a role may do there and every surface follows at once."""

from __future__ import annotations

import httpx
import pytest

from gpufleet import auth
from tests.api.conftest import Api


def test_a_route_refuses_a_role_the_table_no_longer_lets_read(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    with api.client("sre") as c:
        assert c.get("/v1/runs").status_code == 200
        monkeypatch.setitem(auth.CAPABILITIES, "read", frozenset({"admin"}))
        r = c.get("/v1/runs")
        assert r.status_code == 403 and r.json()["detail"] == "role 'sre' may not read"


def test_a_node_reads_its_power_caps_by_capability(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    with api.client("node") as c:
        assert c.get("/v1/nodes/n1/power-caps").status_code == 200
        assert c.get("/v1/nodes/n2/power-caps").status_code == 403
        monkeypatch.setitem(auth.CAPABILITIES, "read_own_node", frozenset())
        r = c.get("/v1/nodes/n1/power-caps")
        assert r.status_code == 403 and r.json()["detail"] == "role 'node' may not read"


def test_web_pages_and_sign_in_follow_the_table(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    with httpx.Client(base_url=api.url, follow_redirects=False, timeout=30) as c:
        assert c.post("/login", data={"token": api.tokens["node"]}).status_code == 401
        monkeypatch.setitem(auth.CAPABILITIES, "sign_in", auth.CAPABILITIES["sign_in"] | {"node"})
        assert c.post("/login", data={"token": api.tokens["node"]}).status_code == 303
    with api.client("sre") as c:
        assert c.get("/runs").status_code == 200
        monkeypatch.setitem(auth.CAPABILITIES, "read", frozenset({"admin"}))
        r = c.get("/runs")
        assert r.status_code == 403 and "Your role (sre) may not open this page." in r.text
