"""History is immutable: a node's facts price what comes after them, never a closed period.

Probe 4: a run that ended an hour ago on an H100 (10 EUR a GPU-hour at its site, 2 by default) cost
10 EUR; the node's next batch named that GPU a Tesla T4, and the closed run then cost 2 EUR.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from gpufleet.store.fact_history import facts_at, history
from tests.attacks.conftest import World, batch, iso, whole_seconds_ago

H100 = {"gpu_count": 1, "gpus": [{"gpu": 0, "name": "NVIDIA H100 80GB HBM3"}]}
T4 = {"gpu_count": 1, "gpus": [{"gpu": 0, "name": "Tesla T4"}]}


def test_facts_of_a_later_batch_never_re_price_a_closed_run(world: World) -> None:
    t0 = whole_seconds_ago(30)
    assert world.ship("node-01", batch("node-01", t0, 1, {0: None}, facts=H100)).status_code == 200
    # as if that batch came three hours ago
    world.sql("UPDATE node_facts_history SET valid_from = now() - interval '3 hours' WHERE node = 'node-01'")
    now = datetime.now(UTC)
    r = world.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "closed-h100",
            "site": "eu1",
            "start": iso(now - timedelta(hours=2)),
            "end": iso(now - timedelta(hours=1)),
            "allocations": [{"node": "node-01", "gpus": [0]}],
        },
    )
    assert r.status_code == 201, r.text
    before = world.accounting("closed-h100")
    assert before["compute_cost"] == 10.0 and before["gpu_models"][0]["model"] == "NVIDIA H100 80GB HBM3", (
        before
    )
    # the node's next batch names the GPU a Tesla T4
    assert world.ship("node-01", batch("node-01", t0 + 1, 1, {0: None}, facts=T4)).status_code == 200
    after = world.accounting("closed-h100")
    assert (after["compute_cost"], after["total_cost"], after["gpu_models"]) == (
        before["compute_cost"],
        before["total_cost"],
        before["gpu_models"],
    )
    # what comes after the T4 batch is priced as a T4; the current facts say T4
    with psycopg.connect(world.db) as c:
        assert facts_at(c, "node-01", datetime.now(UTC))["gpus"][0]["name"] == "Tesla T4"
        assert facts_at(c, "node-01", now - timedelta(hours=2))["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
        assert [f["gpus"][0]["name"] for _, f in history(c, "node-01")] == [
            "NVIDIA H100 80GB HBM3",
            "Tesla T4",
        ]
    assert world.sql("SELECT facts->'gpus'->0->>'name' FROM nodes WHERE node = 'node-01'") == [("Tesla T4",)]


def test_facts_that_do_not_price_add_no_history(world: World) -> None:
    """Only the priced part is dated: a node whose governor or checks change writes no history row."""
    t0 = whole_seconds_ago(30)
    for i, governor in enumerate(("performance", "powersave", "ondemand")):
        doc = batch("node-01", t0 + i, 1, {0: None}, facts={**H100, "cpu_governor": governor})
        assert world.ship("node-01", doc).status_code == 200
    assert world.sql("SELECT count(*) FROM node_facts_history WHERE node = 'node-01'") == [(1,)]


def test_a_run_before_a_nodes_first_facts_is_priced_with_its_first_facts(world: World) -> None:
    now = datetime.now(UTC)
    r = world.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "early",
            "site": "eu1",
            "start": iso(now - timedelta(hours=3)),
            "end": iso(now - timedelta(hours=2)),
            "allocations": [{"node": "node-01", "gpus": [0]}],
        },
    )
    assert r.status_code == 201, r.text
    assert (
        world.ship("node-01", batch("node-01", whole_seconds_ago(30), 1, {0: None}, facts=H100)).status_code
        == 200
    )
    assert world.accounting("early")["compute_cost"] == 10.0
