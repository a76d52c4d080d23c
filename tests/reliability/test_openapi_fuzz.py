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
from gpufleet.testing.servers import serve
from tests.reliability.conftest import knob, node_tokens, role_token


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


def _operations(base: str) -> list[Any]:
    return [r.ok() for r in schemathesis.openapi.from_url(base + "/openapi.json").get_all_operations()]


def _has_inputs(op: Any) -> bool:
    return bool(list(op.iter_parameters()) or op.body)


def _runner(client: httpx.Client, base: str, token: str, op: Any, examples: int, derandomize: bool,
            seen: Counter[int], failures: list[str]) -> Any:
    """A Hypothesis test of one operation: send each generated case, count statuses, note 5xx."""

    @hsettings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
               phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def run(case: Any) -> None:
        kw = case.as_transport_kwargs(base_url=base, headers={"Authorization": f"Bearer {token}"})
        r = _send(client, kw)
        seen[r.status_code] += 1
        if r.status_code >= 500 and len(failures) < 20:
            failures.append(f"{r.status_code} {op.label}: {kw.get('url')} params={kw.get('params')} "
                            f"body={str(kw.get('json', kw.get('data')))[:300]} -> {r.text[:200]}")

    return run


def _fuzz(targets: list[tuple[str, str]], budget: int) -> tuple[dict[str, Counter[int]], list[str]]:
    """Spread ``budget`` requests over every operation of every (base URL, token); statuses per operation."""
    ops = [(base, token, op) for base, token in targets for op in _operations(base)]
    per_op = max(1, budget // max(1, sum(_has_inputs(op) for _, _, op in ops)))
    by_op: dict[str, Counter[int]] = {}
    failures: list[str] = []
    derandomize = os.environ.get("GPUFLEET_REL_S8_RANDOM", "") in ("", "0")
    with httpx.Client(timeout=30) as client:
        for base, token, op in ops:
            seen: Counter[int] = Counter()
            _runner(client, base, token, op, per_op, derandomize, seen, failures)()
            by_op[f"{base.rsplit(':', 1)[-1]} {op.label}"] = seen
    return by_op, failures


@pytest.fixture
def apps(fresh_db: str, settings: Settings) -> Iterator[tuple[str, str]]:
    with serve(create_collector(fresh_db, settings, run_leader=False)) as col, \
            serve(create_api(fresh_db, settings)) as api:
        yield col.url, api.url


@pytest.mark.timeout(900)
def test_generated_requests_never_get_a_5xx(fresh_db: str, apps: tuple[str, str], figures: dict[str, Any]) -> None:
    budget = int(knob("s8_requests", 3000, 10_000))
    col_url, api_url = apps
    node = node_tokens(fresh_db, ["fuzz-node"])["fuzz-node"]
    # an admin may call every API operation, so the requests get past authorisation
    admin = role_token(fresh_db, "fuzz-admin-token-with-a-long-name", "admin")
    by_op, failures = _fuzz([(col_url, node), (api_url, admin)], budget)
    total: Counter[int] = Counter()
    for seen in by_op.values():
        total.update(seen)
    figures.update(requests=sum(total.values()), operations=len(by_op), statuses=dict(sorted(total.items())),
                   fivexx=sum(n for s, n in total.items() if s >= 500),
                   per_operation={k: dict(sorted(v.items())) for k, v in by_op.items()})
    assert not failures, "\n".join(failures)
    # the requests must mostly get past authentication, or this tested little
    assert total[401] < 0.05 * sum(total.values())
