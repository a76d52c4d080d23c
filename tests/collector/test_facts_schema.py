"""Node facts have a typed schema: checked at ingest (422 naming the field,
nothing written), and read through that type everywhere, so one node's bad
facts fail at most that node's result — never a report, a page or a sweep."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gpufleet.accounting.efficiency import gpu_models
from gpufleet.api.app import create_app as create_api
from gpufleet.auth import create_token
from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.host_misconfig import detect
from gpufleet.config import Settings
from gpufleet.facts import NodeFacts
from gpufleet.serverthread import serve
from tests.accounting.builders import constant_power, drain, gpu_samples, node, run, site
from tests.collector.conftest import Collector
from tests.collector.test_ingest import batch, count, post
from tests.detectors.builders import GpuSpec, run_window, steady

GOOD_FACTS = {
    "hostname": "node-a",
    "kernel": "6.8.0",
    "cpu_count": 64,
    "cpu_governor": "performance",
    "cpu_governors": {"performance": 64},
    "cpu_quota_cores": None,
    "driver_version": "580.105.08",
    "gpu_count": 8,
    "gpus": [
        {
            "gpu": i,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-{i}",
            "lost": False,
            "pcie_gen_max": 5,
            "numa_node": 0,
        }
        for i in range(8)
    ],
    "a_key_from_a_newer_agent": {"nested": [1, 2.5, "x", None, True]},
}


@pytest.mark.parametrize(
    "facts,loc",
    [
        ({"gpus": 1}, ["facts", "gpus"]),
        ({"cpu_quota_cores": "lots"}, ["facts", "cpu_quota_cores"]),
        ({"cpu_quota_cores": math.inf}, ["facts", "cpu_quota_cores"]),
        ({"gpus": [{"gpu": 0, "name": 7}]}, ["facts", "gpus", 0, "name"]),
        ({"gpus": [{"gpu": True}]}, ["facts", "gpus", 0, "gpu"]),
        ({"gpu_count": "8"}, ["facts", "gpu_count"]),
        ({"cpu_governors": {"performance": -1}}, ["facts", "cpu_governors", "performance"]),
        ({"bf16_dense_peak_flops": 0}, ["facts", "bf16_dense_peak_flops"]),
        ({"cpu_max": "lots"}, ["facts", "cpu_max"]),
        ({"unknown": "a\x00b"}, ["facts", "unknown"]),
        ({"unknown": b"\x00"}, ["facts", "unknown"]),
    ],
)
def test_bad_facts_are_422_naming_the_field_and_nothing_is_written(
    collector: Collector, facts: dict[str, Any], loc: list[Any]
) -> None:
    doc = {**batch("a:1"), "facts": facts}
    r = post(collector, doc)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    assert count(collector.db) == 0 and count(collector.db, "ingest_batches") == 0
    assert count(collector.db, "nodes") == 0


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_good_facts_and_unknown_keys_are_stored(collector: Collector, fmt: str) -> None:
    r = post(collector, {**batch("a:1"), "facts": GOOD_FACTS}, fmt=fmt)
    assert r.status_code == 200, r.text
    with psycopg.connect(collector.db) as c:
        stored = c.execute("SELECT facts FROM nodes WHERE node = 'node-a'").fetchone()[0]  # type: ignore[index]
    assert stored == GOOD_FACTS
    assert NodeFacts.read(stored).gpu_model_of(3) == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "bad",
    [
        {"gpus": 1},
        {"gpus": [1, "x", None]},
        {"gpu_model": 5, "bf16_dense_peak_flops": "fast"},
        [1, 2],
        "text",
        {"gpus": [{"gpu": "zero", "name": ["H100"]}]},
    ],
)
def test_stored_bad_facts_read_as_unknown_for_that_node_only(bad: Any) -> None:
    f = NodeFacts.read(bad)
    assert f.gpu_model_of(0) is None and f.bf16_dense_peak_flops is None
    # a good field beside a bad one survives
    if isinstance(bad, dict):
        assert NodeFacts.read({**bad, "cpu_count": 8}).cpu_count == 8


def test_one_bad_gpu_entry_drops_that_entry_only() -> None:
    f = NodeFacts.read({"gpus": [{"gpu": 0, "name": "A100"}, {"gpu": "x"}, {"gpu": 2, "name": "H100"}]})
    assert (f.gpu_model_of(0), f.gpu_model_of(1), f.gpu_model_of(2)) == ("A100", None, "H100")


def test_host_misconfig_survives_one_nodes_bad_facts() -> None:
    # n0 stored "cpu_quota_cores": "lots" (before ingest checked facts) and has an
    # XID burst; n1 runs powersave.  Both findings must still come out.
    specs = [GpuSpec(steady(0.9)) for _ in range(16)]
    w = run_window(
        specs,
        facts={"n0": {"cpu_quota_cores": "lots", "gpu_count": "eight"}, "n1": {"cpu_governor": "powersave"}},
    )
    w.gpus[("n0", 3)].cols["xid"][[100, 250, 400]] = [79, 79, 79]
    found = {(f.node, f.gpu, f.cause) for f in detect(w, DetectorConfig())}
    assert found == {("n0", 3, "repeated_xid"), ("n1", None, "cpu_governor")}


# -- the API: reports, accounting and pages with one node's bad facts -----------------------


@pytest.fixture
def api(db: str, settings: Settings) -> Iterator[tuple[str, str, str]]:
    with psycopg.connect(db, autocommit=True) as c:
        finance = create_token(c, "finance", "finance")
        admin = create_token(c, "admin", "admin")
    with serve(create_api(db, settings)) as srv:
        yield srv.url, finance, admin


def _fleet_with_bad_facts(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "eu1", pue=1.2, price=0.2, gpu_hour=2.0, currency="EUR", carbon=300.0)
        node(conn, "n1", 8, "eu1", facts={"gpus": 1})  # the repro
        node(conn, "n2", 8, "eu1", facts={"gpu_model": "NVIDIA H100 80GB HBM3", "cpu_quota_cores": "lots"})
        run(conn, "r1", 0, 3600, {"n1": [0, 1]}, site_name="eu1", team="lm", params=7_000_000_000)
        run(conn, "r2", 0, 3600, {"n2": [0]}, site_name="eu1", team="cv", params=7_000_000_000)
        gpu_samples(conn, constant_power("n1", range(2), 400.0, 0, 3600, step_s=20))
        gpu_samples(conn, constant_power("n2", range(1), 400.0, 0, 3600, step_s=20))
        drain(conn)
        models = gpu_models(conn, [("n1", 0), ("n2", 0)])
    assert models[("n1", 0)].model is None and models[("n1", 0)].flops is None
    assert models[("n2", 0)].model == "NVIDIA H100 80GB HBM3" and models[("n2", 0)].flops is not None


def test_reports_and_accounting_answer_despite_bad_facts(api: tuple[str, str, str], db: str) -> None:
    import httpx

    _fleet_with_bad_facts(db)
    url, finance, admin = api
    period = {"from": "2026-12-01T09:00:00Z", "to": "2026-12-01T12:00:00Z"}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {finance}"}, timeout=30) as c:
        r = c.get("/v1/reports/runs.csv", params=period)
        assert r.status_code == 200, r.text
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert {row["run_id"] for row in rows} == {"r1", "r2"}
        r = c.get("/v1/accounting", params={**period, "group_by": "run"})
        assert r.status_code == 200, r.text
        r = c.get("/v1/runs/r1/accounting")
        assert r.status_code == 200, r.text
        assert r.json()["efficiency"]["gpu_model"] is None
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as c:
        for page in ("/runs", "/accounting", "/runs/r1"):
            r = c.get(page)
            assert r.status_code == 200, (page, r.status_code, r.text[:300])


def test_facts_json_round_trip_matches_what_was_sent(collector: Collector) -> None:
    # float, int and unicode survive the typed check unchanged
    facts = {"cpu_quota_cores": 2.5, "cpu_count": 3, "hostname": "nœud-α", "x": {"y": [1.0, -2]}}
    assert post(collector, {**batch("a:1"), "facts": facts}, fmt="json", comp=None).status_code == 200
    with psycopg.connect(collector.db) as c:
        stored = c.execute("SELECT facts::text FROM nodes").fetchone()[0]  # type: ignore[index]
    assert json.loads(stored) == facts
