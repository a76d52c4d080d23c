"""The nvml source over the faithful fake: units, NULLs, MIG, XID, lost GPUs, facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.sources.base import FactsSource, Reading, Source, SourceError
from gpufleet.agent.sources.nvml import NVML_FIELDS, NvmlSource, format_cpu_list, sysfs_bus_id
from gpufleet.agent.sources.nvml_api import NotSupported, NvmlError
from gpufleet.catalog import GPU_BY_NAME, THROTTLE_SW_POWER_CAP, WHOLE_GPU_FIELDS
from gpufleet.sim.nvml_fake import PROFILES, FakeNvml


class ManualClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def make(*keys: str, **kw: object) -> tuple[NvmlSource, FakeNvml]:
    fake = FakeNvml([PROFILES[k] for k in keys], **kw)  # type: ignore[arg-type]
    return NvmlSource(fake, sys_root="/nonexistent"), fake


def by_key(reading: Reading) -> dict[tuple[int, int | None], dict]:
    return {(r["gpu"], r["mig_instance"]): r for r in reading.gpus}


def test_is_a_source_with_facts() -> None:
    src, _ = make("h100")
    assert isinstance(src, Source) and isinstance(src, FactsSource)
    assert src.name == "nvml"


def test_h100_row_in_catalog_units() -> None:
    src, fake = make("h100")
    fake.gpu(0).load()
    row = by_key(src.collect())[(0, None)]
    assert row["uuid"] == fake.gpu(0).uuid
    assert row["util_pct"] == 100
    assert row["power_w"] == pytest.approx(588.39)
    assert row["power_limit_w"] == 700.0
    assert row["mem_total_mib"] == 81559 and row["mem_used_mib"] == 19818
    assert row["sm_clock_mhz"] == 1980 and row["sm_clock_max_mhz"] == 1980 and row["mem_clock_mhz"] == 2619
    assert row["temp_c"] == 59 and row["mem_temp_c"] == 55
    assert (
        row["pcie_gen"] == 5 and row["pcie_gen_max"] == 5 and row["pcie_width"] == row["pcie_width_max"] == 16
    )
    assert row["pcie_tx_bytes_s"] == 352 * 1024 and row["pcie_rx_bytes_s"] == 329 * 1024
    assert row["throttle_reasons"] == 0 and row["ecc_dbe_vol"] == 0 and row["xid"] == 0
    assert set(row) <= set(NVML_FIELDS) | {"gpu"}
    assert all(name in GPU_BY_NAME for name in row if name != "gpu")
    # NVML cannot measure profiling ratios: the keys are absent, not 0.
    for absent in ("sm_active", "tensor_active", "dram_active"):
        assert absent not in row
    # NVLink rates need two readings of the cumulative counters: NULL on the first collect.
    assert row["nvlink_tx_bytes_s"] is None and row["nvlink_rx_bytes_s"] is None


def test_unsupported_reading_is_null_and_not_asked_again() -> None:
    src, fake = make("l40s")
    first = src.collect().gpus[0]
    assert first["mem_temp_c"] is None and first["temp_c"] == 64
    src.collect()
    src.collect()
    assert fake.calls["memory_temperature_c"] == 1
    assert fake.calls["gpu_temperature_c"] == 3


def test_mig_whole_gpu_fields_only_on_the_parent_row() -> None:
    src, fake = make("h100-mig")
    fake.gpu(0).power_w = 432.21
    rows = by_key(src.collect())
    assert set(rows) == {(0, None), (0, 2), (0, 3), (0, 9), (0, 10)}
    parent = rows[(0, None)]
    assert parent["power_w"] == pytest.approx(432.21) and parent["energy_mj"] is not None
    assert parent["util_pct"] is None  # NVML: no GPU-Util in MIG mode
    for gi, total in ((2, 40448), (3, 20096), (9, 9984), (10, 9984)):
        inst = rows[(0, gi)]
        assert inst["mem_total_mib"] == total
        assert inst["uuid"].startswith("MIG-")
        for name in WHOLE_GPU_FIELDS:
            assert inst[name] is None, name
    energies = [r["energy_mj"] for r in rows.values() if r["energy_mj"] is not None]
    assert len(energies) == 1


def test_energy_counter_follows_power_between_collects() -> None:
    clock = ManualClock()
    src, fake = make("h200", clock=clock)
    fake.gpu(0).power_w = 600.0
    e0 = src.collect().gpus[0]["energy_mj"]
    clock.t += 5.0
    e1 = src.collect().gpus[0]["energy_mj"]
    assert e1 - e0 == 3_000_000  # 600 W for 5 s = 3000 J


def test_throttle_and_degraded_link_are_reported() -> None:
    src, fake = make("h100")
    fake.gpu(0).set(throttle_reasons=THROTTLE_SW_POWER_CAP, pcie_gen=3, pcie_width=8)
    row = src.collect().gpus[0]
    assert row["throttle_reasons"] == THROTTLE_SW_POWER_CAP
    assert (row["pcie_gen"], row["pcie_gen_max"], row["pcie_width"], row["pcie_width_max"]) == (3, 5, 8, 16)


def test_xid_is_the_last_in_the_interval_then_zero() -> None:
    src, fake = make("h100", "h100-mig")
    src.collect()
    fake.inject_xid(0, 13)
    fake.inject_xid(0, 31)
    fake.inject_xid(1, 43, gpu_instance_id=9)
    rows = by_key(src.collect())
    assert rows[(0, None)]["xid"] == 31
    assert rows[(1, None)]["xid"] == 43  # MIG XIDs land on the physical GPU's row
    assert rows[(1, 9)]["xid"] is None
    again = by_key(src.collect())
    assert again[(0, None)]["xid"] == 0 and again[(1, None)]["xid"] == 0


def test_xid_null_where_events_are_not_supported() -> None:
    src, fake = make("h100", "h200")
    fake.gpu(1).unsupported.add("register_xid_events")
    rows = by_key(src.collect())
    assert rows[(0, None)]["xid"] == 0
    assert rows[(1, None)]["xid"] is None


def test_gpu_falling_off_the_bus_is_reported_not_raised() -> None:
    src, fake = make("h100", "h100", "h100")
    src.collect()
    fake.lose_gpu(1)
    rows = by_key(src.collect())
    lost = rows[(1, None)]
    assert lost["xid"] == 79 and lost["uuid"] == fake.gpu(1).uuid
    assert lost["power_w"] is None and lost["energy_mj"] is None and lost["util_pct"] is None
    assert rows[(0, None)]["power_w"] is not None and rows[(2, None)]["power_w"] is not None
    assert by_key(src.collect())[(1, None)]["xid"] == 79


def test_gpu_lost_before_start_still_gets_a_row() -> None:
    src, fake = make("h100", "h200")
    fake.gpu(0).lost = True
    rows = by_key(src.collect())
    assert rows[(0, None)]["xid"] == 79 and rows[(0, None)]["uuid"] is None
    assert rows[(1, None)]["power_w"] is not None
    fake.gpu(0).lost = False  # reset brought it back
    assert by_key(src.collect())[(0, None)]["uuid"] == fake.gpu(0).uuid


def test_other_nvml_errors_fail_the_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    src, fake = make("h100")
    src.collect()

    def broken(handle: object) -> int:
        raise NvmlError("nvml: nvmlDeviceGetPowerUsage: Unknown Error")

    monkeypatch.setattr(fake, "power_usage_mw", broken)
    with pytest.raises(SourceError, match="Unknown Error"):
        src.collect()


def test_facts_report_models_versions_links_and_locality() -> None:
    src, fake = make("h100", "h100-mig", "l40s")
    facts = src.facts()
    assert facts["driver_version"] == "590.48.01" and facts["cuda_driver_version"] == "13.1"
    assert facts["gpu_count"] == 3
    g0, g1, g2 = facts["gpus"]
    assert g0["name"] == "NVIDIA H100 80GB HBM3" and g0["uuid"] == fake.gpu(0).uuid
    assert (g0["pcie_gen_max"], g0["pcie_width_max"]) == (5, 16)
    assert g0["cpu_affinity"] == "0-19" and g0["numa_node"] == 0
    assert g1["mig_enabled"] is True and [m["gpu_instance_id"] for m in g1["mig_instances"]] == [2, 3, 9, 10]
    assert g2["name"] == "NVIDIA L40S" and g2["pcie_gen_max"] == 4 and g2["mig_enabled"] is False


def test_facts_fall_back_to_sysfs_for_locality(tmp_path: Path) -> None:
    fake = FakeNvml([PROFILES["h200"]])
    fake.gpu(0).unsupported |= {"numa_node", "cpu_affinity"}
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:83:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (dev / "local_cpulist").write_text("24-47,72-95\n")
    gpu = NvmlSource(fake, sys_root=tmp_path).facts()["gpus"][0]
    assert gpu["numa_node"] == 1 and gpu["cpu_affinity"] == "24-47,72-95"


def test_close_frees_events_and_shuts_down() -> None:
    src, fake = make("h100")
    src.collect()
    src.close()
    assert not fake.initialized and fake.calls["free_event_set"] == 1
    src.collect()  # starts again
    assert fake.initialized


def test_steady_state_collect_cost_per_gpu() -> None:
    """Static values are read once and unsupported ones skipped: a benchmark relies on this budget."""
    src, fake = make("h100", "h100")
    src.collect()
    fake.calls.clear()
    src.collect()
    per_gpu = (sum(fake.calls.values()) - fake.calls["wait_xid"]) / 2
    # 16 readings plus one NVLink throughput read (field values) per collect ...
    assert per_gpu <= 17
    # ... and, on every 10th, the health counters: 3 ECC totals, remapped rows, PCIe replays,
    # one state call per NVLink link and three error counters per link (18 links on an H100).
    fake.calls.clear()
    for _ in range(src.health_every):
        src.collect()
    nvml_calls = sum(fake.calls.values()) - fake.calls["wait_xid"]
    per_gpu_avg = nvml_calls / 2 / src.health_every
    assert per_gpu_avg <= 17 + (5 + 18 + 3 * 18) / src.health_every


def test_helpers() -> None:
    assert sysfs_bus_id("00000000:83:00.0") == "0000:83:00.0"
    assert sysfs_bus_id("00000001:0A:00.0") == "0001:0a:00.0"
    assert format_cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert isinstance(NotSupported("x"), SourceError)


def test_nvlink_rates_from_counter_differences() -> None:
    clock = ManualClock()
    fake = FakeNvml([PROFILES["h100"], PROFILES["l40s"]], clock=clock)
    src = NvmlSource(fake, sys_root="/nonexistent", clock=clock)
    fake.gpu(0).nvlink_bytes_s = (20e9, 18e9)
    src.collect()
    clock.t += 2.0
    rows = by_key(src.collect())
    assert rows[(0, None)]["nvlink_tx_bytes_s"] == pytest.approx(20e9, rel=1e-6)
    assert rows[(0, None)]["nvlink_rx_bytes_s"] == pytest.approx(18e9, rel=1e-6)
    # A board without NVLink leaves the keys out (NotSupported), never 0 B/s.
    assert "nvlink_tx_bytes_s" not in rows[(1, None)]
    # A counter that went backwards (driver reload) gives no rate for that interval.
    fake.gpu(0)._nvlink_kib = [0.0, 0.0]
    clock.t += 1.0
    assert by_key(src.collect())[(0, None)]["nvlink_tx_bytes_s"] is None


def test_health_counters_every_nth_collect() -> None:
    src, fake = make("h100", "l40s")
    src = NvmlSource(fake, sys_root="/nonexistent", health_every=3)
    g = fake.gpu(0)
    g.set(
        ecc_sbe=7,
        ecc_sbe_agg=31,
        ecc_dbe_agg=1,
        remapped_correctable=2,
        remapped_uncorrectable=1,
        remap_pending=True,
        pcie_replays=42,
    )
    g.nvlink_up[3] = False
    g.nvlink_counters[0] = [100, 4, 0]
    g.nvlink_counters[3] = [50, 1, 1]
    first = by_key(src.collect())
    row = first[(0, None)]
    assert (row["ecc_sbe_vol"], row["ecc_sbe_agg"], row["ecc_dbe_agg"]) == (7, 31, 1)
    assert (row["remapped_rows_correctable"], row["remapped_rows_uncorrectable"]) == (2, 1)
    assert (row["remapped_rows_pending"], row["remapped_rows_failed"]) == (1, 0)
    assert row["pcie_replay_count"] == 42
    assert (row["nvlink_links_max"], row["nvlink_links_up"]) == (18, 17)
    assert (row["nvlink_crc_errors"], row["nvlink_replay_errors"], row["nvlink_recovery_errors"]) == (
        150,
        5,
        1,
    )
    l40s = first[(1, None)]
    assert l40s["pcie_replay_count"] == 0 and l40s["remapped_rows_pending"] == 0
    # No NVLink on the L40S: link counts and counters are NULL (the keys left out), never 0.
    assert l40s.get("nvlink_links_max") is None and l40s.get("nvlink_crc_errors") is None
    calls = fake.calls["nvlink_states"]
    assert calls == 18 + 1  # one driver call per H100 link, one NotSupported answer for the L40S
    second, third = by_key(src.collect()), by_key(src.collect())
    for rows in (second, third):
        assert "ecc_sbe_vol" not in rows[(0, None)] and "nvlink_links_up" not in rows[(0, None)]
    assert fake.calls["nvlink_states"] == calls
    assert by_key(src.collect())[(0, None)]["ecc_sbe_vol"] == 7
    assert set(row) <= set(NVML_FIELDS) | {"gpu"}


def test_health_fields_are_null_on_mig_instances_and_lost_gpus() -> None:
    src, fake = make("h100-mig", "h100")
    rows = by_key(src.collect())
    parent = rows[(0, None)]
    assert parent["remapped_rows_pending"] is None  # NVML reports no remapping while MIG is on
    assert parent["ecc_sbe_vol"] == 0
    for key, row in rows.items():
        if key[1] is not None:
            assert row["ecc_sbe_vol"] is None and row["nvlink_links_up"] is None, key
    fake.lose_gpu(1)
    lost = by_key(src.collect())[(1, None)]
    assert lost["xid"] == 79 and lost["pcie_replay_count"] is None and lost["nvlink_links_up"] is None


def test_management_limit_stands_in_where_the_enforced_limit_is_not_offered() -> None:
    src, fake = make("h100")
    fake.gpu(0).unsupported.add("enforced_power_limit_mw")
    fake.gpu(0).power_limit_w = 450.0  # set with nvidia-smi -pl
    assert src.collect().gpus[0]["power_limit_w"] == pytest.approx(450.0)
    src.collect()
    assert fake.calls["enforced_power_limit_mw"] == 1 and fake.calls["power_management_limit_mw"] == 2
    both, fake2 = make("h100")
    assert both.collect().gpus[0]["power_limit_w"] == pytest.approx(700.0)
    assert fake2.calls["power_management_limit_mw"] == 0
