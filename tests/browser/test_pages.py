"""What a person sees: the cause in words, links both ways, incident spans on charts, nothing off-screen."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.browser.conftest import Site, signed_in
from tests.surfaces.fleetdb import FilledFleet

#: Every element's right edge against the viewport, and the document's own width.
OVERFLOW_JS = """() => {
  const w = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.querySelectorAll('main table, main figure, main p, main section')) {
    const r = el.getBoundingClientRect();
    if (r.right > w + 0.5) wide.push(el.tagName + ' ' + (el.className || '') + ' ' + Math.round(r.right));
  }
  return {scroll: document.documentElement.scrollWidth, client: w, wide: wide};
}"""


def _open(site: Site, kind: str, run_id: str | None = None) -> dict[str, Any]:
    with psycopg.connect(site.db) as conn:
        row = conn.execute(
            "SELECT id, run_id, node FROM incidents WHERE kind = %s AND state = 'open' "
            "AND (%s::text IS NULL OR run_id = %s) ORDER BY id LIMIT 1",
            (kind, run_id, run_id),
        ).fetchone()
    assert row is not None, kind
    return {"id": row[0], "run_id": row[1], "node": row[2]}


def test_an_incident_page_says_why_with_the_numbers_and_links_its_run_and_node(
    site: Site, browser: Any
) -> None:
    inc = _open(site, "starvation", "demo-vision")
    page = signed_in(browser, site)
    page.goto(f"{site.url}/incidents/{inc['id']}")
    cause = page.locator("#cause").inner_text()
    assert cause.startswith("All 8 GPUs of run demo-vision wait for input"), cause
    assert "CPU-bound" in cause and re.search(r"\d+\.\d cores busy", cause), cause
    costs = page.locator("section:has(h2:text('What it costs'))").inner_text()
    assert "GPU-hours" in costs and "EUR" in costs
    assert "Since" in page.locator("p.facts").inner_text()
    # the run and its node, linked, and back again
    page.click("p.facts >> text=demo-vision")
    assert page.url.endswith("/runs/demo-vision")
    assert page.locator(f"a[href='/incidents/{inc['id']}']").count() >= 1
    assert "CPU-bound" in page.locator("section:has(h2:text('Why it is slow now'))").inner_text()
    page.click("section >> table >> text=h100-03")
    assert page.url.endswith("/nodes/h100-03")
    node_incidents = page.locator("section:has(h2:text('Incidents'))").inner_text()
    assert "Input starvation: CPU-bound" in node_incidents and "demo-vision" in node_incidents
    page.click(f"section:has(h2:text('Incidents')) >> a[href='/incidents/{inc['id']}']")
    assert page.url.endswith(f"/incidents/{inc['id']}")


def test_incident_spans_are_drawn_on_run_and_node_charts(site: Site, browser: Any) -> None:
    inc = _open(site, "starvation", "demo-vision")
    page = signed_in(browser, site)
    for path in ("/runs/demo-vision", "/nodes/h100-03", f"/incidents/{inc['id']}"):
        page.goto(site.url + path)
        charts = page.locator("figure.chart")
        assert charts.count() >= 2, path
        shade = charts.first.locator(f"svg.plot a[href='/incidents/{inc['id']}'] rect.span")
        assert shade.count() == 1, path
        box = shade.bounding_box()
        frame = charts.first.locator("svg.plot rect.frame").bounding_box()
        assert box is not None and frame is not None and box["width"] > 5, path
        assert frame["x"] <= box["x"] and box["x"] + box["width"] <= frame["x"] + frame["width"] + 1, path
        assert "Input starvation" in charts.first.locator("ul.legend li.span-key").first.inner_text(), path


def test_fleet_page_names_runs_and_the_why_of_open_incidents(
    site: Site, browser: Any, fleet: FilledFleet
) -> None:
    page = signed_in(browser, site)
    assert page.url == site.url + "/"
    assert page.locator("meta[http-equiv='refresh']").count() == 1  # live
    incidents = page.locator("section:has(h2:text('Open incidents'))")
    text = incidents.inner_text()
    assert "wait for input" in text and "demo-vision" in text
    assert incidents.locator("a[href='/runs/demo-vision']").count() >= 1
    nodes = page.locator("section:has(h2:text('Nodes')) tbody tr", has_text="h100-03").inner_text()
    assert "demo-vision" in nodes
    page.goto(site.url + "/incidents")
    assert page.locator("meta[http-equiv='refresh']").count() == 1


@pytest.mark.parametrize("width", [1280, 1400])
@pytest.mark.parametrize(
    "path", ["/", "/runs", "/runs/demo-pretrain", "/incidents", "/accounting", "/nodes/h100-01"]
)
def test_nothing_overflows_the_window(site: Site, browser: Any, path: str, width: int) -> None:
    page = signed_in(browser, site, width)
    page.goto(site.url + path)
    got = page.evaluate(OVERFLOW_JS)
    assert got["scroll"] <= got["client"] and got["wide"] == [], (path, got)
    if path in ("/runs", "/accounting"):
        header = page.locator("thead th", has_text="Total cost").bounding_box()
        assert header is not None and header["x"] + header["width"] <= width, path


def test_docs_render_with_swagger_ui_5_offline(site: Site, browser: Any) -> None:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(site.url) else outside.append(r.url))
    page.goto(site.url + "/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    body = page.inner_text("body")
    assert "Unable to render this definition" not in body
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/runs" in paths and "/v1/incidents" in paths
    assert outside == []
