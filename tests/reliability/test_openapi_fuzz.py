"""Scenario 8 (generated part): requests generated from the collector's and the API's own
OpenAPI descriptions, sent to the real apps on loopback with valid tokens, never get a 5xx.

Hypothesis draws each operation's parameters and bodies from its schema
(schemathesis); the request goes out through httpx -- schemathesis's own
``requests`` transport does not run against the urllib3 installed here --
and any 5xx fails the test with the request that caused it.  The budget
(``GPUFLEET_REL_S8_REQUESTS``, 10,000 at full size) is spread over the
operations; generation is derandomised so a failure reproduces.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings

from gpufleet.api.app import create_app as create_api
from gpufleet.collector.app import create_app as create_collector
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from tests.reliability.conftest import knob, node_tokens, role_token
from tests.reliability.web_schema import WEB_SCHEMA, crowded_form_schema, known_schema
from testsupport import remote_write

#: The collector's Prometheus remote write route (POST /api/v1/write) declares its body as binary
#: ``application/x-protobuf``, snappy-compressed as Prometheus sends it.  A generated body goes out
#: as the bytes drawn, snappy-framed and with that Content-Encoding, so it gets past the framing and
#: meets the protobuf decoder and what follows as garbage, truncated and empty messages.  Bodies
#: that are not snappy, wrong media types and well-formed messages: tests/collector/test_remote_write.py.
REMOTE_WRITE_MEDIA = "application/x-protobuf"


def _snappy_framed(ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    raw = value if isinstance(value, bytes) else getattr(value, "data", None)  # format: binary draws bytes
    if not isinstance(raw, bytes):
        raw = str(value).encode(errors="ignore")
    return remote_write.compress(raw)


schemathesis.serializer(REMOTE_WRITE_MEDIA)(_snappy_framed)


def _send(client: httpx.Client, kw: dict[str, Any]) -> httpx.Response:
    """A schemathesis request (``requests``-style keyword arguments) sent with httpx."""
    kw = dict(kw)
    args: dict[str, Any] = {k: kw.pop(k) for k in ("headers", "params", "json", "files") if k in kw}
    if "data" in kw:
        data = kw.pop("data")
        args["content" if isinstance(data, bytes | str) else "data"] = data
    for k in ("cookies", "timeout", "verify", "allow_redirects"):
        kw.pop(k, None)
    method, url = kw.pop("method"), kw.pop("url")
    try:
        return client.request(method, url, **args)
    except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
        # A pooled keep-alive connection the server closed for idleness while the
        # client reused it (a race on a slow machine, not the request's fault): one
        # retry on a fresh connection.  A server that drops the request again fails.
        with httpx.Client(timeout=client.timeout) as fresh:
            return fresh.request(method, url, **args)


def _operations(base: str, schema: dict[str, Any] | None = None) -> list[Any]:
    loaded = (
        schemathesis.openapi.from_url(base + "/openapi.json")
        if schema is None
        else schemathesis.openapi.from_dict(schema)
    )
    return [r.ok() for r in loaded.get_all_operations()]


def _has_inputs(op: Any) -> bool:
    return bool(list(op.iter_parameters()) or op.body)


def _runner(
    client: httpx.Client,
    base: str,
    token: str,
    op: Any,
    examples: int,
    derandomize: bool,
    seen: Counter[int],
    failures: list[str],
) -> Any:
    """A Hypothesis test of one operation: send each generated case, count statuses, note 5xx."""

    @hsettings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=derandomize,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy())
    def run(case: Any) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        if case.media_type == REMOTE_WRITE_MEDIA:
            headers.update({"Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"})
        kw = case.as_transport_kwargs(base_url=base, headers=headers)
        r = _send(client, kw)
        seen[r.status_code] += 1
        if r.status_code >= 500 and len(failures) < 20:
            failures.append(
                f"{r.status_code} {op.label}: {kw.get('url')} params={kw.get('params')} "
                f"body={str(kw.get('json', kw.get('data')))[:300]} -> {r.text[:200]}"
            )

    return run


def _fuzz(
    targets: list[tuple[str, str]], budget: int, schema: dict[str, Any] | None = None
) -> tuple[dict[str, Counter[int]], list[str]]:
    """Spread ``budget`` requests over every operation of every (base URL, token); statuses per operation.
    The operations are the target's own OpenAPI description, or ``schema`` when given."""
    ops = [
        (f"{i}:{base}", token, op)
        for i, (base, token) in enumerate(targets)
        for op in _operations(base, schema)
    ]
    per_op = max(1, budget // max(1, sum(_has_inputs(op) for _, _, op in ops)))
    by_op: dict[str, Counter[int]] = {}
    failures: list[str] = []
    derandomize = os.environ.get("GPUFLEET_REL_S8_RANDOM", "") in ("", "0")
    with httpx.Client(timeout=30, follow_redirects=False) as client:
        for key, token, op in ops:
            i, base = key.split(":", 1)
            seen: Counter[int] = Counter()
            _runner(client, base, token, op, per_op, derandomize, seen, failures)()
            by_op[f"{base.rsplit(':', 1)[-1]}#{i} {op.label}"] = seen
    return by_op, failures


@pytest.fixture
def apps(fresh_db: str, settings: Settings) -> Iterator[tuple[str, str]]:
    with (
        serve(create_collector(fresh_db, settings, run_leader=False)) as col,
        serve(create_api(fresh_db, settings)) as api,
    ):
        yield col.url, api.url


@pytest.mark.timeout(900)
def test_generated_requests_never_get_a_5xx(
    fresh_db: str, apps: tuple[str, str], figures: dict[str, Any]
) -> None:
    budget = int(knob("s8_requests", 3000, 10_000))
    col_url, api_url = apps
    node = node_tokens(fresh_db, ["fuzz-node"])["fuzz-node"]
    # an admin may call every API operation, so the requests get past authorisation
    admin = role_token(fresh_db, "fuzz-admin-token-with-a-long-name", "admin")
    # and the collector's operations again as a Prometheus sender, whose bodies get past the role check
    # of the remote write route (a node token's are refused before they are read)
    prometheus = role_token(fresh_db, "fuzz-prometheus", "remote_write")
    by_op, failures = _fuzz([(col_url, node), (api_url, admin), (col_url, prometheus)], budget)
    total: Counter[int] = Counter()
    for seen in by_op.values():
        total.update(seen)
    figures.update(
        requests=sum(total.values()),
        operations=len(by_op),
        statuses=dict(sorted(total.items())),
        fivexx=sum(n for s, n in total.items() if s >= 500),
        per_operation={k: dict(sorted(v.items())) for k, v in by_op.items()},
    )
    assert not failures, "\n".join(failures)
    # the requests must mostly get past authentication, or this tested little
    assert total[401] < 0.05 * sum(total.values())


@pytest.mark.timeout(900)
def test_generated_web_requests_never_get_a_5xx(
    fresh_db: str, apps: tuple[str, str], figures: dict[str, Any]
) -> None:
    """The web view's pages and forms (outside the OpenAPI, tests/reliability/web_schema.py describes
    them): generated paths, query strings and sign-in forms, as an admin and with a node token (whose
    pages answer 403), never get a 5xx."""
    budget = int(knob("s8_web_requests", 1500, 10_000))
    _, api_url = apps
    admin = role_token(fresh_db, "fuzz-web-admin", "admin")
    node = node_tokens(fresh_db, ["fuzz-web-node"])["fuzz-web-node"]
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as c:
        assert (
            c.post(
                "/v1/runs", json={"run_id": "fuzz-run", "allocations": [{"node": "n1", "gpus": [0]}]}
            ).status_code
            == 201
        )
    by_op, failures = _fuzz([(api_url, admin), (api_url, node)], budget * 4 // 5, WEB_SCHEMA)
    known = known_schema("fuzz-run", [admin, role_token(fresh_db, "fuzz-web-finance", "finance"), node])
    more, more_failures = _fuzz([(api_url, admin)], budget // 6, known)
    by_op.update({f"known {k}": v for k, v in more.items()})
    crowded, crowded_failures = _fuzz([(api_url, admin)], budget // 30, crowded_form_schema())
    by_op.update({f"crowded {k}": v for k, v in crowded.items()})
    failures += more_failures + crowded_failures
    total: Counter[int] = Counter()
    for seen in by_op.values():
        total.update(seen)
    figures.update(
        requests=sum(total.values()),
        operations=len(by_op),
        statuses=dict(sorted(total.items())),
        fivexx=sum(n for s, n in total.items() if s >= 500),
        per_operation={k: dict(sorted(v.items())) for k, v in by_op.items()},
    )
    assert not failures, "\n".join(failures)
    assert total[200] > 0 and total[403] > 0  # admins see pages, node tokens are refused them
    assert total[303] > 1 and total[400] > 0  # signed in; and a bad hours/run id/form refused
