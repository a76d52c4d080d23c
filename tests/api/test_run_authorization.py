"""Authorization for runs (issue 11, "a node token can change any run"): role x route x outcome.

Fleet: ``teamA-run`` registered by an admin with all its GPUs on node n2 (team, name, labels);
``job-42`` registered by n2's Slurm prolog (a node token) on n2.  The node token under test is
n1's unless the row says otherwise.  Every row runs against the real API and database, and
checks what was stored, not only the status.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from gpufleet.auth import create_token
from gpufleet.store.runs import REGISTERED_BY
from tests.api.conftest import Api


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class FromNow:
    """A time this far from the moment a case runs, not from when the module was collected: in a
    full run a case starts minutes after collection, and "4 minutes from now" written down then
    would end a run before the start the server gave it at registration."""

    offset: timedelta

    def __str__(self) -> str:
        return iso(datetime.now(UTC) + self.offset)


def _at_call_time(body: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if body is None else {k: str(v) if isinstance(v, FromNow) else v for k, v in body.items()}


@dataclass
class Fleet:
    api: Api

    def call(self, who: str, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
        with self.api.client(who) as c:
            r = c.request(method, path, json=body)
            return r.status_code, r.text

    def run(self, run_id: str) -> dict[str, Any]:
        with self.api.client("admin") as c:
            r = c.get(f"/v1/runs/{run_id}")
            return r.json() if r.status_code == 200 else {}

    def progress_rows(self, run_id: str) -> int:
        with psycopg.connect(self.api.db) as conn:
            row = conn.execute("SELECT count(*) FROM run_progress WHERE run_id = %s", (run_id,)).fetchone()
            return int(row[0]) if row else 0


@pytest.fixture
def fleet(api: Api) -> Iterator[Fleet]:
    with psycopg.connect(api.db, autocommit=True) as c:
        api.tokens["node2"] = create_token(c, "node-n2", "node", "n2")
        api.tokens["progress"] = create_token(c, "trainer", "progress")
        api.tokens["progress_n1"] = create_token(c, "trainer-n1", "progress", "n1")
        api.tokens["progress_n2"] = create_token(c, "trainer-n2", "progress", "n2")
        c.execute("INSERT INTO sites (site) VALUES ('eu1'), ('us1')")
        c.execute("INSERT INTO nodes (node, site) VALUES ('n1', 'eu1'), ('n2', 'eu1')")
    f = Fleet(api)
    code, text = f.call(
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "teamA-run",
            "name": "pretrain",
            "team": "teamA",
            "labels": {"cost_center": "A"},
            "start": iso(datetime.now(UTC) - timedelta(hours=1)),
            "allocations": [{"node": "n2", "gpus": [0, 1, 2, 3]}],
        },
    )
    assert code == 201, text
    code, text = f.call(
        "node2",
        "post",
        "/v1/runs",
        {"run_id": "job-42", "name": "train.sh", "allocations": [{"node": "n2", "gpus": [4, 5]}]},
    )
    assert code == 201, text
    yield f


FAR_PAST = "0001-01-01T00:00:00Z"
TWO_DAYS_AGO = FromNow(-timedelta(days=2))
IN_TWO_DAYS = FromNow(timedelta(days=2))
SOON = FromNow(timedelta(minutes=4))
IN_20_HOURS = FromNow(timedelta(hours=20))

# (who, method, path, body, expected status, check of the stored state after the call)
CASES: list[tuple[str, str, str, dict[str, Any] | None, int, str]] = [
    # --- node token on another node's run (all of whose GPUs are on n2)
    (
        "node",
        "patch",
        "/v1/runs/teamA-run",
        {"team": "evil", "name": "x", "labels": {"a": "b"}},
        403,
        "teamA_unchanged",
    ),
    ("node", "patch", "/v1/runs/teamA-run", {"end": SOON}, 403, "teamA_unchanged"),
    ("node", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 403, "no_progress_teamA"),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "teamA-run", "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "teamA_unchanged",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "allocations": [{"node": "n2", "gpus": [7]}]},
        403,
        "no_job_x",
    ),
    # --- node token registering its own runs: times near now only, no team / labels / params
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "start": FAR_PAST, "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "start": TWO_DAYS_AGO, "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "end": IN_TWO_DAYS, "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "team": "teamA", "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "labels": {"a": "b"}, "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "site": "us1", "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    ("node", "post", "/v1/runs", {"run_id": "job-x"}, 403, "no_job_x"),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "name": "train.sh", "site": "eu1", "allocations": [{"node": "n1", "gpus": [0]}]},
        201,
        "job_x_on_n1",
    ),
    # --- the multi-node Slurm case: n1's prolog joins the job n2's prolog registered
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-42", "name": "train.sh", "allocations": [{"node": "n1", "gpus": [0]}]},
        200,
        "job42_joined",
    ),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-42", "name": "other.sh", "allocations": [{"node": "n1", "gpus": [0]}]},
        409,
        "job42_alone",
    ),
    ("node", "patch", "/v1/runs/job-42", {"allocations": [{"node": "n1", "gpus": [0]}]}, 403, "job42_alone"),
    # --- node token on an admin's run of its own node: progress only, never its end, name, team or labels
    ("node2", "patch", "/v1/runs/teamA-run", {"end": SOON}, 403, "teamA_unchanged"),
    ("node2", "patch", "/v1/runs/teamA-run", {"end": IN_TWO_DAYS}, 403, "teamA_unchanged"),
    ("node2", "patch", "/v1/runs/teamA-run", {"team": "teamB"}, 403, "teamA_unchanged"),
    ("node2", "patch", "/v1/runs/teamA-run", {"labels": {"cost_center": "B"}}, 403, "teamA_unchanged"),
    (
        "node2",
        "patch",
        "/v1/runs/teamA-run",
        {"allocations": [{"node": "n2", "gpus": [6]}]},
        403,
        "teamA_unchanged",
    ),
    ("node2", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 204, "progress_teamA"),
    (
        "node2",
        "post",
        "/v1/runs/teamA-run/progress",
        {"tokens": 5, "time": FAR_PAST},
        403,
        "no_progress_teamA",
    ),
    # --- node token on its own hook's run: end near now (never far ahead, never reopen), add its GPUs at the start
    ("node2", "patch", "/v1/runs/job-42", {"end": None}, 403, "job42_alone"),
    ("node2", "patch", "/v1/runs/job-42", {"end": SOON}, 200, "job42_ends"),
    ("node2", "patch", "/v1/runs/job-42", {"end": IN_20_HOURS}, 403, "job42_alone"),
    ("node", "patch", "/v1/runs/job-42", {"end": SOON}, 403, "job42_alone"),
    (
        "node2",
        "patch",
        "/v1/runs/job-42",
        {"allocations": [{"node": "n2", "gpus": [6]}]},
        200,
        "job42_has_n2_6",
    ),
    # --- a progress token: progress of any run, nothing else; bound to a node, only runs on that node
    ("progress", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 204, "progress_teamA"),
    (
        "progress",
        "post",
        "/v1/runs/teamA-run/progress",
        {"tokens": 5, "time": FAR_PAST},
        403,
        "no_progress_teamA",
    ),
    ("progress_n1", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 403, "no_progress_teamA"),
    ("progress_n2", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 204, "progress_teamA"),
    ("progress", "patch", "/v1/runs/teamA-run", {"end": SOON}, 403, "teamA_unchanged"),
    (
        "progress",
        "post",
        "/v1/runs",
        {"run_id": "job-x", "allocations": [{"node": "n1", "gpus": [0]}]},
        403,
        "no_job_x",
    ),
    ("progress", "get", "/v1/runs/teamA-run", None, 403, "teamA_unchanged"),
    ("progress", "get", "/v1/accounting", None, 403, "teamA_unchanged"),
    ("progress", "post", "/v1/tokens", {"name": "x", "role": "admin"}, 403, "teamA_unchanged"),
    # --- roles above node keep their powers
    (
        "admin",
        "patch",
        "/v1/runs/teamA-run",
        {"team": "teamB", "end": IN_TWO_DAYS},
        200,
        "teamA_admin_changed",
    ),
    (
        "admin",
        "post",
        "/v1/runs",
        {
            "run_id": "old",
            "start": "2020-01-01T00:00:00Z",
            "end": "2020-01-02T00:00:00Z",
            "team": "t",
            "allocations": [{"node": "n9", "gpus": [0]}],
        },
        201,
        "old_exists",
    ),
    (
        "admin",
        "post",
        "/v1/runs",
        {"run_id": "teamA-run", "allocations": [{"node": "n1", "gpus": [0]}]},
        200,
        "teamA_has_n1",
    ),
    ("admin", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 204, "progress_teamA"),
    ("sre", "patch", "/v1/runs/teamA-run", {"end": SOON}, 403, "teamA_unchanged"),
    ("finance", "post", "/v1/runs/teamA-run/progress", {"tokens": 5}, 403, "no_progress_teamA"),
    ("nobody", "patch", "/v1/runs/teamA-run", {"end": SOON}, 401, "teamA_unchanged"),
    # --- run ids that would be unreachable afterwards
    ("admin", "post", "/v1/runs", {"run_id": "ns/job-1"}, 422, "no_slash_run"),
    (
        "node",
        "post",
        "/v1/runs",
        {"run_id": "ns/job-1", "allocations": [{"node": "n1", "gpus": [0]}]},
        422,
        "no_slash_run",
    ),
]


def _check(f: Fleet, what: str) -> None:
    a = f.run("teamA-run")
    j = f.run("job-42")
    if what == "teamA_unchanged":
        assert (a["team"], a["name"], a["labels"], a["end"], a["allocations"]) == (
            "teamA",
            "pretrain",
            {"cost_center": "A"},
            None,
            [{"node": "n2", "gpus": [0, 1, 2, 3]}],
        ), a
    elif what == "teamA_admin_changed":
        assert a["team"] == "teamB" and a["end"] is not None
    elif what == "teamA_has_n1":
        assert a["gpu_count"] == 5
    elif what == "no_progress_teamA":
        assert f.progress_rows("teamA-run") == 0
    elif what == "progress_teamA":
        assert f.progress_rows("teamA-run") == 1
    elif what == "no_job_x":
        assert f.run("job-x") == {}
    elif what == "job_x_on_n1":
        x = f.run("job-x")
        assert x["allocations"] == [{"node": "n1", "gpus": [0]}] and x["labels"] == {REGISTERED_BY: "node:n1"}
    elif what == "job42_joined":
        assert j["allocations"] == [{"node": "n1", "gpus": [0]}, {"node": "n2", "gpus": [4, 5]}], j
        assert j["labels"] == {REGISTERED_BY: "node:n2"} and j["name"] == "train.sh"
    elif what == "job42_alone":
        assert j["allocations"] == [{"node": "n2", "gpus": [4, 5]}] and j["end"] is None, j
    elif what == "job42_ends":
        assert j["end"] is not None and j["allocations"] == [{"node": "n2", "gpus": [4, 5]}], j
    elif what == "job42_has_n2_6":
        assert j["allocations"] == [{"node": "n2", "gpus": [4, 5, 6]}], j
    elif what == "old_exists":
        assert f.run("old")["gpu_count"] == 1
    elif what == "no_slash_run":
        with psycopg.connect(f.api.db) as c:
            assert c.execute("SELECT count(*) FROM runs WHERE run_id LIKE '%/%'").fetchone() == (0,)
    else:
        raise AssertionError(f"unknown check {what}")


@pytest.mark.parametrize(
    "who,method,path,body,expected,check",
    CASES,
    ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[4]}-{i}" for i, c in enumerate(CASES)],
)
def test_role_route_outcome(
    fleet: Fleet, who: str, method: str, path: str, body: dict[str, Any] | None, expected: int, check: str
) -> None:
    code, text = fleet.call(who, method, path, _at_call_time(body))
    assert code == expected, text
    _check(fleet, check)


def test_refusals_name_the_field(fleet: Fleet) -> None:
    code, text = fleet.call("admin", "post", "/v1/runs", {"run_id": "ns/job-1"})
    assert code == 422 and '"run_id"' in text, text
    code, text = fleet.call(
        "node",
        "post",
        "/v1/runs",
        {"run_id": "job-y", "start": FAR_PAST, "allocations": [{"node": "n1", "gpus": [1]}]},
    )
    assert code == 403 and "'start'" in text and "1 day" in text, text
    code, text = fleet.call("node", "patch", "/v1/runs/teamA-run", {"team": "x"})
    assert code == 403 and "'team'" in text, text


def test_a_far_past_start_is_not_billed_by_a_node(fleet: Fleet) -> None:
    """The issue's 71,035,373 GPU-hours: a node token cannot set a start in year 1."""
    code, _ = fleet.call(
        "node",
        "post",
        "/v1/runs",
        {
            "run_id": "ancient",
            "start": FAR_PAST,
            "allocations": [{"node": "n1", "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}],
        },
    )
    assert code == 403
    code, text = fleet.call(
        "node",
        "post",
        "/v1/runs",
        {"run_id": "ancient", "allocations": [{"node": "n1", "gpus": [0, 1, 2, 3]}]},
    )
    assert code == 201, text
    with fleet.api.client("admin") as c:
        body = c.get("/v1/runs/ancient/accounting").json()
    assert body["gpu_hours"] < 4 * 0.1, body["gpu_hours"]


def test_progress_tokens_name_a_node_or_none_and_other_roles_none(fleet: Fleet) -> None:
    with fleet.api.client("admin") as c:
        r = c.post("/v1/tokens", json={"name": "trainer-any", "role": "progress"})
        assert r.status_code == 201 and r.json()["node"] is None, r.text
        r = c.post("/v1/tokens", json={"name": "trainer-n2b", "role": "progress", "node": "n2"})
        assert r.status_code == 201 and r.json()["node"] == "n2", r.text
        r = c.post("/v1/tokens", json={"name": "sre-n2", "role": "sre", "node": "n2"})
        assert r.status_code == 422 and "--node is for roles node and progress" in r.text, r.text
        r = c.post("/v1/tokens", json={"name": "node-none", "role": "node"})
        assert r.status_code == 422 and "needs --node" in r.text, r.text
    # the database holds the same rule
    with psycopg.connect(fleet.api.db) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO agent_tokens (name, token_hash, role, node) VALUES ('x', 'x', 'sre', 'n1')")
