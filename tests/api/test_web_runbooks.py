"""Every alert's runbook_url points at a section of /runbooks that exists."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import yaml

from gpufleet.api.web.runbooks import RUNBOOKS
from tests.api.conftest import Api

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "gpufleet.rules.yml"


def test_each_alert_runbook_anchor_is_a_section_served_without_sign_in(api: Api) -> None:
    anchors = {
        m
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        for m in re.findall(r"/runbooks#([a-z_]+)", (r.get("annotations") or {}).get("runbook_url", ""))
    }
    assert anchors and anchors <= set(RUNBOOKS)
    with httpx.Client(base_url=api.url, timeout=30, follow_redirects=False) as c:
        r = c.get("/runbooks")
        assert r.status_code == 200
        for kind in anchors:
            assert f'<section id="{kind}">' in r.text, kind
