"""A node token adds only what its own node observed; it never rewrites someone else's run or bill.

Probes 1, 2 and 10 of issue 36, and the classes behind them: ending,
extending or reopening runs, moving a start, joining a run past its start,
GPUs shown on another node's inferred run, server labels from node facts,
and how many runs one batch may name.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from gpufleet.store.authority import END_SKEW, REGISTERED_BY
from gpufleet.store.inferred import ENDED_BY
from tests.attacks.conftest import World, at, batch, iso, whole_seconds_ago

NOW = datetime.now(UTC)


def _admin_run_ended_29_days_ago(w: World) -> dict:
    start = NOW - timedelta(days=29, hours=3)
    r = w.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "finished",
            "team": "team-a",
            "site": "eu1",
            "start": iso(start),
            "end": iso(start + timedelta(hours=3)),
            "allocations": [{"node": "node-01", "gpus": list(range(8))}],
        },
    )
    assert r.status_code == 201, r.text
    return w.accounting("finished")


def test_a_node_token_cannot_reopen_an_admins_ended_run(world: World) -> None:
    """Probe 1: PATCH end=now+20h from the node's token answered 200 and billed 720 GPU-hours."""
    before = _admin_run_ended_29_days_ago(world)
    assert before["gpu_hours"] == 24.0
    for end in (NOW + timedelta(hours=20), NOW, NOW - timedelta(days=29)):
        r = world.call("node-01", "patch", "/v1/runs/finished", {"end": iso(end)})
        assert r.status_code == 403 and "scheduler hook" in r.text, r.text
    r = world.call("node-01", "patch", "/v1/runs/finished", {"end": None})
    assert r.status_code == 403
    after = world.accounting("finished")
    assert (after["end"], after["gpu_hours"], after["total_cost"]) == (
        before["end"],
        before["gpu_hours"],
        before["total_cost"],
    )


def test_a_hooks_run_ends_forward_only_and_only_near_its_end(world: World) -> None:
    """The epilog of each node of a job ends the run; the last one sets the end, within END_SKEW of it."""
    r = world.call(
        "node-02",
        "post",
        "/v1/runs",
        {
            "run_id": "job-7",
            "name": "train.sh",
            "start": iso(datetime.now(UTC) - END_SKEW - timedelta(minutes=2)),
            "allocations": [{"node": "node-02", "gpus": [0, 1]}],
        },
    )
    assert r.status_code == 201, r.text
    r = world.call(
        "node-01",
        "post",
        "/v1/runs",
        {"run_id": "job-7", "name": "train.sh", "allocations": [{"node": "node-01", "gpus": [0]}]},
    )
    assert r.status_code == 200, r.text
    first = datetime.now(UTC) - timedelta(seconds=40)
    assert world.call("node-02", "patch", "/v1/runs/job-7", {"end": iso(first)}).status_code == 200
    later = first + timedelta(seconds=30)
    assert world.call("node-01", "patch", "/v1/runs/job-7", {"end": iso(later)}).status_code == 200
    assert datetime.fromisoformat(world.run("job-7")["end"]) == later
    # an epilog arriving late with an earlier time leaves the end where the last node put it
    r = world.call("node-02", "patch", "/v1/runs/job-7", {"end": iso(first)})
    assert r.status_code == 200 and datetime.fromisoformat(r.json()["end"]) == later
    # a node cannot push the end far ahead, nor extend a run that ended long ago
    r = world.call(
        "node-01", "patch", "/v1/runs/job-7", {"end": iso(datetime.now(UTC) + timedelta(hours=20))}
    )
    assert r.status_code == 403
    old_end = datetime.now(UTC) - END_SKEW - timedelta(seconds=10)
    assert world.call("admin", "patch", "/v1/runs/job-7", {"end": iso(old_end)}).status_code == 200
    r = world.call("node-01", "patch", "/v1/runs/job-7", {"end": iso(datetime.now(UTC))})
    assert r.status_code == 403 and "ended" in r.text
    assert datetime.fromisoformat(world.run("job-7")["end"]) == old_end
    # the hook's label is the server's: a node never changes labels, nor joins once the job ran for long
    assert world.run("job-7")["labels"] == {REGISTERED_BY: "node:node-02"}


def test_a_node_joins_another_nodes_job_only_at_its_start(world: World) -> None:
    start = datetime.now(UTC) - timedelta(hours=5)
    r = world.call(
        "node-02",
        "post",
        "/v1/runs",
        {
            "run_id": "job-8",
            "name": "x",
            "start": iso(start),
            "allocations": [{"node": "node-02", "gpus": [0]}],
        },
    )
    assert r.status_code == 201, r.text
    r = world.call(
        "node-01",
        "post",
        "/v1/runs",
        {"run_id": "job-8", "name": "x", "allocations": [{"node": "node-01", "gpus": [0, 1, 2, 3]}]},
    )
    assert r.status_code == 403 and "billed from then" in r.text, r.text
    assert world.run("job-8")["gpu_count"] == 1


def test_another_nodes_old_samples_do_not_move_an_inferred_run_or_join_it(world: World) -> None:
    """Probe 2: node-01's batch naming node-02's inferred run with 13-day-old samples moved its start 13 days
    back and added node-01's GPU, billing team-b for a GPU the run never ran on."""
    t0 = whole_seconds_ago(2 * 3600)
    facts = {"runs": {"job-y": {"name": "job-y", "team": "team-b"}}}
    assert (
        world.ship("node-02", batch("node-02", t0, 20, {0: "job-y", 1: "job-y"}, facts=facts)).status_code
        == 200
    )
    world.infer(t0 + 30)
    before = world.run("job-y")
    assert before["start"] == iso(at(t0)).replace("Z", "+00:00") or datetime.fromisoformat(
        before["start"]
    ) == at(t0)
    old = t0 - 13 * 86400
    r = world.ship("node-01", batch("node-01", old, 2, {3: "job-y"}))
    assert r.status_code == 200, r.text  # the samples are node-01's own: stored
    res = world.infer(t0 + 40)
    assert res.refused == 1
    after = world.run("job-y")
    assert (after["start"], after["allocations"], after["team"]) == (
        before["start"],
        [{"node": "node-02", "gpus": [0, 1]}],
        "team-b",
    )
    ((status, detail),) = world.sql(
        "SELECT status, detail FROM run_sightings WHERE run_id = 'job-y' AND node = 'node-01'"
    )
    assert status == "refused" and "before the run began" in detail
    # and a GPU that turns up an hour into the run is not billed from its start either
    late = t0 + 3600
    assert world.ship("node-01", batch("node-01", late, 2, {4: "job-y"})).status_code == 200
    assert world.infer(late + 10).refused == 1
    assert world.run("job-y")["gpu_count"] == 2


def test_a_new_run_starts_where_most_of_its_gpus_agree(world: World) -> None:
    """One node's old samples cannot pull the start of a run every other GPU began later."""
    t0 = whole_seconds_ago(900)
    assert world.ship("node-01", batch("node-01", t0 - 13 * 86400, 2, {0: "job-z"})).status_code == 200
    assert (
        world.ship("node-02", batch("node-02", t0, 10, {0: "job-z", 1: "job-z", 2: "job-z"})).status_code
        == 200
    )
    res = world.infer(t0 + 20)
    assert res.created == ["job-z"] and res.refused == 1
    run = world.run("job-z")
    assert datetime.fromisoformat(run["start"]) == at(t0)
    assert run["allocations"] == [{"node": "node-02", "gpus": [0, 1, 2]}]


def test_node_facts_never_set_the_servers_labels(world: World) -> None:
    """Probe 10: facts setting gpufleet.ended_by on an inferred run made it never end."""
    t0 = whole_seconds_ago(3600)
    facts = {
        "runs": {
            "job-l": {
                "name": "l",
                "labels": {
                    ENDED_BY: "someone",
                    REGISTERED_BY: "node:x",
                    "gpufleet.io/team": "ml",
                    "owner": "ana",
                },
            }
        }
    }
    assert world.ship("node-01", batch("node-01", t0, 10, {0: "job-l"}, facts=facts)).status_code == 200
    world.infer(t0 + 20)
    run = world.run("job-l")
    assert run["labels"] == {"gpufleet.io/team": "ml", "owner": "ana"}, run["labels"]
    # so the grace rule ends it: no sample for longer than the grace
    res = world.infer(t0 + 10 + 400)
    assert res.ended == ["job-l"]
    assert world.run("job-l")["end"] is not None


def test_a_batch_names_a_bounded_number_of_runs(world: World) -> None:
    """Seen while aiming the probes: one batch carrying 5,000 run ids created 5,000 runs."""
    t0 = whole_seconds_ago(60)
    many = {g: f"r-{g}" for g in range(200)}
    doc = batch("node-01", t0, 1, many)
    doc["gpu"]["run_id"] = [f"r-{i}" for i in range(len(doc["gpu"]["time"]))]
    doc["gpu"]["gpu"] = [i % 8 for i in range(len(doc["gpu"]["time"]))]
    doc["gpu"]["time"] = [t0 + i * 0.001 for i in range(len(doc["gpu"]["time"]))]
    doc["facts"] = {"runs": {f"f-{i}": {"name": "x"} for i in range(100)}}
    r = world.ship("node-01", doc)
    assert r.status_code == 422 and "max_runs_per_batch" in r.text, r.text
    assert world.sql("SELECT count(*) FROM run_sightings") == [(0,)]
    assert world.sql("SELECT count(*) FROM gpu_samples") == [(0,)]


def test_a_progress_token_reports_progress_and_nothing_else(world: World) -> None:
    r = world.call(
        "admin",
        "post",
        "/v1/runs",
        {"run_id": "p-run", "site": "eu1", "allocations": [{"node": "node-01", "gpus": [0]}]},
    )
    assert r.status_code == 201, r.text
    assert (
        world.call("progress", "post", "/v1/runs/p-run/progress", {"tokens": 1000, "steps": 10}).status_code
        == 204
    )
    assert world.sql("SELECT tokens, steps FROM run_progress WHERE run_id = 'p-run'") == [(1000.0, 10.0)]
    for method, path, body in (
        ("get", "/v1/runs", None),
        ("get", "/v1/runs/p-run", None),
        ("patch", "/v1/runs/p-run", {"end": iso(datetime.now(UTC))}),
        ("post", "/v1/runs", {"run_id": "q", "allocations": [{"node": "node-01", "gpus": [1]}]}),
        ("get", "/v1/accounting", None),
        ("get", "/v1/sites", None),
        ("post", "/v1/tokens", {"name": "x", "role": "admin"}),
    ):
        r = world.call("progress", method, path, body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    r = httpx.post(
        world.collector + "/v1/ingest",
        content=b"{}",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {world.tokens['progress']}"},
    )
    assert r.status_code == 403
