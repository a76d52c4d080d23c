"""The collector's ingest asks gpufleet.auth's capability table, not a role name: with ``ingest``
taken from the node role in that table, a node token's shipment is refused and nothing is stored."""

from __future__ import annotations

import pytest

from gpufleet import auth
from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, count, post


def test_a_node_token_is_refused_where_ingest_is_not_its_capability(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert post(collector, batch("a:1")).status_code == 200  # cached now as a token that may ingest
    monkeypatch.setitem(auth.CAPABILITIES, "ingest", frozenset())
    r = post(collector, batch("a:2"))
    assert r.status_code == 403
    assert r.json()["detail"] == "role 'node' may not ingest; use a node token"
    assert count(collector.db) == 8


def test_a_role_granted_ingest_gets_past_the_capability_check(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(auth.CAPABILITIES, "ingest", frozenset({"node", "sre"}))
    r = post(collector, batch("a:1"), who="sre")
    # The sre token names no node, so the next check (the batch's node is the token's) refuses it.
    assert r.status_code == 403
    assert r.json()["detail"] == "this token may write node None only, not 'node-a'"
