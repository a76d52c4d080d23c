"""What is stored and billed stays within what a GPU and a node can physically be.

Probes 3 and 6 of issue 36: one energy counter glitch billed 2.5 TWh, and
5,000 GPU indices from one node made it a 5,000-GPU node for every fleet
report.  What is refused or set aside is counted on the collector's
``/metrics`` for SREs.
"""

from __future__ import annotations

from gpufleet.db.energy_sql import GPU_POWER_CEILING_W
from tests.attacks.conftest import World, at, batch, iso, whole_seconds_ago
from tests.scrape import sample_value


def test_one_counter_glitch_is_not_energy(world: World) -> None:
    """Probe 3: energy_mj 1000, 9e18, 2000, 3000 one second apart at 300 W billed 2,500,000,000 kWh."""
    t0 = whole_seconds_ago(120)
    r = world.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "glitch",
            "site": "eu1",
            "start": iso(at(t0)),
            "end": iso(at(t0 + 3)),
            "allocations": [{"node": "node-01", "gpus": [0]}],
        },
    )
    assert r.status_code == 201, r.text
    doc = batch("node-01", t0, 4, {0: None}, power_w=300.0, energy={0: [1000, 9 * 10**18, 2000, 3000]})
    r = world.ship("node-01", doc)
    assert r.status_code == 200, r.text
    body = world.accounting("glitch")
    # Its own power readings bound it: 300 W for 3 s is 0.00025 kWh; the one honest counter interval says 1 J.
    assert body["gpu_kwh"] <= 300 * 3 / 3.6e6 * 1.01, body["gpu_kwh"]
    assert body["energy_cost"] < 0.01, body
    assert sample_value(world.collector, "gpufleet_ingest_energy_glitches_total", node="node-01") == 1.0


def test_a_counter_jump_beyond_the_ceiling_across_batches_is_not_energy_either(world: World) -> None:
    """The glitch at the first sample of a batch: no batch sees both ends, accounting still refuses it."""
    t0 = whole_seconds_ago(120)
    r = world.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "glitch2",
            "site": "eu1",
            "start": iso(at(t0)),
            "end": iso(at(t0 + 3)),
            "allocations": [{"node": "node-01", "gpus": [0]}],
        },
    )
    assert r.status_code == 201, r.text
    jump = int(GPU_POWER_CEILING_W * 1000 * 1.5)  # 1.5 s of the ceiling in 1 s
    assert (
        world.ship("node-01", batch("node-01", t0, 2, {0: None}, energy={0: [0, 300_000]})).status_code == 200
    )
    assert (
        world.ship(
            "node-01", batch("node-01", t0 + 2, 2, {0: None}, energy={0: [300_000 + jump, 600_000 + jump]})
        ).status_code
        == 200
    )
    body = world.accounting("glitch2")
    assert body["gpu_kwh"] <= 3 * 300 / 3.6e6 * 1.01, body["gpu_kwh"]


def test_gpu_indices_beyond_any_node_are_refused_naming_the_sample(world: World) -> None:
    """Probe 6: two batches naming 5,000 GPU indices made the node a 5,000-GPU node."""
    t0 = whole_seconds_ago(60)
    doc = batch("node-01", t0, 1, {g: None for g in range(5000)})
    r = world.ship("node-01", doc)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["gpu", 256, "gpu"] and "max_gpu_index" in detail["msg"]
    r = world.ship("node-01", batch("node-01", t0, 1, {0: None}, facts={"gpu_count": 5000}))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["facts", "gpu_count"], r.text
    r = world.ship(
        "node-01",
        batch("node-01", t0, 1, {0: None}, facts={"gpus": [{"gpu": 4999, "name": "NVIDIA H100 80GB HBM3"}]}),
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["facts", "gpus", 0, "gpu"], r.text
    assert world.sql("SELECT gpu_count FROM nodes WHERE node = 'node-01'") == [(None,)]
    assert world.sql("SELECT count(*) FROM gpu_samples") == [(0,)]
    assert sample_value(world.collector, "gpufleet_ingest_errors_total", reason="out_of_bounds") == 3.0


def test_a_nodes_gpu_count_comes_from_its_facts_not_from_any_index_once_sent(world: World) -> None:
    t0 = whole_seconds_ago(60)
    # a batch showing 200 GPUs (each within the bound) counts them until the node's next facts ...
    assert world.ship("node-01", batch("node-01", t0, 1, {g: None for g in range(200)})).status_code == 200
    assert world.sql("SELECT gpu_count FROM nodes WHERE node = 'node-01'") == [(200,)]
    # ... which say what the node has
    facts = {"gpu_count": 8, "gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3"} for g in range(8)]}
    assert world.ship("node-01", batch("node-01", t0 + 1, 1, {0: None}, facts=facts)).status_code == 200
    assert world.sql("SELECT gpu_count FROM nodes WHERE node = 'node-01'") == [(8,)]
