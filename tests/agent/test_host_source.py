"""The host source against sysstat's own golden outputs and real /proc captures.

``realdata/sysstat`` holds five successive /proc snapshots and the ``mpstat``
and ``iostat`` output sysstat's test suite computed from them (``iostat -x 1 2``
and ``mpstat -T -P ALL 1 2`` start at root1 and move one root per sample; the
first report is "since boot").  Feeding the same snapshots through
:mod:`gpufleet.agent.sources.host` must give the same numbers within print rounding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet.agent.sources.base import SourceError
from gpufleet.agent.sources.host import (
    CpuTimes,
    DiskCounters,
    HostSnapshot,
    HostSource,
    NetCounters,
    cpu_percentages,
    disk_rates,
    host_rates,
    is_physical_nic,
    is_stacked_disk,
    is_whole_disk,
    parse_diskstats,
    parse_net_dev,
    parse_proc_stat,
    rapl_power_w,
    read_rapl,
    read_snapshot,
)
from tests.conftest import realdata

CPU_KEYS = ("cpu_user_pct", "cpu_system_pct", "cpu_iowait_pct", "cpu_idle_pct")


def sysstat_root(i: int) -> Path:
    return realdata("sysstat", f"root{i}", "proc")


def snapshots() -> list[HostSnapshot]:
    return [read_snapshot(sysstat_root(i), None, rapl=False) for i in range(1, 6)]


def since_boot(s: HostSnapshot) -> HostSnapshot:
    """The all-zero reading sysstat compares with for its first report."""
    return HostSnapshot(
        uptime_s=0.0,
        cpus={n: CpuTimes() for n in s.cpus},
        disks={n: DiskCounters(0, 0, 0, 0, 0, 0, 0) for n in s.disks},
        nets={n: NetCounters(0, 0, 0, 0) for n in s.nets},
    )


def mpstat_all_rows(path: Path) -> list[dict[str, float]]:
    """The "all" rows of an mpstat report: %usr %sys %iowait %idle."""
    rows = []
    header: list[str] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if "%usr" in parts:
            header = parts
        elif len(parts) > 2 and parts[1] == "all" and not parts[0].startswith("Average"):
            nums = [float(x) for x in parts[2:]]
            names = header[-len(nums) :]
            got = dict(zip(names, nums, strict=True))
            rows.append(
                {
                    "cpu_user_pct": got["%usr"],
                    "cpu_system_pct": got["%sys"],
                    "cpu_iowait_pct": got["%iowait"],
                    "cpu_idle_pct": got["%idle"],
                }
            )
    return rows


def iostat_x_reports(path: Path) -> list[dict[str, dict[str, float]]]:
    """Per-device columns of each ``iostat -x`` report."""
    reports: list[dict[str, dict[str, float]]] = []
    header: list[str] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["Device"]:
            header = parts[1:]
            reports.append({})
        elif header and len(parts) == len(header) + 1 and re.match(r"^[a-z]", parts[0]):
            reports[-1][parts[0]] = dict(zip(header, (float(x) for x in parts[1:]), strict=True))
        elif not parts:
            header = header if reports and not reports[-1] else []
    return reports


# --------------------------------------------------------------------------- mpstat


def test_cpu_since_boot_matches_mpstat() -> None:
    s1 = snapshots()[0]
    expected = mpstat_all_rows(realdata("sysstat", "expected.mpstat"))[0]
    got = host_rates(since_boot(s1), s1)
    for key in CPU_KEYS:
        assert got[key] == pytest.approx(expected[key], abs=0.006), key


def test_cpu_intervals_match_mpstat_with_cpus_going_offline() -> None:
    """root1->root2 loses CPU 8, root2->root3 loses CPU 6 and CPU 7's iowait goes backwards."""
    expected = mpstat_all_rows(realdata("sysstat", "expected.mpstat-T"))
    src = HostSource(sys_root=None)
    rows = [src.update(s) for s in snapshots()[:3]]
    assert len(expected) == 2
    for got, want in zip(rows[1:], expected, strict=True):
        for key in CPU_KEYS:
            assert got[key] == pytest.approx(want[key], abs=0.006), key
    assert [r["cpu_count"] for r in rows] == [9, 8, 7]


def test_cpu_coming_back_online_sits_out_its_first_interval() -> None:
    """CPU 8 returns in root4 with counters restarted from zero: it must not add a jump."""
    snaps = snapshots()
    src = HostSource(sys_root=None)
    for s in snaps[:3]:
        src.update(s)
    row = src.update(snaps[3])
    online_both = {n: snaps[3].cpus[n] for n in snaps[2].cpus if n in snaps[3].cpus}
    assert 8 not in snaps[2].cpus and 8 in snaps[3].cpus
    expected = cpu_percentages(snaps[2].cpus, online_both)
    assert expected is not None
    for key in CPU_KEYS:
        assert row[key] == pytest.approx(expected[key])
    assert row["cpu_count"] == 8


def test_user_excludes_guest_and_system_excludes_irq() -> None:
    prev = {0: CpuTimes(user=100, system=50, idle=100, irq=10, softirq=10, guest=40)}
    curr = {0: CpuTimes(user=160, system=70, idle=140, irq=20, softirq=20, guest=80)}
    got = cpu_percentages(prev, curr)
    assert got is not None
    # interval = 60 user + 20 sys + 40 idle + 10 irq + 10 soft = 140 jiffies
    assert got["cpu_user_pct"] == pytest.approx(100 * 20 / 140)
    assert got["cpu_system_pct"] == pytest.approx(100 * 20 / 140)
    assert got["cpu_idle_pct"] == pytest.approx(100 * 40 / 140)


# --------------------------------------------------------------------------- iostat -x


def check_device(rates, columns: dict[str, float], name: str, prev: DiskCounters, curr: DiskCounters) -> None:
    """Compare with iostat's columns; await against r/w/d_await weighted by the exact I/O counts."""
    assert rates is not None, name
    assert rates.read_bytes_s / 1024 == pytest.approx(columns["rkB/s"], abs=0.006), name
    assert rates.write_bytes_s / 1024 == pytest.approx(columns["wkB/s"], abs=0.006), name
    assert rates.util_pct == pytest.approx(columns["%util"], abs=0.006), name
    counts = (curr.rd_ios - prev.rd_ios, curr.wr_ios - prev.wr_ios, curr.dc_ios - prev.dc_ios)
    ios = sum(counts)
    if ios:
        weighted = (
            columns["r_await"] * counts[0] + columns["w_await"] * counts[1] + columns["d_await"] * counts[2]
        ) / ios
        assert rates.await_ms == pytest.approx(weighted, rel=0.01, abs=0.01), name
    else:
        assert rates.await_ms == 0.0


def test_disks_match_iostat_x_since_boot_and_first_interval() -> None:
    reports = iostat_x_reports(realdata("sysstat", "expected.iostat-x"))
    assert len(reports) == 2 and "sdr" in reports[1]
    s1, s2 = snapshots()[:2]
    pairs = [(since_boot(s1), s1), (s1, s2)]
    for (prev, curr), report in zip(pairs, reports, strict=True):
        interval = curr.uptime_s - prev.uptime_s
        for name, columns in report.items():
            p, c = prev.disks[name], curr.disks[name]
            check_device(disk_rates(p, c, interval), columns, name, p, c)
        row = host_rates(prev, curr)
        busiest = max(report.values(), key=lambda c: c["%util"])
        assert row["disk_util_pct"] == pytest.approx(busiest["%util"], abs=0.006)
        assert row["disk_read_bytes_s"] / 1024 == pytest.approx(
            sum(c["rkB/s"] for c in report.values()), abs=0.05
        )
        assert row["disk_write_bytes_s"] / 1024 == pytest.approx(
            sum(c["wkB/s"] for c in report.values()), abs=0.05
        )


def test_disks_match_iostat_second_interval_except_the_reregistered_device() -> None:
    """iostat's third report (root2->root3): sdb was unregistered and came back.

    iostat then counts sdb from zero ("since boot"); we skip it for that
    interval instead, since its counters restarted at an unknown time.
    """
    text = realdata("sysstat", "expected.iostat").read_text()
    third = text.split("Device")[3]
    expected = {p[0]: float(p[2]) for p in (ln.split() for ln in third.splitlines()[1:]) if len(p) == 8}
    snaps = snapshots()
    interval = snaps[2].uptime_s - snaps[1].uptime_s
    for name in ("sda", "sdq", "sdr", "sds"):
        rates = disk_rates(snaps[1].disks[name], snaps[2].disks[name], interval)
        assert rates is not None
        assert rates.read_bytes_s / 1024 == pytest.approx(expected[name], abs=0.006), name
    assert disk_rates(snaps[1].disks["sdb"], snaps[2].disks["sdb"], interval) is None


def test_vanished_device_drops_out_and_new_device_waits_an_interval() -> None:
    snaps = snapshots()
    s3, s4, s5 = snaps[2], snaps[3], snaps[4]
    assert "sdq" in s3.disks and "sdq" not in s4.disks and "sdq" in s5.disks
    assert "sdf" not in s3.disks and "sdf" in s4.disks
    row = host_rates(s3, s4)
    # sda and sds went backwards (reset) and sdq vanished; only sdr and
    # the never-used devices remain comparable.
    interval = s4.uptime_s - s3.uptime_s
    sdr = disk_rates(s3.disks["sdr"], s4.disks["sdr"], interval)
    assert sdr is not None
    assert disk_rates(s3.disks["sda"], s4.disks["sda"], interval) is None
    assert disk_rates(s3.disks["sds"], s4.disks["sds"], interval) is None
    assert row["disk_read_bytes_s"] == pytest.approx(sdr.read_bytes_s)
    assert row["disk_read_bytes_s"] >= 0 and row["disk_write_bytes_s"] >= 0
    # root4 -> root5: sdq is new again, sdg (registered in root4) now counts.
    row5 = host_rates(s4, s5)
    sdg = disk_rates(s4.disks["sdg"], s5.disks["sdg"], s5.uptime_s - s4.uptime_s)
    assert sdg is not None and sdg.read_bytes_s > 0
    assert row5["disk_read_bytes_s"] is not None and row5["disk_read_bytes_s"] >= sdg.read_bytes_s


def test_tick_counter_wrap_is_not_a_reset() -> None:
    prev = DiskCounters(
        rd_ios=10,
        rd_sectors=80,
        rd_ticks_ms=2**32 - 100,
        wr_ios=0,
        wr_sectors=0,
        wr_ticks_ms=0,
        io_ticks_ms=2**32 - 300,
    )
    curr = DiskCounters(
        rd_ios=20, rd_sectors=160, rd_ticks_ms=100, wr_ios=0, wr_sectors=0, wr_ticks_ms=0, io_ticks_ms=200
    )
    rates = disk_rates(prev, curr, 1.0)
    assert rates is not None
    assert rates.util_pct == pytest.approx(50.0)
    assert rates.await_ms == pytest.approx(20.0)


# --------------------------------------------------------------------------- network


def test_network_sums_physical_interfaces_and_skips_reset_ones() -> None:
    snaps = snapshots()
    s2, s3 = snaps[1], snaps[2]
    assert set(s2.nets) == {"enp6s0", "wlp5s0"}  # lo, virbr0*, virbr0-nic are virtual
    row = host_rates(s2, s3)
    interval = s3.uptime_s - s2.uptime_s
    # enp6s0 was re-registered (counters fell): only wlp5s0 counts.
    rx = s3.nets["wlp5s0"].rx_bytes - s2.nets["wlp5s0"].rx_bytes
    tx = s3.nets["wlp5s0"].tx_bytes - s2.nets["wlp5s0"].tx_bytes
    assert row["net_rx_bytes_s"] == pytest.approx(rx / interval)
    assert row["net_tx_bytes_s"] == pytest.approx(tx / interval)


def test_network_32bit_wrap_versus_reset() -> None:
    base = dict(uptime_s=10.0, cpus={0: CpuTimes(idle=100)})
    prev = HostSnapshot(nets={"eth0": NetCounters(2**32 - 1000, 50, 10, 5)}, **base)  # type: ignore[arg-type]
    wrapped = HostSnapshot(nets={"eth0": NetCounters(1000, 60, 20, 6)}, **{**base, "uptime_s": 12.0})  # type: ignore[arg-type]
    assert host_rates(prev, wrapped)["net_rx_bytes_s"] == pytest.approx(1000.0)
    reset = HostSnapshot(nets={"eth0": NetCounters(1000, 3, 20, 6)}, **{**base, "uptime_s": 12.0})  # type: ignore[arg-type]
    assert host_rates(prev, reset)["net_rx_bytes_s"] is None


def test_procfs_net_dev_parses() -> None:
    nets = parse_net_dev(realdata("procfs", "proc", "net", "dev").read_text())
    assert nets and all(c.rx_bytes >= 0 and c.tx_bytes >= 0 for c in nets.values())
    assert "lo" in nets


# --------------------------------------------------------------------------- first reading, reboot, errors


def test_first_collect_has_null_rates_not_zeros(tmp_path: Path) -> None:
    link = tmp_path / "proc"
    link.symlink_to(sysstat_root(1))
    src = HostSource(proc_root=link, sys_root=None)
    first = src.collect().host
    assert first is not None
    assert first["cpu_count"] == 9
    for key in (*CPU_KEYS, "disk_read_bytes_s", "disk_util_pct", "net_rx_bytes_s", "host_power_w"):
        assert first[key] is None, key
    link.unlink()
    link.symlink_to(sysstat_root(2))
    second = src.collect().host
    assert second is not None
    assert second["cpu_user_pct"] == pytest.approx(2.15, abs=0.006)
    assert second["disk_util_pct"] == pytest.approx(6.42, abs=0.006)


def test_uptime_going_backwards_means_reboot_and_null_rates() -> None:
    s1, s2 = snapshots()[:2]
    row = host_rates(s2, s1)
    assert all(row[k] is None for k in (*CPU_KEYS, "disk_read_bytes_s", "net_rx_bytes_s"))


def test_missing_proc_stat_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="stat"):
        HostSource(proc_root=tmp_path, sys_root=None).collect()


def test_configured_host_power_is_reported_from_the_first_sample(tmp_path: Path) -> None:
    src = HostSource(proc_root=sysstat_root(1), sys_root=None, host_power_w=350.0)
    row = src.collect().host
    assert row is not None and row["host_power_w"] == 350.0


# --------------------------------------------------------------------------- telegraf /proc/stat edge cases


def telegraf_stat(case: str, n: int) -> dict[int, CpuTimes]:
    return parse_proc_stat(realdata("telegraf_cpu_testcases", case, f"proc{n}", "stat").read_text())


def telegraf_expected(case: str, n: int, cpu: str) -> dict[str, float]:
    text = realdata("telegraf_cpu_testcases", case, f"proc{n}", "expected.out").read_text()
    for line in text.splitlines():
        if f"cpu={cpu} " in line:
            fields = dict(kv.split("=") for kv in line.split()[1].split(","))
            return {
                "cpu_user_pct": float(fields["usage_user"]),
                "cpu_system_pct": float(fields["usage_system"]),
                "cpu_iowait_pct": float(fields["usage_iowait"]),
                "cpu_idle_pct": float(fields["usage_idle"]),
            }
    raise AssertionError(f"no {cpu} line")


def test_telegraf_default_case_matches_cpu_total() -> None:
    got = cpu_percentages(telegraf_stat("default", 0), telegraf_stat("default", 1))
    want = telegraf_expected("default", 1, "cpu-total")
    assert got is not None
    for key in CPU_KEYS:
        assert got[key] == pytest.approx(want[key], abs=0.01), key


def test_cpu_times_going_backwards_skip_the_interval_then_recover() -> None:
    """telegraf reports an error for proc0->proc1; we give NULL, then the proc1->proc2 numbers."""
    p0, p1, p2 = (telegraf_stat("cpu_times_decrease", n) for n in range(3))
    assert cpu_percentages(p0, p1) is None
    got = cpu_percentages(p1, p2)
    want = telegraf_expected("cpu_times_decrease", 2, "cpu-total")
    assert got is not None
    for key in CPU_KEYS:
        assert got[key] == pytest.approx(want[key], abs=1e-9), key


def test_cpu_count_decrease_counts_the_cpus_still_online() -> None:
    """CPU 1 disappears (LXC resize): "all" is what the remaining CPU did, as mpstat shows it."""
    p0, p1 = telegraf_stat("cpu_count_decrease", 0), telegraf_stat("cpu_count_decrease", 1)
    got = cpu_percentages(p0, p1)
    want = telegraf_expected("cpu_count_decrease", 1, "cpu0")
    assert got is not None and len(p1) == 1
    for key in CPU_KEYS:
        assert got[key] == pytest.approx(want[key], abs=1e-9), key


# --------------------------------------------------------------------------- diskstats layouts and device selection


def test_node_exporter_diskstats_with_14_18_and_20_field_lines() -> None:
    disks = parse_diskstats(realdata("node_exporter", "proc", "diskstats").read_text())
    assert disks["sda"].rd_ios == 25354637 and disks["sda"].io_ticks_ms == 9653880
    assert disks["sdb"].dc_ios == 68851 and disks["sdb"].dc_sectors == 1925173784  # 18 fields
    assert disks["sdc"].dc_ios == 18851 and disks["sdc"].dc_ticks_ms == 11130  # 20 fields
    whole = sorted(n for n in disks if is_whole_disk(n, None))
    assert "sda" in whole and "nvme0n1" in whole and "mmcblk0" in whole and "dm-0" in whole
    for name in ("sda1", "nvme0n1p1", "mmcblk0p1", "vda1", "ram0", "loop0"):
        assert name not in whole, name
    assert is_stacked_disk("dm-0", None) and not is_stacked_disk("sda", None)


def test_sysfs_decides_disks_stacking_and_physical_nics(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    (sys_root / "block" / "sda").mkdir(parents=True)
    (sys_root / "block" / "dm-0" / "slaves" / "sda").mkdir(parents=True)
    (sys_root / "block" / "cciss!c0d0").mkdir(parents=True)
    (sys_root / "class" / "net" / "ens1f0" / "device").mkdir(parents=True)
    (sys_root / "class" / "net" / "docker0").mkdir(parents=True)
    assert is_whole_disk("sda", sys_root) and not is_whole_disk("sda1", sys_root)
    assert is_whole_disk("cciss/c0d0", sys_root)
    assert is_stacked_disk("dm-0", sys_root) and not is_stacked_disk("sda", sys_root)
    assert is_physical_nic("ens1f0", sys_root) and not is_physical_nic("docker0", sys_root)


def test_stacked_devices_are_not_summed_twice() -> None:
    cpus = {0: CpuTimes(idle=100)}
    d0 = DiskCounters(0, 0, 0, 0, 0, 0, 0)
    d1 = DiskCounters(
        rd_ios=10, rd_sectors=2048, rd_ticks_ms=50, wr_ios=0, wr_sectors=0, wr_ticks_ms=0, io_ticks_ms=500
    )
    prev = HostSnapshot(1.0, cpus, {"sda": d0, "dm-0": d0}, frozenset({"dm-0"}))
    curr = HostSnapshot(2.0, {0: CpuTimes(idle=200)}, {"sda": d1, "dm-0": d1}, frozenset({"dm-0"}))
    row = host_rates(prev, curr)
    assert row["disk_read_bytes_s"] == pytest.approx(2048 * 512)
    assert row["disk_util_pct"] == pytest.approx(50.0)


# --------------------------------------------------------------------------- RAPL


def write_zone(base: Path, name: str, kind: str, energy_uj: int, max_uj: int = 262143328850) -> None:
    zone = base / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "name").write_text(kind + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_packages_plus_dram_with_wrap(tmp_path: Path) -> None:
    base = tmp_path / "class" / "powercap"
    write_zone(base, "intel-rapl:0", "package-0", 262143328850 - 1_000_000)
    write_zone(base, "intel-rapl:0:0", "dram", 5_000_000)
    write_zone(base, "intel-rapl:0:1", "core", 7_000_000)
    first = read_rapl(tmp_path)
    assert set(first) == {"intel-rapl:0", "intel-rapl:0:0"}
    write_zone(base, "intel-rapl:0", "package-0", 99_000_000)  # wrapped: +100 J
    write_zone(base, "intel-rapl:0:0", "dram", 25_000_000)  # +20 J
    second = read_rapl(tmp_path)
    assert rapl_power_w(first, second, 2.0) == pytest.approx(60.0)


def test_rapl_psys_covers_the_platform_alone(tmp_path: Path) -> None:
    base = tmp_path / "class" / "powercap"
    write_zone(base, "intel-rapl:0", "package-0", 1)
    write_zone(base, "intel-rapl:1", "psys", 2)
    assert set(read_rapl(tmp_path)) == {"intel-rapl:1"}
