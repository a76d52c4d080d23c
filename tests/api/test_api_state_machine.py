"""Sequences of API calls with random roles (issue 11, "every route answers 4xx for bad input"): a
hypothesis rule-based state machine drives the real API and collector on loopback as admin, sre,
finance, a progress token, three node tokens, no token and a bad token, registering, changing and
ending runs, reporting progress, setting sites (non-finite values included), shipping samples that
name runs (old, current, with node facts that try to set the server's labels) followed by the
collector's inferred-run pass, and reading everything.  After every step:

* no answer is a 5xx;
* a refused request changed nothing (the database is as before it);
* nothing non-finite (Infinity, NaN) is stored;
* a node token's accepted write touched its own node only: new allocations on its node, no other
  run changed, no team, name, labels or params of an existing run changed, no run reopened or
  ended unless its scheduler hook registered it (issue 36);
* what a node's samples made of runs: no registered run changed, no inferred run's start moved, new
  allocations on that node's GPUs only, no label the server owns from node facts;
* a progress token changed nothing but progress;
* a closed run's totals (window, GPU-hours, GPU kWh, cost) never change unless an admin changed
  that run (or, for its energy, samples of its window arrived late; for an inferred run, samples
  continuing it moved its end forward);
* runs + unallocated (+ GPU time without telemetry) = fleet total, in GPU-hours and GPU kWh, over
  the fleet's telemetry period.

Size: ``GPUFLEET_STATEFUL_EXAMPLES`` sequences (default 8) of up to ``GPUFLEET_STATEFUL_STEPS`` steps
(default 12); ``GPUFLEET_STATEFUL_REPORT=path`` appends the counts as one JSON line.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from gpufleet.store.authority import END_SKEW, is_server_label
from gpufleet.store.inferred import INFERRED_FROM, Inferrer
from gpufleet.store.runs import REGISTERED_BY
from gpufleet.wire import encode

NODES = ("n1", "n2", "n3")
GPUS = 2
ROLES = ("admin", "sre", "finance", "progress", "n1", "n2", "n3", "anon", "bad")
#: A run is closed once it ended longer ago than a node may still move its end (END_SKEW), and a minute.
CLOSED_AFTER = END_SKEW + timedelta(minutes=1)
#: Labels the server sets itself (the only server labels a run may carry).
SERVER_SET = {REGISTERED_BY, INFERRED_FROM, "gpufleet.ended_by"}
RUN_IDS = ("job-1", "job-2", "job-3", "ml-7", "x/y")
HISTORY_H = 6
EXAMPLES = int(os.environ.get("GPUFLEET_STATEFUL_EXAMPLES", "8"))
STEPS = int(os.environ.get("GPUFLEET_STATEFUL_STEPS", "12"))


class Env:
    """The API under test, its tokens, its database, and what the runs have counted so far."""

    def __init__(self, url: str, db: str, tokens: dict[str, str], collector: str) -> None:
        self.url = url
        self.db = db
        self.tokens = tokens
        self.collector = collector
        self.client = httpx.Client(base_url=url, timeout=60)
        self.conn = psycopg.connect(db, autocommit=True)
        self.statuses: Counter[int] = Counter()
        self.steps = 0
        self.sequences = 0

    def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if who == "bad":
            headers["Authorization"] = "Bearer gpf_not-a-real-token"
        elif who != "anon":
            headers["Authorization"] = f"Bearer {self.tokens[who]}"
        r = self.client.request(method, path, headers=headers, **kw)
        self.statuses[r.status_code] += 1
        if r.status_code >= 500:
            # The server closes a connection after an unhandled error; hypothesis replays the example to
            # confirm it, and its first request must not meet that closed connection (a reset, reported
            # as flaky data generation) instead of the same 5xx.
            self.client.close()
            self.client = httpx.Client(base_url=self.url, timeout=60)
        assert r.status_code < 500, f"{r.status_code} {method} {path} {kw} as {who}: {r.text[:300]}"
        return r

    def ship(self, node: str, doc: dict[str, Any]) -> httpx.Response:
        body, headers = encode(doc)
        r = httpx.post(
            self.collector + "/v1/ingest",
            content=body,
            headers={**headers, "Authorization": f"Bearer {self.tokens[node]}"},
            timeout=60,
        )
        self.statuses[r.status_code] += 1
        assert r.status_code < 500, f"{r.status_code} ingest as {node}: {r.text[:300]}"
        return r

    def snapshot(self) -> dict[str, Any]:
        c = self.conn
        runs = {
            r[0]: r[1:]
            for r in c.execute(
                'SELECT run_id, name, team, labels::text, start, "end", params, site, source FROM runs'
            ).fetchall()
        }
        allocs = {tuple(r) for r in c.execute("SELECT run_id, node, gpu FROM run_allocations").fetchall()}
        progress = {
            tuple(r) for r in c.execute("SELECT run_id, time, tokens, samples FROM run_progress").fetchall()
        }
        sites = {tuple(r) for r in c.execute("SELECT * FROM sites").fetchall()}
        settings = {tuple(r) for r in c.execute("SELECT * FROM site_settings").fetchall()}  # the dated values
        return {
            "runs": runs,
            "allocs": allocs,
            "progress": progress,
            "sites": sites,
            "site_settings": settings,
        }


def _iso(minutes: float) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()


#: Writers (admin, node tokens) are drawn more often than the roles that can only be refused.
roles = st.one_of(st.sampled_from(("admin", "n1", "n2", "n3")), st.sampled_from(ROLES))
run_ids = st.sampled_from(RUN_IDS)
offsets = st.one_of(st.integers(-5000, 300), st.sampled_from([-1441, -1439, 0, 1439, 1441]))
numbers = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, 1.0, 2.5, -1.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 10**12),
)


class ApiMachine(RuleBasedStateMachine):
    env: Env

    def __init__(self) -> None:
        super().__init__()
        e = self.env
        e.sequences += 1
        e.conn.execute(
            "DELETE FROM run_progress; DELETE FROM run_allocations; DELETE FROM runs; "
            "DELETE FROM run_sightings"
        )
        #: Totals of each run first seen closed, and the runs an admin changed since (theirs to change).
        self.closed: dict[str, tuple[Any, ...]] = {}
        self.admin_touched: set[str] = set()
        #: Samples were shipped since the last check (energy of a closed window may have arrived late).
        self.late_samples = False

    # -------------------------------------------------------------- the checks around every write

    def _write(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        before = self.env.snapshot()
        r = self.env.call(who, method, path, **kw)
        after = self.env.snapshot()
        self.env.steps += 1
        if r.status_code >= 300:
            assert after == before, f"refused {method} {path} as {who} ({r.status_code}) changed the database"
        elif who in NODES:
            self._node_wrote_only_its_own(who, before, after, method, path)
        elif who == "progress":
            assert {k: v for k, v in after.items() if k != "progress"} == {
                k: v for k, v in before.items() if k != "progress"
            }, f"{method} {path} as progress"
        elif who == "admin" and path.startswith("/v1/runs"):
            run_id = path.split("/")[3] if path.count("/") >= 3 else (kw.get("json") or {}).get("run_id")
            self.admin_touched.update({run_id} if run_id else set(after["runs"]))
            # an admin's registration wins over inferred runs on its GPUs, closed ones included
            self.admin_touched.update(r for r, row in before["runs"].items() if row[7] == "inferred")
        return r

    @staticmethod
    def _node_wrote_only_its_own(
        node: str, before: dict[str, Any], after: dict[str, Any], method: str, path: str
    ) -> None:
        where = f"{method} {path} as node {node}"
        assert after["sites"] == before["sites"] and after["site_settings"] == before["site_settings"], where
        new_allocs = after["allocs"] - before["allocs"]
        inferred_before = {r for r, row in before["runs"].items() if row[7] == "inferred"}
        # nothing taken away, but the GPUs of this node an inferred run held (a registration wins)
        for r, n, g in before["allocs"] - after["allocs"]:
            assert r in inferred_before and n == node, (where, (r, n, g))
        assert all(n == node for _, n, _ in new_allocs), (where, new_allocs)
        held_before = {r for r, n, _ in before["allocs"] if n == node}
        for run_id, row in before["runs"].items():
            now_row = after["runs"].get(run_id)
            name, team, labels, start, end, params, site, source = row
            if source == "inferred" and run_id in held_before:
                # an inferred run on this node's GPUs gives way to its registration, or is adopted by it:
                # gone, ended where the registration begins, or registered by this node, never moved back
                if now_row is not None:
                    assert now_row[3] == start and now_row[1] == team and now_row[5] == params, (
                        where,
                        run_id,
                    )
                    assert (
                        now_row[7] == "inferred"
                        or json.loads(now_row[2]).get(REGISTERED_BY) == f"node:{node}"
                    ), (where, run_id)
                continue
            assert now_row is not None, (where, run_id)
            # never name, team, labels, params, start or site of an existing run
            assert (now_row[0], now_row[1], now_row[2], now_row[3], now_row[5], now_row[6]) == (
                name,
                team,
                labels,
                start,
                params,
                site,
            ), where
            if run_id not in held_before:
                assert now_row == row, (where, run_id)  # not this node's run: its end is unchanged too
            elif now_row[4] != end:
                # an end only for a run a scheduler hook registered, never reopened, never far ahead
                assert json.loads(labels).get(REGISTERED_BY, "").startswith("node:"), (where, run_id)
                assert now_row[4] is not None, (where, run_id)
                assert now_row[4] <= datetime.now(UTC) + END_SKEW, (where, run_id)
                if end is not None and end <= datetime.now(UTC) - END_SKEW:
                    raise AssertionError(f"{where}: moved the end of {run_id}, ended at {end}")
        for run_id in set(after["runs"]) - set(before["runs"]):
            _name, team, labels, *_ = after["runs"][run_id]
            assert team is None and json.loads(labels) == {REGISTERED_BY: f"node:{node}"}, where
            assert {n for r, n, _ in after["allocs"] if r == run_id} <= {node}, where
        for run_id, *_ in after["progress"] - before["progress"]:
            assert run_id in held_before, (where, run_id)

    def _samples_added_only_what_the_node_saw(
        self, node: str, before: dict[str, Any], after: dict[str, Any]
    ) -> None:
        where = f"samples of node {node} and the inferred-run pass"
        for run_id, row in before["runs"].items():
            now_row = after["runs"].get(run_id)
            if row[7] == "registered":
                assert now_row == row, (where, run_id)  # a registration is never touched by samples
            elif now_row is not None:
                assert now_row[3] == row[3], (where, run_id, "start moved")
        new_allocs = after["allocs"] - before["allocs"]
        assert all(n == node for _, n, _ in new_allocs), (where, new_allocs)
        for run_id, row in after["runs"].items():
            server = {k for k in json.loads(row[2]) if is_server_label(k)}
            assert server <= SERVER_SET, (where, run_id, server)
            if row[7] == "inferred":
                assert not server & {"gpufleet.ended_by", REGISTERED_BY} or run_id in before["runs"], (
                    where,
                    run_id,
                )

    # -------------------------------------------------------------- rules

    @rule(
        node=st.sampled_from(NODES),
        run_id=run_ids,
        gpus=st.sets(st.integers(0, GPUS - 1), min_size=1),
        age_s=st.sampled_from([30, 600, 7200, 13 * 86400]),
        facts=st.sampled_from([None, {"gpufleet.ended_by": "x", "team": "t"}, {"owner": "o"}]),
    )
    def ship_samples(
        self, node: str, run_id: str, gpus: set[int], age_s: int, facts: dict[str, str] | None
    ) -> None:
        """A node's samples naming a run (power only: a counter bridging hours could add late energy to a
        closed window, which is telemetry arriving late, not a rewrite), then the inferred-run pass."""
        t0 = datetime.now(UTC).timestamp() - age_s
        rows = [(t0 + k, g) for k in range(3) for g in sorted(gpus)]
        doc: dict[str, Any] = {
            "batch_id": f"{node}:{self.env.steps}:{t0}",
            "node": node,
            "gpu": {
                "time": [r[0] for r in rows],
                "gpu": [r[1] for r in rows],
                "run_id": [run_id] * len(rows),
                "power_w": [150.0] * len(rows),
            },
        }
        if facts is not None:
            doc["facts"] = {
                "runs": {
                    run_id: {
                        "name": "inferred",
                        "team": facts.get("team"),
                        "labels": {k: v for k, v in facts.items() if k != "team"},
                    }
                }
            }
        before = self.env.snapshot()
        r = self.env.ship(node, doc)
        self.late_samples = True
        with psycopg.connect(self.env.db, autocommit=True) as conn:
            Inferrer(300.0).run_once(conn, datetime.now(UTC))
        self.env.steps += 1
        after = self.env.snapshot()
        if r.status_code >= 300:
            assert after["runs"] == before["runs"] and after["allocs"] == before["allocs"], r.text
        self._samples_added_only_what_the_node_saw(node, before, after)

    @rule(
        who=roles,
        run_id=st.one_of(st.none(), run_ids),
        node=st.sampled_from(NODES),
        gpus=st.sets(st.integers(0, GPUS - 1), min_size=1),
        start=offsets,
        length=st.one_of(st.none(), st.integers(-10, 5000)),
        name=st.sampled_from([None, "pretrain", "eval"]),
        team=st.sampled_from([None, "teamA", "=HYPERLINK(1)"]),
        labels=st.sampled_from([None, {"cc": "A"}]),
    )
    def create_run(
        self,
        who: str,
        run_id: str | None,
        node: str,
        gpus: set[int],
        start: int,
        length: int | None,
        name: str | None,
        team: str | None,
        labels: dict[str, str] | None,
    ) -> None:
        body: dict[str, Any] = {"allocations": [{"node": node, "gpus": sorted(gpus)}], "start": _iso(start)}
        if run_id is not None:
            body["run_id"] = run_id
        if length is not None:
            body["end"] = _iso(start + length)
        for k, v in (("name", name), ("team", team), ("labels", labels)):
            if v is not None:
                body[k] = v
        self._write(who, "POST", "/v1/runs", json=body)

    @rule(
        who=roles,
        run_id=run_ids,
        change=st.one_of(
            st.fixed_dictionaries({"end": st.one_of(st.none(), offsets.map(_iso))}),
            st.fixed_dictionaries({"team": st.sampled_from(["teamB", "@SUM(1)"])}),
            st.fixed_dictionaries({"name": st.just("renamed")}),
            st.fixed_dictionaries({"labels": st.just({"x": "y"})}),
            st.fixed_dictionaries({"params": st.integers(1, 10**9)}),
            st.fixed_dictionaries(
                {
                    "allocations": st.tuples(st.sampled_from(NODES), st.integers(0, GPUS - 1)).map(
                        lambda a: [{"node": a[0], "gpus": [a[1]]}]
                    )
                }
            ),
        ),
    )
    def patch_run(self, who: str, run_id: str, change: dict[str, Any]) -> None:
        self._write(who, "PATCH", f"/v1/runs/{run_id}", json=change)

    registered = Bundle("registered")

    @rule(
        target=registered,
        run_id=run_ids,
        node=st.sampled_from(NODES),
        gpus=st.sets(st.integers(0, GPUS - 1), min_size=1),
        start=st.integers(-3000, -10),
        length=st.one_of(st.none(), st.integers(1, 600)),
        by_node=st.booleans(),
    )
    def register(
        self, run_id: str, node: str, gpus: set[int], start: int, length: int | None, by_node: bool
    ) -> tuple[str, str]:
        """A registration that is usually accepted: an admin's (often already ended) or a node's hook."""
        body: dict[str, Any] = {"run_id": run_id, "allocations": [{"node": node, "gpus": sorted(gpus)}]}
        if by_node:
            body["start"] = _iso(max(start, -60))
        else:
            body.update(
                start=_iso(start), team="teamA", **({} if length is None else {"end": _iso(start + length)})
            )
        self._write(node if by_node else "admin", "POST", "/v1/runs", json=body)
        return run_id, node

    @rule(run=registered, end=st.one_of(st.none(), offsets.map(_iso)))
    def node_ends(self, run: tuple[str, str], end: str | None) -> None:
        """The epilog of the node a run holds GPUs of, or that node trying to end, extend or reopen a run
        that is not its hook's."""
        run_id, node = run
        self._write(node, "PATCH", f"/v1/runs/{run_id}", json={"end": end})

    @rule(
        who=st.one_of(st.just("admin"), roles),
        run_id=run_ids,
        tokens=numbers,
        at=st.one_of(st.none(), offsets),
    )
    def progress(self, who: str, run_id: str, tokens: float, at: int | None) -> None:
        body = json.dumps({"tokens": tokens, **({} if at is None else {"time": _iso(at)})}, allow_nan=True)
        self._write(
            who,
            "POST",
            f"/v1/runs/{run_id}/progress",
            content=body,
            headers={"Content-Type": "application/json"},
        )

    @rule(
        who=st.one_of(st.just("admin"), roles),
        method=st.sampled_from(["PUT", "PATCH"]),
        field=st.sampled_from(["pue", "price_per_kwh", "gpu_hour_price", "carbon_g_per_kwh"]),
        value=numbers,
    )
    def site(self, who: str, method: str, field: str, value: float) -> None:
        body = json.dumps({field: value}, allow_nan=True)
        self._write(who, method, "/v1/sites/eu1", content=body, headers={"Content-Type": "application/json"})

    @rule(
        who=roles,
        run_id=run_ids,
        what=st.sampled_from(
            [
                "/v1/runs",
                "/v1/runs/{}",
                "/v1/runs/{}/accounting",
                "/v1/runs/{}/incidents",
                "/v1/incidents",
                "/v1/reports/runs.csv",
                "/v1/accounting",
                "/v1/nodes",
                "/runs/{}",
                "/accounting",
                "/v1/sites",
            ]
        ),
    )
    def read(self, who: str, run_id: str, what: str) -> None:
        path = what.format(run_id)
        params = {}
        if what in ("/v1/reports/runs.csv", "/v1/accounting"):
            params = {"from": _iso(-60 * HISTORY_H), "to": _iso(60)}
        self.env.call(who, "GET", path, params=params)
        self.env.steps += 1

    # -------------------------------------------------------------- after every step

    @invariant()
    def nothing_non_finite_is_stored(self) -> None:
        bad = "IN ('Infinity'::float8, '-Infinity'::float8, 'NaN'::float8)"
        row = self.env.conn.execute(
            f"SELECT (SELECT count(*) FROM site_settings WHERE num {bad}), "
            f"(SELECT count(*) FROM run_progress WHERE tokens {bad} OR samples {bad})"
        ).fetchone()
        assert row == (0, 0), row

    @invariant()
    def closed_runs_totals_never_change(self) -> None:
        """Once a run ended, its bill stands: only an admin's change to that run moves it, and an inferred
        run only grows forward (its own GPUs' samples continuing it move its end later or reopen it)."""
        closed_before = datetime.now(UTC) - CLOSED_AFTER
        for run_id in list(self.closed):
            if run_id in self.admin_touched:
                del self.closed[run_id]
        rows = self.env.conn.execute(
            'SELECT run_id, source FROM runs WHERE "end" IS NOT NULL AND "end" < %s', (closed_before,)
        ).fetchall()
        for run_id, source in rows:
            if run_id in self.admin_touched:
                continue
            r = self.env.call("finance", "GET", f"/v1/runs/{run_id}/accounting", params={"source": "raw"})
            assert r.status_code == 200, r.text
            b = r.json()
            totals = (
                b["start"],
                b["end"],
                b["gpu_count"],
                b["gpu_hours"],
                b["compute_cost"],
                b["gpu_kwh"],
                b["total_cost"],
            )
            seen = self.closed.setdefault(run_id, totals)
            if self.late_samples and seen[:5] == totals[:5]:
                # a node's samples for a window may arrive after it closed (a spool drained): its energy is
                # telemetry arriving late, bounded by what the GPU can draw; window, GPU-hours and their
                # price still stand
                seen = self.closed[run_id] = totals
            if (
                seen != totals
                and source == "inferred"
                and totals[:3] == (seen[0], totals[1], seen[2])
                and totals[1] > seen[1]
                and totals[3] >= seen[3]
            ):
                self.closed[run_id] = totals  # grew forward from samples continuing it
                continue
            assert seen == totals, (run_id, seen, totals)
        # a run reopened by samples continuing it is open again: its next close is a new baseline
        open_now = {
            r[0] for r in self.env.conn.execute('SELECT run_id FROM runs WHERE "end" IS NULL').fetchall()
        }
        for run_id in open_now & set(self.closed):
            source = self.env.conn.execute("SELECT source FROM runs WHERE run_id = %s", (run_id,)).fetchone()
            assert source == ("inferred",), (run_id, "a closed registered run was reopened")
            del self.closed[run_id]
        self.admin_touched.clear()
        self.late_samples = False

    @invariant()
    def runs_plus_unallocated_is_the_total(self) -> None:
        r = self.env.call(
            "finance",
            "GET",
            "/v1/accounting",
            params={"from": _iso(-60 * HISTORY_H), "to": _iso(-1), "group_by": "run", "source": "raw"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        runs, idle, dark, total = body["runs"], body["unallocated"], body["no_telemetry"], body["total"]
        assert math.isclose(total["gpu_hours"], len(NODES) * GPUS * (HISTORY_H - 1 / 60), rel_tol=1e-3), total
        # GPU time no run held is the unallocated line where samples cover it, no_telemetry where none do
        for k in ("gpu_hours", "gpu_kwh"):
            parts = runs[k] + idle[k] + dark[k]
            assert abs(parts - total[k]) <= 1e-9 * max(1.0, total[k]), (
                k,
                runs[k],
                idle[k],
                dark[k],
                total[k],
            )
        assert total["gpu_kwh"] > 0


@pytest.fixture
def env(db: str, settings: Settings) -> Iterator[Env]:
    now = datetime.now(UTC)
    with psycopg.connect(db, autocommit=True) as c:
        tokens = {r: create_token(c, r, r) for r in ("admin", "sre", "finance")}
        tokens.update({n: create_token(c, f"node-{n}", "node", n) for n in NODES})
        tokens["progress"] = create_token(c, "trainer", "progress")
        c.execute("INSERT INTO sites (site) VALUES ('eu1')")
        for n in NODES:
            c.execute("INSERT INTO nodes (node, site, gpu_count) VALUES (%s, 'eu1', %s)", (n, GPUS))
        with c.cursor().copy("COPY gpu_samples (time, node, gpu, power_w, energy_mj) FROM STDIN") as cp:
            for n in NODES:
                for g in range(GPUS):
                    for k in range(HISTORY_H * 60 + 120):
                        t = now - timedelta(hours=HISTORY_H, minutes=5) + timedelta(seconds=30 * k)
                        cp.write_row((t, n, g, 200.0 + 10 * g, None if n == "n3" else round(3e5 * k)))
    with (
        serve(create_app(db, settings)) as srv,
        serve(create_collector(db, settings, run_leader=False), **server_options(settings)) as col,
    ):
        e = Env(srv.url, db, tokens, col.url)
        try:
            yield e
        finally:
            e.client.close()
            e.conn.close()


@pytest.mark.timeout(3600)
def test_random_role_sequences_keep_the_fleet_whole(env: Env) -> None:
    ApiMachine.env = env
    run_state_machine_as_test(
        ApiMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            derandomize=os.environ.get("GPUFLEET_STATEFUL_RANDOM", "") in ("", "0"),
            suppress_health_check=list(HealthCheck),
        ),
    )
    requests = sum(env.statuses.values())
    fivexx = sum(n for s, n in env.statuses.items() if s >= 500)
    report = {
        "test": "api_state_machine",
        "sequences": env.sequences,
        "steps": env.steps,
        "requests": requests,
        "fivexx": fivexx,
        "statuses": dict(sorted(env.statuses.items())),
    }
    print(json.dumps(report))
    if os.environ.get("GPUFLEET_STATEFUL_REPORT"):
        with open(os.environ["GPUFLEET_STATEFUL_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    assert fivexx == 0
    # the sequences got past authentication and did accept writes, or this tested little
    assert env.statuses[201] > 0 and env.statuses[403] > 0 and env.statuses[422] > 0
