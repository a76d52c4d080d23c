"""Scenario 13: TLS and client certificates, through ``gpufleet collector`` / ``gpufleet api`` themselves.

A client certificate must be signed by the configured CA (else the handshake
fails); when one is presented its node (CN or a DNS name) must be the
token's node, so a token copied off one node is refused from another.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.reliability.conftest import gpu_batch, node_tokens, post, role_token
from testsupport.certs import Pair, TestCA
from testsupport.fleet import Fleet
from testsupport.procs import CollectorProc


def _ctx(ca: Path, client: Pair | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


def _rows(db: str, node: str) -> int:
    with psycopg.connect(db) as c:
        row = c.execute("SELECT count(*) FROM gpu_samples WHERE node = %s", (node,)).fetchone()
    return int(row[0]) if row else -1


def test_mtls_ties_the_certificate_to_the_token_node(
    fresh_db: str, tmp_path: Path, collectors: Callable[..., CollectorProc], figures: dict[str, Any]
) -> None:
    ca = TestCA(tmp_path / "pki")
    other_ca = TestCA(tmp_path / "pki-other", "untrusted CA")
    server = ca.server()
    node_a = ca.client("node-a")
    node_b_san = ca.client("workstation-7", dns=["node-b"])
    forged = other_ca.client("node-a")
    tokens = node_tokens(fresh_db, ["node-a", "node-b"])
    tls = {"certfile": str(server.cert), "keyfile": str(server.key), "client_ca": str(ca.pem)}
    col = collectors(fresh_db, {"tls": {**tls, "client_cert": "optional"}})
    col.start().wait_up(verify=_ctx(ca.pem, None))
    url = col.url
    assert url.startswith("https://")
    got: dict[str, Any] = {}
    # plain HTTP to the TLS port gets no answer
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://") + "/healthz", timeout=3)
    # optional mode: no certificate, token alone
    got["no_cert"] = post(
        url, tokens["node-a"], gpu_batch("tls:1", "node-a"), verify=_ctx(ca.pem, None)
    ).status_code
    # the node's own certificate (CN), and a certificate naming the node in a DNS SAN
    got["own_cert_cn"] = post(
        url, tokens["node-a"], gpu_batch("tls:2", "node-a"), verify=_ctx(ca.pem, node_a)
    ).status_code
    got["own_cert_san"] = post(
        url, tokens["node-b"], gpu_batch("tls:3", "node-b"), verify=_ctx(ca.pem, node_b_san)
    ).status_code
    # node B's certificate with node A's token: refused, nothing stored
    before = _rows(fresh_db, "node-a")
    r = post(url, tokens["node-a"], gpu_batch("tls:4", "node-a"), verify=_ctx(ca.pem, node_b_san))
    got["other_node_cert"] = r.status_code
    assert "certificate" in r.text and tokens["node-a"] not in r.text
    assert _rows(fresh_db, "node-a") == before
    # a certificate from another CA does not get through the handshake
    with pytest.raises(httpx.HTTPError):
        post(url, tokens["node-a"], gpu_batch("tls:5", "node-a"), verify=_ctx(ca.pem, forged))
    got["forged_cert"] = "handshake refused"
    assert (got["no_cert"], got["own_cert_cn"], got["own_cert_san"], got["other_node_cert"]) == (
        200,
        200,
        200,
        403,
    )

    # required mode: no certificate, no connection
    strict = collectors(fresh_db, {"tls": {**tls, "client_cert": "required"}, "leader": False})
    strict.start().wait_up(verify=_ctx(ca.pem, node_a))
    with pytest.raises(httpx.HTTPError):
        post(strict.url, tokens["node-a"], gpu_batch("tls:6", "node-a"), verify=_ctx(ca.pem, None))
    got["required_no_cert"] = "handshake refused"
    got["required_own_cert"] = post(
        strict.url, tokens["node-a"], gpu_batch("tls:7", "node-a"), verify=_ctx(ca.pem, node_a)
    ).status_code
    assert got["required_own_cert"] == 200

    # a real agent ships over mTLS with its node's certificate
    fleet = Fleet(
        {"node-a": tokens["node-a"]},
        url,
        tmp_path / "spools",
        ca_file=ca.pem,
        client_cert=node_a.cert,
        client_key=node_a.key,
    )
    try:
        fleet.start()
        time.sleep(3)
        fleet.stop_sampling()
        fleet.wait_drained(30)
    finally:
        fleet.close()
    got["agent_batches_over_mtls"] = len(fleet.oracle.batches)
    assert got["agent_batches_over_mtls"] > 0

    # the API serves TLS with optional client certificates too
    api = collectors(fresh_db, {"tls": {**tls, "client_cert": "optional"}}, service="api", name="api")
    api.start().wait_up(verify=_ctx(ca.pem, None))
    sre = role_token(fresh_db, "tls-sre", "sre")
    got["api_tls"] = httpx.get(
        api.url + "/v1/runs", headers={"Authorization": f"Bearer {sre}"}, verify=_ctx(ca.pem, node_a)
    ).status_code
    assert got["api_tls"] == 200
    figures.update(got)
