"""The Slurm prolog and epilog against the real API: job files for attribution, runs registered and ended."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psycopg

from gpufleet.agent.attribution import Attributor
from gpufleet.auth import create_token
from tests.api.conftest import Api, api  # noqa: F401  (the fixture)

HOOKS = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def hook(
    name: str, tmp_path: Path, url: str, token: str, node: str, **env: str
) -> subprocess.CompletedProcess[str]:
    token_file = tmp_path / f"token-{node}"
    token_file.write_text(token)
    full = {
        "PATH": os.environ["PATH"],
        "GPUFLEET_CONF": "/nonexistent",
        "GPUFLEET_API_URL": url,
        "GPUFLEET_TOKEN_FILE": str(token_file),
        "GPUFLEET_NODE": node,
        "GPUFLEET_JOB_DIR": str(tmp_path / f"jobs-{node}"),
        "GPUFLEET_TIMEOUT_S": "5",
        **env,
    }
    return subprocess.run(["sh", str(HOOKS / name)], env=full, capture_output=True, text=True, timeout=60)


def test_prolog_labels_gpus_and_registers_the_run_on_each_node(api: Api, tmp_path: Path) -> None:  # noqa: F811
    with psycopg.connect(api.db, autocommit=True) as c:
        n2 = create_token(c, "node-n2", "node", "n2")
    job = {"SLURM_JOB_ID": "4411", "SLURM_JOB_NAME": 'train "big" model\\1'}
    r1 = hook("prolog.sh", tmp_path, api.url, api.tokens["node"], "n1", SLURM_JOB_GPUS="0,2-3", **job)
    r2 = hook("prolog.sh", tmp_path, api.url, n2, "n2", SLURM_JOB_GPUS="1", **job)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    jobs = tmp_path / "jobs-n1"
    assert sorted(p.name for p in jobs.iterdir()) == ["0", "2", "3"]
    assert (jobs / "2").read_text() == "4411\n"
    labelled = Attributor(jobs, tmp_path / "proc").label([{"gpu": g} for g in range(4)])
    assert [r["run_id"] for r in labelled] == ["4411", None, "4411", "4411"]

    run = api.client("admin").get("/v1/runs/4411").json()
    assert run["name"] == 'train "big" model\\1' and run["state"] == "running"
    assert sorted((a["node"], a["gpus"]) for a in run["allocations"]) == [("n1", [0, 2, 3]), ("n2", [1])]

    # The epilog ends the run and unlabels the GPUs, but not a file that names another run.
    (jobs / "3").write_text("9999\n")
    t_end = time.time()
    e1 = hook("epilog.sh", tmp_path, api.url, api.tokens["node"], "n1", SLURM_JOB_GPUS="0,2-3", **job)
    assert e1.returncode == 0, e1.stderr
    assert sorted(p.name for p in jobs.iterdir()) == ["3"]
    run = api.client("admin").get("/v1/runs/4411").json()
    assert run["state"] == "ended"
    assert abs(datetime.fromisoformat(run["end"]).timestamp() - t_end) < 10


def test_hooks_never_fail_the_job(tmp_path: Path) -> None:
    # API unreachable, no token file, no GPUs, no job id: exit 0 every time, job files still written.
    for env in ({"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0"}, {"SLURM_JOB_ID": "7"}, {"SLURM_JOB_GPUS": "0"}):
        for name in ("prolog.sh", "epilog.sh"):
            r = hook(name, tmp_path, "http://127.0.0.1:9", "tok", "n1", GPUFLEET_TIMEOUT_S="1", **env)
            assert r.returncode == 0, (name, env, r.stderr)
    r = hook(
        "prolog.sh",
        tmp_path,
        "http://127.0.0.1:9",
        "tok",
        "n1",
        GPUFLEET_TIMEOUT_S="1",
        SLURM_JOB_ID="8",
        SLURM_JOB_GPUS="1",
    )
    assert r.returncode == 0 and (tmp_path / "jobs-n1" / "1").read_text() == "8\n"
