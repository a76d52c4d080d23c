"""Run attribution from per-GPU job files and from the processes on each GPU (a /proc tree in tmp)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.attribution import (
    Attributor,
    pick_run,
    pod_uid_from_cgroup,
    read_job_files,
    run_from_environ,
)
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.sim.nvml_fake import H100_SXM, FakeHandle, FakeNvml

POD = "5f0c2c5e-9c1b-4b7e-8f55-0e6cbb1e2a10"


def proc(root: Path, pid: int, env: dict[str, str] | None = None, cgroup: str = "0::/user.slice\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(
        b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {"PATH": "/bin"}).items())
    )
    (d / "cgroup").write_text(cgroup)


def rows(*gpus: int | tuple[int, int]) -> list[dict]:
    out = []
    for g in gpus:
        gpu, mig = g if isinstance(g, tuple) else (g, None)
        out.append({"gpu": gpu, "mig_instance": mig, "power_w": 100.0})
    return out


def test_job_files_name_the_run_per_gpu(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("slurm-4411\n")
    (jobs / "1").write_text("\n  slurm-4411  \nslurm-9\n")  # first non-empty line
    (jobs / "3").write_text("not a valid id!\n")
    (jobs / "README").write_text("ignored")
    assert read_job_files(jobs) == {0: "slurm-4411", 1: "slurm-4411"}
    assert read_job_files(tmp_path / "absent") == {}
    labelled = Attributor(jobs, tmp_path / "proc").label(rows(0, 1, 2, 3, (0, 3)))
    assert [r["run_id"] for r in labelled] == ["slurm-4411", "slurm-4411", None, None, "slurm-4411"]


def test_a_job_file_removed_by_the_epilog_unlabels_the_gpu(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("r1")
    att = Attributor(jobs, tmp_path)
    assert att.label(rows(0))[0]["run_id"] == "r1"
    (jobs / "0").unlink()
    assert att.label(rows(0))[0]["run_id"] is None


def test_environment_gives_the_run_gpufleet_id_first(tmp_path: Path) -> None:
    assert run_from_environ(b"A=1\0SLURM_JOB_ID=812\0GPUFLEET_RUN_ID=llm-7b-sweep\0") == "llm-7b-sweep"
    assert run_from_environ(b"SLURM_JOB_ID=812\0SLURM_JOB_NAME=train\0") == "812"
    assert run_from_environ(b"HOME=/root\0") is None
    assert run_from_environ(b"GPUFLEET_RUN_ID=\0SLURM_JOB_ID=9\0") == "9"


def test_pod_uid_from_cgroupfs_and_systemd_layouts() -> None:
    v1 = f"11:memory:/kubepods/burstable/pod{POD}/0a1b2c\n"
    v2 = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}.slice/cri-x.scope\n"
    assert pod_uid_from_cgroup(v1) == POD
    assert pod_uid_from_cgroup(v2) == POD
    assert pod_uid_from_cgroup("0::/system.slice/sshd.service\n") is None


def test_processes_on_the_gpu_name_the_run(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    proc(root, 100, {"SLURM_JOB_ID": "4411"})
    proc(root, 101, {"SLURM_JOB_ID": "4411"})
    proc(root, 200, cgroup=f"0::/kubepods/pod{POD}/c1\n")
    proc(root, 300)  # no run anywhere
    att = Attributor(None, root)
    out = att.label(rows(0, 1, 2, 3, (1, 5)), {0: [101, 100], 1: [200], 2: [300], 3: [999]})
    assert [r["run_id"] for r in out] == ["4411", POD, None, None, POD]


def test_job_files_win_over_processes_and_source_labels_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    proc(root, 100, {"SLURM_JOB_ID": "from-env"})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("from-file")
    r = rows(0, 1)
    r[1]["run_id"] = "from-source"
    out = Attributor(jobs, root).label(r, {0: [100], 1: [100]})
    assert [x["run_id"] for x in out] == ["from-file", "from-source"]
    # Process attribution can be turned off.
    assert Attributor(None, root, use_processes=False).label(rows(0), {0: [100]})[0]["run_id"] is None


def test_shared_gpu_goes_to_the_run_with_most_processes() -> None:
    assert pick_run([(10, "a"), (11, "b"), (12, "b")]) == "b"
    assert pick_run([(12, "a"), (11, "b")]) == "b"  # tie: lowest PID
    assert pick_run([(1, None)]) is None


def test_unreadable_environ_falls_back_to_cgroup_and_pid_cache_expires(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    proc(root, 100, cgroup=f"0::/kubepods/pod{POD}/c\n")
    (root / "100" / "environ").unlink()
    (root / "100" / "environ").mkdir()  # reading it raises an OSError, like EACCES would
    now = [0.0]
    att = Attributor(None, root, clock=lambda: now[0])
    assert att.label(rows(0), {0: [100]})[0]["run_id"] == POD
    # A cached answer is reused within 30 s; a PID that left the GPU is forgotten.
    (root / "100" / "cgroup").write_text("0::/\n")
    assert att.label(rows(0), {0: [100]})[0]["run_id"] == POD
    att.label(rows(0), {})
    assert att.label(rows(0), {0: [100]})[0]["run_id"] is None


class FakeWithProcesses(FakeNvml):
    """FakeNvml plus the optional process listing the attribution step reads."""

    def __init__(self, pids: dict[int, list[int]]) -> None:
        super().__init__([H100_SXM, H100_SXM])
        self.pids = pids

    def compute_processes(self, handle: FakeHandle) -> list[int]:
        self._enter("compute_processes", handle)
        return self.pids.get(handle.index, [])


def test_nvml_source_lists_pids_per_gpu() -> None:
    src = NvmlSource(FakeWithProcesses({0: [42, 41], 1: []}), sys_root="/nonexistent")
    assert src.processes() == {0: [41, 42], 1: []}
    # A binding without a process listing answers nothing, once, not an error.
    plain = NvmlSource(FakeNvml([H100_SXM]), sys_root="/nonexistent")
    assert plain.processes() == {}
    assert plain.processes() == {}
