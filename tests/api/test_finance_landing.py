"""A finance token opening ``/`` lands on ``/finance``, the page its role exists for (issue 35 item 8)."""

from __future__ import annotations

import httpx

from tests.api.conftest import Api


def test_a_finance_viewer_opening_the_fleet_page_is_sent_to_finance(api: Api) -> None:
    with httpx.Client(base_url=api.url, timeout=30, follow_redirects=False) as c:
        for how in (
            {"cookies": {"gpufleet_token": api.tokens["finance"]}},
            {"headers": {"Authorization": f"Bearer {api.tokens['finance']}"}},
        ):
            r = c.get("/", **how)  # type: ignore[arg-type]
            assert r.status_code == 303 and r.headers["location"] == "/finance", (how, r.status_code)
            assert c.get("/finance", **how).status_code == 200  # type: ignore[arg-type]
            # a page finance may not see stays a 403 with the way out, not a redirect
            r = c.get("/incidents", **how)  # type: ignore[arg-type]
            assert r.status_code == 403 and "/finance" in r.text
        # the fleet page is still the fleet page for SREs, and the sign-in page for nobody
        assert c.get("/", cookies={"gpufleet_token": api.tokens["sre"]}).status_code == 200
        assert c.get("/").status_code == 303 and c.get("/").headers["location"].startswith("/login")
