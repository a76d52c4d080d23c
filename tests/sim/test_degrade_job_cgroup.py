"""Cut-down bundles keep only the truth their data can show: a quota-bound loader's cause needs job_* columns."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpufleet.sim import write_bundle
from gpufleet.sim.degrade import degrade_bundle


@pytest.mark.parametrize(
    ("form", "cause", "job_columns"),
    [
        ("full", "cpu", True),
        ("dcgm", "cpu", True),
        ("nohost", None, True),
        ("nvsmi", None, False),
        ("bare", None, False),
    ],
)
def test_the_quota_bound_cause_is_scored_only_where_the_job_cgroup_is_kept(
    tmp_path: Path, form: str, cause: str | None, job_columns: bool
) -> None:
    out = tmp_path / form
    write_bundle("starvation_cpu_quota", out, duration_s=900)
    labels = degrade_bundle(out, form)
    (lab,) = [i for i in labels["incidents"] if i["kind"] == "starvation"]
    assert lab["cause"] == cause
    assert lab["evidence"]["host_shows_cause"] is False
    if form == "nvsmi":
        assert lab["cause_cut_because"].startswith("only the job's cgroup shows it")
    elif form in ("nohost", "bare"):
        assert lab["cause_cut_because"] == "no host data"
    with (out / "gpu.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert ("job_cpu_throttled_share" in header) == job_columns


def test_a_cause_the_host_shows_stays_in_the_nvsmi_form(tmp_path: Path) -> None:
    out = tmp_path / "b"
    write_bundle("starvation_cpu", out, duration_s=900)
    labels = degrade_bundle(out, "nvsmi")
    assert [i["cause"] for i in labels["incidents"] if i["kind"] == "starvation"] == ["cpu"]
