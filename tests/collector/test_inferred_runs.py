"""Runs from attribution: GPU samples naming a run become a run with allocations, over real HTTP
ingest into a real database, and the one-run-per-GPU rule holds for inferred runs as for any."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.store import runs as store
from gpufleet.store.inferred import ENDED_BY, INFERRED_FROM, Inferrer
from gpufleet.wire import encode
from tests.collector.conftest import Collector

GRACE_S = 300.0


def post(c: Collector, doc: dict[str, Any], who: str = "node-a") -> None:
    body, headers = encode(doc)
    r = httpx.post(c.url + "/v1/ingest", content=body, headers={**headers, **c.headers(who)}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stored"


_seq = iter(range(1, 1_000_000))


def samples(
    node: str,
    t0: float,
    seconds: int,
    runs: dict[int, str | None],
    mig: dict[int, int] | None = None,
    facts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One batch: every GPU in ``runs`` once a second for ``seconds``, labelled with its run."""
    rows = [(t0 + s, g, r) for s in range(seconds) for g, r in runs.items()]
    doc: dict[str, Any] = {
        "batch_id": f"{node}:{next(_seq)}",
        "node": node,
        "gpu": {
            "time": [r[0] for r in rows],
            "gpu": [r[1] for r in rows],
            "run_id": [r[2] for r in rows],
            "power_w": [400.0] * len(rows),
            "util_pct": [90.0] * len(rows),
        },
    }
    if mig:
        doc["gpu"]["mig_instance"] = [mig.get(r[1]) for r in rows]
    if facts is not None:
        doc["facts"] = facts
    return doc


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def sightings(db: str) -> dict[tuple[str, str, int], tuple[str, str | None]]:
    with psycopg.connect(db) as c:
        return {
            (r[0], r[1], r[2]): (r[3], r[4])
            for r in c.execute("SELECT run_id, node, gpu, status, detail FROM run_sightings").fetchall()
        }


def run_of(db: str, run_id: str) -> dict[str, Any]:
    with psycopg.connect(db) as c:
        return store.get_run(c, run_id)


def test_samples_naming_a_run_register_it_with_its_gpus_and_end_it_after_the_grace(
    collector: Collector,
) -> None:
    t0 = float(int(time.time()) - 600)  # whole seconds: stored and expected times round alike
    facts = {
        "runs": {
            "ml:llm:3f2a9c1d": {
                "source": "kubernetes",
                "name": "llm",
                "team": "research",
                "labels": {"k8s.namespace": "ml", "k8s.kind": "PyTorchJob"},
            }
        }
    }
    post(
        collector,
        samples("node-a", t0, 30, {0: "ml:llm:3f2a9c1d", 1: "ml:llm:3f2a9c1d", 2: None}, facts=facts),
    )
    post(collector, samples("node-b", t0 + 5, 20, {3: "ml:llm:3f2a9c1d"}), who="node-b")
    got = sightings(collector.db)
    assert set(got) == {
        ("ml:llm:3f2a9c1d", "node-a", 0),
        ("ml:llm:3f2a9c1d", "node-a", 1),
        ("ml:llm:3f2a9c1d", "node-b", 3),
    }
    assert {v[0] for v in got.values()} == {"pending"}
    inf = Inferrer(GRACE_S)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 40))
    assert res.created == ["ml:llm:3f2a9c1d"] and res.allocated == 3 and not res.conflicts
    run = run_of(collector.db, "ml:llm:3f2a9c1d")
    assert run["source"] == "inferred" and run["start"] == at(t0) and run["end"] is None
    assert (run["name"], run["team"]) == ("llm", "research")
    assert run["labels"] == {"k8s.namespace": "ml", "k8s.kind": "PyTorchJob", INFERRED_FROM: "kubernetes"}
    assert run["allocations"] == [{"node": "node-a", "gpus": [0, 1]}, {"node": "node-b", "gpus": [3]}]
    # Not seen for longer than the grace: it ends at its last sample.
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 29 + GRACE_S + 1))
    assert res.ended == ["ml:llm:3f2a9c1d"]
    assert run_of(collector.db, "ml:llm:3f2a9c1d")["end"] == at(t0 + 29)
    # Late samples (a spool drained) that continue it move the end; recent ones that continue it reopen it.
    post(collector, samples("node-b", t0 + 60, 10, {3: "ml:llm:3f2a9c1d"}), who="node-b")
    with psycopg.connect(collector.db, autocommit=True) as conn:
        inf.run_once(conn, at(t0 + 69 + GRACE_S + 1))
        assert store.get_run(conn, "ml:llm:3f2a9c1d")["end"] == at(t0 + 69)
    # After a gap longer than the grace the run is closed: its window and bill stand (issue 36).
    post(collector, samples("node-b", t0 + 69 + GRACE_S + 60, 3, {3: "ml:llm:3f2a9c1d"}), who="node-b")
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 69 + GRACE_S + 70))
    assert not res.reopened and run_of(collector.db, "ml:llm:3f2a9c1d")["end"] == at(t0 + 69)
    post(collector, samples("node-a", t0 + 69 + GRACE_S - 100, 3, {0: "ml:llm:3f2a9c1d"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 69 + GRACE_S + 80))
    assert res.reopened == ["ml:llm:3f2a9c1d"] and run_of(collector.db, "ml:llm:3f2a9c1d")["end"] is None


def test_two_runs_on_one_gpu_at_once_are_a_counted_conflict_and_ingest_goes_on(collector: Collector) -> None:
    t0 = float(int(time.time()) - 300)  # whole seconds: stored and expected times round alike
    # Two MIG instances of GPU 0 worked for two runs at once: allocations are of whole GPUs.
    doc = samples("node-a", t0, 10, {0: "job-a"}, mig={0: 1})
    other = samples("node-a", t0 + 2, 10, {0: "job-b"}, mig={0: 2})
    post(collector, doc)
    inf = Inferrer(GRACE_S)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        assert inf.run_once(conn, at(t0 + 10)).created == ["job-a"]
    post(collector, other)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 12))
        again = inf.run_once(conn, at(t0 + 13))
        stored = conn.execute("SELECT count(*) FROM gpu_samples WHERE run_id = 'job-b'").fetchone()[0]
    assert res.created == [] and len(res.conflicts) == 1
    assert "GPU node-a:0 is held by run 'job-a'" in res.conflicts[0]
    assert again.conflicts == []  # reported once
    status, detail = sightings(collector.db)[("job-b", "node-a", 0)]
    assert status == "conflict" and "'job-a'" in (detail or "")
    with psycopg.connect(collector.db) as c, pytest.raises(store.NotFound):
        store.get_run(c, "job-b")  # no GPU of its own: no run
    assert stored == 10  # the samples were stored all the same


def test_registered_runs_win(collector: Collector) -> None:
    t0 = float(int(time.time()) - 900)  # whole seconds: stored and expected times round alike
    inf = Inferrer(GRACE_S)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        # A Slurm job registered by its prolog, then seen in the samples by its SLURM_JOB_ID.
        store.create_run(
            conn,
            {
                "run_id": "4242",
                "start": at(t0),
                "name": "slurm job",
                "allocations": [{"node": "node-a", "gpus": [0]}],
            },
        )
    post(collector, samples("node-a", t0 + 1, 5, {0: "4242", 1: "4242"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 10))
        run = store.get_run(conn, "4242")
    assert res.explicit == 2 and res.created == []
    assert run["source"] == "registered" and run["allocations"] == [{"node": "node-a", "gpus": [0]}]
    # An inferred run on GPU 2 ...
    post(collector, samples("node-a", t0 + 100, 30, {2: "pod-uid-1"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        assert inf.run_once(conn, at(t0 + 130)).created == ["pod-uid-1"]
        # ... gives way when a registration takes GPU 2 from t0 + 120: it ends there.
        store.create_run(
            conn,
            {"run_id": "api-run", "start": at(t0 + 120), "allocations": [{"node": "node-a", "gpus": [2]}]},
        )
        gave = store.get_run(conn, "pod-uid-1")
        assert gave["end"] == at(t0 + 120) and gave["labels"][ENDED_BY] == "api-run"
    # Later samples of it do not extend it into the registered run.
    post(collector, samples("node-a", t0 + 130, 30, {2: "pod-uid-1"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = inf.run_once(conn, at(t0 + 170))
        assert store.get_run(conn, "pod-uid-1")["end"] == at(t0 + 120) and not res.conflicts
    # An inferred run that began after the registered one's start gives that GPU up (and, holding
    # no other, is gone); registering an inferred run's own id adopts it.
    post(collector, samples("node-a", t0 + 200, 10, {3: "late", 4: "adopt-me"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        assert sorted(inf.run_once(conn, at(t0 + 210)).created) == ["adopt-me", "late"]
        store.update_run(conn, "api-run", {"allocations": [{"node": "node-a", "gpus": [3]}]})
        with pytest.raises(store.NotFound):
            store.get_run(conn, "late")
        run, created = store.create_run(conn, {"run_id": "adopt-me", "name": "adopted", "team": "infra"})
        assert not created and run["source"] == "registered" and run["team"] == "infra"
        assert run["allocations"] == [{"node": "node-a", "gpus": [4]}]
        assert run["start"] == at(t0 + 200)
        # A registered run is ended by whoever registered it, never by the grace rule.
        inf.run_once(conn, at(t0 + 210 + 10 * GRACE_S))
        assert store.get_run(conn, "adopt-me")["end"] is None
    assert sightings(collector.db)[("late", "node-a", 3)][0] == "yielded"


def test_a_node_token_may_adopt_only_inferred_runs_on_its_gpus(collector: Collector) -> None:
    t0 = float(int(time.time()) - 100)  # whole seconds: stored and expected times round alike
    post(collector, samples("node-b", t0, 5, {0: "77"}), who="node-b")
    with psycopg.connect(collector.db, autocommit=True) as conn:
        Inferrer(GRACE_S).run_once(conn, at(t0 + 5))
        with pytest.raises(store.RunAuthorityError):
            store.create_run(
                conn, {"run_id": "77", "allocations": [{"node": "node-a", "gpus": [0]}]}, as_node="node-a"
            )
        run, _ = store.create_run(
            conn, {"run_id": "77", "allocations": [{"node": "node-b", "gpus": [0]}]}, as_node="node-b"
        )
    assert run["source"] == "registered" and run["labels"][store.REGISTERED_BY] == "node:node-b"


def test_run_ids_the_api_refuses_are_not_registered(collector: Collector) -> None:
    t0 = float(int(time.time()) - 100)  # whole seconds: stored and expected times round alike
    post(collector, samples("node-a", t0, 3, {0: "ns/pod"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = Inferrer(GRACE_S).run_once(conn, at(t0 + 3))
    assert res.invalid == 1 and res.created == []
    assert sightings(collector.db)[("ns/pod", "node-a", 0)][0] == "invalid"


def test_a_backlog_of_runs_on_one_gpu_registers_in_time_order(collector: Collector) -> None:
    # A node back after an outage ships two jobs that used GPU 0 one after the other; the later
    # one's id sorts first.  Both register, each ended at its last sample, without a conflict.
    t0 = float(int(time.time()) - 3000)  # whole seconds: stored and expected times round alike
    post(collector, samples("node-a", t0 + 400, 10, {0: "a-second"}))
    post(collector, samples("node-a", t0, 10, {0: "z-first"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = Inferrer(GRACE_S).run_once(conn, at(t0 + 2000))
        assert res.created == ["z-first", "a-second"] and not res.conflicts
        assert store.get_run(conn, "z-first")["end"] == at(t0 + 9)
        assert store.get_run(conn, "a-second")["end"] == at(t0 + 409)


def test_leader_registers_inferred_runs_before_its_sweep(db: str, settings: Any) -> None:
    from gpufleet.collector.leader import Leader
    from gpufleet.collector.metrics import CollectorMetrics

    t0 = float(int(time.time()) - 60)  # whole seconds: stored and expected times round alike
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO run_sightings (run_id, node, gpu, first_seen, last_seen) VALUES "
            "('lead-1', 'n', 0, %s, %s)",
            (at(t0), at(t0 + 50)),
        )
    s = settings.model_copy(update={"detect": settings.detect.model_copy(update={"sweep_interval_s": 0.2})})
    metrics = CollectorMetrics()
    swept: list[float] = []

    def sweep(conn: psycopg.Connection, now: float) -> None:
        if conn.execute("SELECT 1 FROM runs WHERE run_id = 'lead-1'").fetchone():
            swept.append(now)

    leader = Leader(db, s, metrics, sweep=sweep)
    leader.start()
    try:
        deadline = time.monotonic() + 20
        while not swept and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        leader.stop()
    assert swept, "the sweep never saw the inferred run"
    assert metrics.registry.get_sample_value("gpufleet_inferred_runs_total") == 1


def test_a_sighting_is_rewritten_only_when_it_moved_and_the_end_is_still_the_exact_last_sample(
    collector: Collector,
) -> None:
    t0 = float(int(time.time()) - 1000)  # whole seconds: stored and expected times round alike
    post(collector, samples("node-a", t0, 5, {0: "short"}))
    post(collector, samples("node-a", t0 + 5, 5, {0: "short"}))  # 5 s later: not worth a write
    with psycopg.connect(collector.db) as c:
        stored = c.execute("SELECT last_seen FROM run_sightings WHERE run_id = 'short'").fetchone()[0]
    assert stored == at(t0 + 4)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        res = Inferrer(GRACE_S).run_once(conn, at(t0 + 9 + GRACE_S + 1))
        assert res.created == ["short"]
        assert store.get_run(conn, "short")["end"] == at(t0 + 9)  # from the samples themselves


def test_sighting_cache_forgets_what_a_rolled_back_write_would_have_stored() -> None:
    from gpufleet.collector.sightings import SightingCache

    cache = SightingCache(step_s=15)
    key = ("r", "n", 0)
    due = cache.due({key: (100.0, 104.0)})
    assert due == {key: (100.0, 104.0)}
    # Not stored (the transaction rolled back): still due.
    assert cache.due({key: (100.0, 105.0)}) == {key: (100.0, 105.0)}
    cache.stored(due)
    assert cache.due({key: (105.0, 110.0)}) == {}
    assert cache.due({key: (105.0, 119.0)}) == {key: (100.0, 119.0)}
    assert cache.due({key: (90.0, 91.0)}) == {key: (90.0, 104.0)}  # an earlier first sample


def test_late_facts_name_a_running_run_and_a_patched_end_makes_it_registered(collector: Collector) -> None:
    t0 = float(int(time.time()) - 100)  # whole seconds: stored and expected times round alike
    post(collector, samples("node-a", t0, 5, {0: "ns:late:12345678"}))
    inf = Inferrer(GRACE_S)
    with psycopg.connect(collector.db, autocommit=True) as conn:
        inf.run_once(conn, at(t0 + 5))
        assert store.get_run(conn, "ns:late:12345678")["name"] is None
    facts = {
        "runs": {
            "ns:late:12345678": {
                "source": "kubernetes",
                "name": "late",
                "team": "t1",
                "labels": {"k8s.kind": "Job"},
            }
        }
    }
    post(collector, samples("node-a", t0 + 5, 2, {0: "ns:late:12345678"}, facts=facts))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        inf.run_once(conn, at(t0 + 7))
        run = store.get_run(conn, "ns:late:12345678")
        assert (run["name"], run["team"], run["labels"]["k8s.kind"]) == ("late", "t1", "Job")
        run = store.update_run(conn, "ns:late:12345678", {"end": at(t0 + 6)})
        assert run["source"] == "registered"
        inf.run_once(conn, at(t0 + 7))
        assert store.get_run(conn, "ns:late:12345678")["end"] == at(t0 + 6)


def test_any_run_id_text_is_kept_exactly(collector: Collector) -> None:
    t0 = float(int(time.time()) - 100)  # whole seconds: stored and expected times round alike
    odd = 'we"ird\\\\,{x} y'
    post(collector, samples("node-a", t0, 2, {0: odd, 1: "plain"}))
    got = sightings(collector.db)
    assert set(got) == {(odd, "node-a", 0), ("plain", "node-a", 1)}
    with psycopg.connect(collector.db) as c:
        first, last = c.execute(
            "SELECT first_seen, last_seen FROM run_sightings WHERE run_id = %s", (odd,)
        ).fetchone()
        samples_at = c.execute(
            "SELECT min(time), max(time) FROM gpu_samples WHERE run_id = %s", (odd,)
        ).fetchone()
    assert (first, last) == samples_at  # the same instants as the samples, to the microsecond


def test_an_ended_inferred_run_is_not_adopted_with_a_start_after_its_end(collector: Collector) -> None:
    """An admin registering an inferred run's id with a start after the end its samples gave it (and no
    end of its own) is a conflict naming that end, not a run ending before it began."""
    t0 = float(int(time.time()) - 13 * 86400)
    post(collector, samples("node-a", t0, 5, {0: "job-3"}))
    with psycopg.connect(collector.db, autocommit=True) as conn:
        Inferrer(GRACE_S).run_once(conn, datetime.now(UTC))
        ended = store.get_run(conn, "job-3")
        assert ended["source"] == "inferred" and ended["end"] is not None
        with pytest.raises(store.Conflict, match="ended at"):
            store.create_run(
                conn,
                {
                    "run_id": "job-3",
                    "start": datetime.now(UTC),
                    "team": "teamA",
                    "allocations": [{"node": "node-a", "gpus": [1]}],
                },
            )
        assert store.get_run(conn, "job-3") == ended
        # with an end after its start the registration wins, as for any inferred run
        run, created = store.create_run(conn, {"run_id": "job-3", "start": at(t0), "end": at(t0 + 60)})
    assert (
        not created and run["source"] == "registered" and (run["start"], run["end"]) == (at(t0), at(t0 + 60))
    )
