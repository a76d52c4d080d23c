"""Slurm runs have a team: the prolog sends the job's account, user and partition, and the server maps them to a
team by its ``teams`` settings (issue 35 item 6)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import pytest

from gpufleet.accounting.report import finance_report
from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings, TeamSettings
from gpufleet.serverthread import serve
from gpufleet.teams import team_for
from tests.agent.test_attribution_slurm import hook
from tests.api.conftest import Api, api  # noqa: F401  (the fixture)


def _run(api: Api, run_id: str) -> dict:  # noqa: F811
    r = api.client("admin").get(f"/v1/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json()


def test_the_prolog_environment_names_the_jobs_owner_and_team(api: Api, tmp_path: Path) -> None:  # noqa: F811
    r = hook(
        "prolog.sh",
        tmp_path,
        api.url,
        api.tokens["node"],
        "n1",
        SLURM_JOB_ID="5101",
        SLURM_JOB_GPUS="0",
        SLURM_JOB_ACCOUNT="vision-lab",
        SLURM_JOB_USER="ada",
        SLURM_JOB_PARTITION="gpu-h100",
    )
    assert r.returncode == 0, r.stderr
    run = _run(api, "5101")
    assert run["team"] == "vision-lab"
    assert {k: v for k, v in run["labels"].items() if k.startswith("slurm.")} == {
        "slurm.account": "vision-lab",
        "slurm.user": "ada",
        "slurm.partition": "gpu-h100",
    }
    # the finance report groups it under its team, not under "no team"
    with psycopg.connect(api.db, autocommit=True) as conn:
        conn.execute("UPDATE runs SET start = now() - interval '1 hour'")
        from datetime import UTC, datetime, timedelta

        now = datetime.now(UTC)
        rows = finance_report(
            conn, now - timedelta(hours=2), now, group_by="team", now=now, source="raw"
        ).rows
    assert [r["key"] for r in rows if r["row_type"] == "team"] == ["vision-lab"]


def test_without_the_environment_sacct_answers(api: Api, tmp_path: Path) -> None:  # noqa: F811
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sacct = bin_dir / "sacct"
    sacct.write_text("#!/bin/sh\n[ \"$2\" = 5102 ] && echo 'proj-7|grace|batch'\n")
    sacct.chmod(sacct.stat().st_mode | stat.S_IEXEC)
    r = hook(
        "prolog.sh",
        tmp_path,
        api.url,
        api.tokens["node"],
        "n1",
        SLURM_JOB_ID="5102",
        SLURM_JOB_GPUS="1",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    assert r.returncode == 0, r.stderr
    run = _run(api, "5102")
    assert run["team"] == "proj-7" and run["labels"]["slurm.user"] == "grace"
    assert run["labels"]["slurm.partition"] == "batch"


def test_a_name_the_api_would_refuse_is_left_out_not_the_run(api: Api, tmp_path: Path) -> None:  # noqa: F811
    r = hook(
        "prolog.sh",
        tmp_path,
        api.url,
        api.tokens["node"],
        "n1",
        SLURM_JOB_ID="5103",
        SLURM_JOB_GPUS="2",
        SLURM_JOB_ACCOUNT="=HYPERLINK(x)",
        SLURM_JOB_USER="ada",
        SLURM_JOB_PARTITION="gpu",
        GPUFLEET_HOOK_VERBOSE="1",
    )
    assert r.returncode == 0 and "left out" in r.stderr, r.stderr
    run = _run(api, "5103")
    assert "slurm.account" not in run["labels"] and run["labels"]["slurm.user"] == "ada"
    assert run["team"] is None  # no account: no team from it (the user is not a team)


def test_the_teams_settings_map_accounts_to_teams(db: str, settings: Settings, tmp_path: Path) -> None:
    mapped = settings.model_copy(update={"teams": TeamSettings(map={"slurm.account": {"proj-7": "speech"}})})
    with psycopg.connect(db, autocommit=True) as c:
        token = create_token(c, "node-n1", "node", "n1")
    with serve(create_app(db, mapped)) as srv:
        r = hook(
            "prolog.sh",
            tmp_path,
            srv.url,
            token,
            "n1",
            SLURM_JOB_ID="5104",
            SLURM_JOB_GPUS="0",
            SLURM_JOB_ACCOUNT="proj-7",
            SLURM_JOB_USER="ada",
            SLURM_JOB_PARTITION="gpu",
        )
        assert r.returncode == 0, r.stderr
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT team FROM runs WHERE run_id = '5104'").fetchone() == ("speech",)


@pytest.mark.parametrize(
    "labels,rules,team",
    [
        ({"slurm.account": "a1", "k8s.namespace": "ns"}, TeamSettings(), "a1"),
        (
            {"k8s.namespace": "ml-prod"},
            TeamSettings(map={"k8s.namespace": {"ml-prod": "platform"}}),
            "platform",
        ),
        ({"k8s.namespace": "ml-prod"}, TeamSettings(unmapped_is_team=False), None),
        ({"slurm.user": "ada"}, TeamSettings(), None),
        (
            {"slurm.partition": "gpu"},
            TeamSettings(from_labels=["slurm.partition"], map={"slurm.partition": {"gpu": "hpc"}}),
            "hpc",
        ),
    ],
)
def test_team_for(labels: dict, rules: TeamSettings, team: str | None) -> None:
    assert team_for(labels, rules) == team


def test_kubernetes_namespaces_and_team_labels_map_to_teams() -> None:
    """A namespace per project of one team, or a team label's old name: the agent's k8s.team_map names the team."""
    from gpufleet.agent.k8s.pods import ObjectInfo
    from gpufleet.agent.k8s.runs import RunResolver
    from tests.agent.test_k8s_attribution import PTJ, pod_json

    r = RunResolver(team_map={"ml-prod": "platform", "research-old": "research"})
    unlabelled = ObjectInfo.from_json("Pod", pod_json("ml-prod", "w-0", "p-1", owner=PTJ))
    labelled = ObjectInfo.from_json("Pod", pod_json("ml", "m-0", "p-2", {"team": "research-old"}, owner=PTJ))
    other = ObjectInfo.from_json("Pod", pod_json("dev", "nb", "p-3"))
    assert (
        r.resolve(unlabelled).team == "platform"
        and r.resolve(unlabelled).labels["k8s.namespace"] == "ml-prod"
    )
    assert r.resolve(labelled).team == "research" and r.resolve(other).team == "dev"
