"""A scrape of the collector's ``/metrics`` reads open incidents from the database; while that read
waits (a table locked by a migration or a long report), agents' shipments are still answered, and the
scrape itself is answered within the incident read's statement timeout, marked stale."""

from __future__ import annotations

import threading
import time

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, post


def _fresh(text: str) -> float:
    for fam in text_string_to_metric_families(text):
        if fam.name == "gpufleet_incidents_fresh":
            return fam.samples[0].value
    raise AssertionError("no gpufleet_incidents_fresh in the scrape")


def test_a_scrape_waiting_on_the_database_holds_no_shipment(collector: Collector) -> None:
    assert _fresh(httpx.get(collector.url + "/metrics", timeout=10).text) == 1.0
    time.sleep(5.1)  # past the incident cache, so the next scrape reads the database again
    with psycopg.connect(collector.db) as locker:
        locker.execute("LOCK TABLE incidents IN ACCESS EXCLUSIVE MODE")
        scrape: dict[str, httpx.Response] = {}
        t = threading.Thread(
            target=lambda: scrape.update(r=httpx.get(collector.url + "/metrics", timeout=30))
        )
        t.start()
        time.sleep(0.5)  # the scrape is now waiting on the lock
        assert "r" not in scrape
        t0 = time.monotonic()
        r = post(collector, batch("a:during-scrape"))
        shipped_in = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert httpx.get(collector.url + "/healthz", timeout=5).status_code == 200
        assert shipped_in < 2.0, f"a shipment waited {shipped_in:.1f} s behind a scrape"
        t.join(15)
        assert not t.is_alive(), "the scrape was not answered within the incident read's timeout"
        locker.rollback()
    assert scrape["r"].status_code == 200
    assert _fresh(scrape["r"].text) == 0.0  # answered without the incident set, and says so
