"""Signing in to the web view with a token as people paste it."""

from __future__ import annotations

import httpx
import pytest

from gpufleet.api.web.session import bearer_secret
from tests.api.conftest import Api


@pytest.mark.parametrize("pasted", ["{t}", "Bearer {t}", "  bearer   {t}\n", "BEARER {t}"])
def test_a_pasted_bearer_prefix_signs_in(api: Api, pasted: str) -> None:
    with httpx.Client(base_url=api.url, follow_redirects=False, timeout=30) as c:
        r = c.post("/login", data={"token": pasted.format(t=api.tokens["sre"])})
        assert r.status_code == 303, r.text
        assert r.cookies["gpufleet_token"] == api.tokens["sre"]  # the secret alone, never the prefix


def test_a_bad_token_behind_the_prefix_is_still_refused(api: Api) -> None:
    with httpx.Client(base_url=api.url, follow_redirects=False, timeout=30) as c:
        r = c.post("/login", data={"token": "Bearer gpf_not-a-token"})
        assert r.status_code == 401 and "not valid" in r.text
        r = c.post("/login", data={"token": "Bearer"})
        assert r.status_code == 401


def test_bearer_secret_only_strips_the_scheme() -> None:
    assert bearer_secret("gpf_abc") == "gpf_abc"
    assert bearer_secret("Bearer gpf_abc") == "gpf_abc"
    assert bearer_secret("Bearer") == "Bearer"  # nothing after the scheme: judged as typed
    assert bearer_secret("Bearerish gpf_abc") == "Bearerish gpf_abc"
