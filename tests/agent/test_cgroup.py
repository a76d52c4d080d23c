"""The cgroup reader on real cgroup v1 and v2 trees (tests/fixtures/hostfs, provenance in its SOURCES.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.agent.sources.cgroup import (
    CgroupReader,
    parse_blkio_bytes,
    parse_cpu_max,
    parse_io_stat,
    parse_pressure,
    parse_proc_cgroup,
    rates,
    resolve_path,
)

HOSTFS = Path(__file__).resolve().parents[1] / "fixtures" / "hostfs"
K8S_LEAF = (
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7a96c459_d529_44ae_9f99_90d3798d6426.slice/"
    "cri-containerd-1d3d308a7d48a27814a68bf33a44acf4441c9c02463ca0bc1cdfdc8c0b4a8496.scope"
)
DOCKER_ID = "b29faf21b7eff959f64b4192c34d5d67a707fe8561e9eaa608cb27693fba4242"
V2_SCOPE = "system.slice/docker-1c8fa019edd4b9d4b2856f4932c55929c5c118c808ed5faee9a135ca6e84b039.scope"


def tree(name: str) -> Path:
    path = HOSTFS / name
    assert path.is_dir(), f"fixture missing: {path} (see tests/fixtures/hostfs/SOURCES.md)"
    return path


def reader(root: Path) -> CgroupReader:
    return CgroupReader(root / "proc", root / "sys")


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(tree(name), dst, symlinks=True)
    return dst


def test_proc_cgroup_lines_of_v1_v2_and_a_namespace() -> None:
    lines = parse_proc_cgroup((tree("cgroup_v1_k8s") / "proc/493239/cgroup").read_text())
    assert len(lines) == 12
    cpu = next(x for x in lines if "cpu" in x.controllers)
    assert cpu.hierarchy == 5 and cpu.controllers == ("cpu", "cpuacct") and cpu.path == "/" + K8S_LEAF
    assert lines[-1].hierarchy == 0 and lines[-1].controllers == () and lines[-1].path == "/"
    ns = parse_proc_cgroup((tree("cgroup_v2_ns") / "proc/2233801/cgroup").read_text())
    assert [(x.hierarchy, x.path) for x in ns] == [(0, "/../../user-1000.slice/session-520.scope")]
    assert parse_proc_cgroup("garbage\nx:cpu:/a\n3:cpu:/b\n") == parse_proc_cgroup("3:cpu:/b")


def test_kubernetes_container_on_cgroup_v1() -> None:
    root = tree("cgroup_v1_k8s")
    r = reader(root)
    place = r.locate(493239)
    assert place is not None and place.version == 1
    assert place.cpu_dir == root / "sys/fs/cgroup/cpu,cpuacct" / K8S_LEAF
    assert place.name == "/" + K8S_LEAF
    assert place.cpuset_dir == root / "sys/fs/cgroup/cpuset" / K8S_LEAF
    stats = r.read(place)
    # cpu.cfs_quota_us -1: no CFS quota; the cpuset (0-7) cannot be judged without the host's CPU count.
    assert stats.quota.cores is None and stats.quota.cfs_cores is None
    assert stats.usage_usec == 124659500367000 // 1000
    assert (stats.nr_periods, stats.nr_throttled, stats.throttled_usec) == (0, 0, 0)
    assert (stats.io_read_bytes, stats.io_write_bytes) == (3448832, 25203200)
    assert stats.cpu_some_usec is None and stats.io_some_usec is None  # v1: no pressure files
    assert 493239 in r.pids(place)
    # Host PID 1 sits in the root cgroup of every hierarchy.
    init = r.locate(1)
    assert init is not None and init.cpu_dir == root / "sys/fs/cgroup/cpu,cpuacct" and init.name == "/"


def test_docker_container_on_cgroup_v1_with_cpu_and_cpuacct_apart() -> None:
    root = tree("cgroup_v1_docker")
    r = reader(root)
    place = r.locate(985)
    assert place is not None and place.version == 1
    assert place.cpu_dir == root / "sys/fs/cgroup/cpu/docker" / DOCKER_ID
    assert place.cpuacct_dir == root / "sys/fs/cgroup/cpuacct/docker" / DOCKER_ID
    stats = r.read(place)
    assert stats.usage_usec == 95996653175 // 1000
    assert (stats.nr_periods, stats.nr_throttled, stats.throttled_usec) == (
        769021,
        1046,
        352597023453 // 1000,
    )
    assert stats.quota.cores is None  # -1 on the container, on docker/ and at the root


def test_docker_container_on_cgroup_v2_with_pressure_and_io() -> None:
    root = tree("cgroup_v2_docker")
    r = reader(root)
    place = r.locate(312)
    assert place is not None and place.version == 2 and place.cpu_dir == root / "sys/fs/cgroup" / V2_SCOPE
    stats = r.read(place)
    assert stats.quota.cores is None  # "max 100000" here and on system.slice
    assert stats.usage_usec == 26772130245
    assert (stats.nr_periods, stats.nr_throttled, stats.throttled_usec) == (1, 4, 10)
    assert stats.cpu_some_usec == 1676316 and stats.cpu_some_avg10 == pytest.approx(4.30)
    assert stats.io_some_usec == 1154482 and stats.io_full_usec == 1154482
    assert (stats.io_read_bytes, stats.io_write_bytes) == (512 + 1024, 4096 + 4096)


def test_a_namespace_relative_path_is_found_below_the_root() -> None:
    root = tree("cgroup_v2_ns")
    r = reader(root)
    place = r.locate(2233801)
    assert place is not None and place.version == 2
    assert place.cpu_dir == root / "sys/fs/cgroup/user.slice/user-1000.slice/session-520.scope"
    assert place.path == "/../../user-1000.slice/session-520.scope"
    assert place.name == "/user.slice/user-1000.slice/session-520.scope"
    assert 2233801 in r.pids(place)
    stats = r.read(place)
    assert stats.usage_usec == 3611347518 and stats.nr_periods == 0
    assert stats.cpu_some_usec == 115056064 and stats.cpu_full_usec == 29254180
    assert stats.io_some_usec == 10748370 and stats.quota.cores is None


def test_an_ambiguous_or_missing_namespace_path_is_not_guessed(tmp_path: Path) -> None:
    base = tmp_path / "cg"
    (base / "a.slice" / "job.scope").mkdir(parents=True)
    (base / "b.slice" / "job.scope").mkdir(parents=True)
    (base / "c.slice" / "x" / "only.scope").mkdir(parents=True)
    assert resolve_path(base, "/../../job.scope") is None
    assert resolve_path(base, "/../only.scope") == base / "c.slice" / "x" / "only.scope"
    assert resolve_path(base, "/../nowhere.scope") is None
    assert resolve_path(base, "/a.slice/job.scope") == base / "a.slice" / "job.scope"
    assert resolve_path(base, "/a.slice/../b.slice") is None


def test_rates_between_two_readings(tmp_path: Path) -> None:
    root = copy("cgroup_v2_docker", tmp_path)
    scope = root / "sys/fs/cgroup" / V2_SCOPE
    r = reader(root)
    place = r.locate(312)
    assert place is not None
    first = r.read(place)
    assert rates(None, first, None).cpu_cores is None  # nothing to subtract from
    # Two seconds later: 5.5 CPU-seconds used, 30 of 40 new periods throttled, 1.2 s of CPU stall.
    (scope / "cpu.max").write_text("600000 100000\n")
    (scope / "cpu.stat").write_text(
        "usage_usec 26777630245\nuser_usec 1\nsystem_usec 1\nnr_periods 41\n"
        "nr_throttled 34\nthrottled_usec 2000010\n"
    )
    (scope / "cpu.pressure").write_text("some avg10=50.0 avg60=3.20 avg300=1.11 total=2876316\n")
    (scope / "io.pressure").write_text(
        "some avg10=3.00 avg60=2.10 avg300=4.00 total=1254482\n"
        "full avg10=10.00 avg60=30.00 avg300=0.50 total=1154482\n"
    )
    second = r.read(place)
    assert second.quota.cores == pytest.approx(6.0) and second.quota.kind == "cfs"
    got = rates(first, second, 2.0)
    assert got.cpu_cores == pytest.approx(2.75)
    assert got.cpu_quota_cores == pytest.approx(6.0)
    assert got.cpu_throttled_share == pytest.approx(30 / 40)
    assert got.cpu_pressure_pct == pytest.approx(60.0)
    assert got.io_pressure_pct == pytest.approx(5.0)
    assert got.catalog()["job_cpu_throttled_share"] == pytest.approx(0.75)
    # A counter that went backwards (the cgroup re-created under its name) is no rate at all.
    (scope / "cpu.stat").write_text("usage_usec 10\nnr_periods 1\nnr_throttled 0\n")
    again = rates(second, r.read(place), 2.0)
    assert again.cpu_cores is None and again.cpu_throttled_share is None


def test_the_tightest_quota_on_the_path_binds_and_usage_is_read_there(tmp_path: Path) -> None:
    cg = tmp_path / "sys/fs/cgroup"
    pod = cg / "kubepods.slice/kubepods-pod1.slice"
    leaf = pod / "cri-containerd-abc.scope"
    leaf.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / "kubepods.slice" / "cpu.max").write_text("max 100000\n")
    (pod / "cpu.max").write_text("400000 100000\n")
    (pod / "cpu.stat").write_text("usage_usec 9000000\nnr_periods 100\nnr_throttled 80\nthrottled_usec 5\n")
    (leaf / "cpu.max").write_text("800000 100000\n")
    (leaf / "cpu.stat").write_text("usage_usec 7000000\nnr_periods 100\nnr_throttled 0\nthrottled_usec 0\n")
    (tmp_path / "proc/42").mkdir(parents=True)
    (tmp_path / "proc/42/cgroup").write_text(
        "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n"
    )
    r = reader(tmp_path)
    place = r.locate(42)
    assert place is not None and place.cpu_dir == leaf
    s = r.read(place)
    assert s.quota.cores == pytest.approx(4.0) and s.quota.cfs_dir == pod
    assert s.usage_usec == 9000000 and s.nr_throttled == 80  # the pod's, where the 4 cores bind


def test_a_cpuset_narrower_than_the_host_is_the_limit(tmp_path: Path) -> None:
    cg = tmp_path / "sys/fs/cgroup"
    job = cg / "system.slice/slurmstepd.scope/job_77"
    job.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu\n")
    (job / "cpu.max").write_text("max 100000\n")
    (job / "cpuset.cpus.effective").write_text("0-5,96-101\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-191\n")
    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "proc/7/cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77\n")
    r = reader(tmp_path)
    place = r.locate(7)
    assert place is not None
    q = r.quota(place)
    assert q.cores == 12.0 and q.kind == "cpuset" and q.cfs_cores is None
    (job / "cpuset.cpus.effective").write_text("0-191\n")
    assert CgroupReader(tmp_path / "proc", tmp_path / "sys").quota(place).cores is None  # the whole host


def test_v1_quota_on_an_ancestor(tmp_path: Path) -> None:
    root = copy("cgroup_v1_docker", tmp_path)
    (root / "sys/fs/cgroup/cpu/docker/cpu.cfs_quota_us").write_text("250000\n")
    r = reader(root)
    place = r.locate(985)
    assert place is not None
    s = r.read(place)
    assert s.quota.cores == pytest.approx(2.5) and s.quota.cfs_dir == root / "sys/fs/cgroup/cpu/docker"
    # usage and throttling where the quota binds: docker/ in both hierarchies
    assert s.usage_usec == 95996728295 // 1000 and s.nr_periods == 0


def test_file_parsers_refuse_what_is_not_a_count() -> None:
    assert parse_cpu_max("max 100000") is None
    assert parse_cpu_max("150000 100000") == 1.5
    assert parse_cpu_max("150000") == 1.5
    assert parse_cpu_max("x 1") is None and parse_cpu_max("") is None and parse_cpu_max("0 100000") is None
    p = parse_pressure("some avg10=1.5 avg60=0 avg300=0 total=12\nfull avg10=0.1 total=x\n")
    assert p["some"]["total"] == 12 and "total" not in p["full"]
    assert parse_io_stat("8:0 rbytes=10 wbytes=20 rios=1\n8:16 rbytes=18446743919241604546 wbytes=1\n") == (
        10,
        21,
    )
    assert parse_blkio_bytes("8:0 Read 5\n8:0 Write 7\n8:0 Total 12\nTotal 12\n") == (5, 7)


def test_a_vanished_process_or_missing_hierarchy_is_none(tmp_path: Path) -> None:
    r = reader(tree("cgroup_v1_k8s"))
    assert r.locate(999999) is None
    empty = CgroupReader(tmp_path / "proc", tmp_path / "sys")
    (tmp_path / "proc/5").mkdir(parents=True)
    (tmp_path / "proc/5/cgroup").write_text("0::/a.scope\n")
    assert empty.locate(5) is None
