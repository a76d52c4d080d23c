"""The fake NVML stays faithful to the real captures it was built from."""

from __future__ import annotations

import re

import pytest

from gpufleet.agent.sources.nvml_api import Clock, GpuLost, NotSupported, NvmlError
from gpufleet.sim.nvml_fake import PROFILES, FakeNvml, GpuProfile
from tests.conftest import realdata


class Capture:
    """One ``nvidia-smi`` capture file split into its sections."""

    def __init__(self, name: str) -> None:
        text = realdata("nvidia_gpu_exporter", "captures", f"{name}.txt").read_text()
        self.sections: dict[str, list[str]] = {}
        title = None
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^# ((?:idle|load|capabilities) :: .+)$", lines[i])
            if m:
                title = m.group(1)
                # skip the command line and the closing rule
                while i < len(lines) and not lines[i].startswith("#####"):
                    i += 1
                self.sections[title] = []
            elif title and not lines[i].startswith("#####"):
                self.sections[title].append(lines[i])
            i += 1

    def q(self, state: str) -> list[str]:
        return self.sections[f"{state} :: query (-q)"]


def field(lines: list[str], *path: str) -> str:
    """Value of the first line labelled ``path[-1]`` after the lines labelled ``path[:-1]``, in order."""
    i = 0
    for label in path:
        while i < len(lines) and lines[i].split(":")[0].strip() != label:
            i += 1
        if i == len(lines):
            raise KeyError(path)
        i += 1
    return lines[i - 1].split(":", 1)[1].strip()


def number(text: str) -> float:
    return float(text.split()[0].rstrip("x"))


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_profile_matches_its_capture(key: str) -> None:
    p: GpuProfile = PROFILES[key]
    cap = Capture(p.capture)
    idle, load = cap.q("idle"), cap.q("load")
    assert field(idle, "Product Name") == p.name
    assert field(idle, "Driver Version") == p.driver_version
    major, minor = field(idle, "CUDA Version").split(".")
    assert p.cuda_driver_version == int(major) * 1000 + int(minor) * 10
    assert number(field(idle, "FB Memory Usage", "Total")) == p.mem_total_mib
    assert number(field(idle, "FB Memory Usage", "Reserved")) == p.mem_reserved_mib
    assert number(field(idle, "GPU Power Readings", "Current Power Limit")) == p.power_limit_w
    assert number(field(idle, "Max Clocks", "SM")) == p.sm_clock_max_mhz
    assert number(field(idle, "Max Clocks", "Memory")) == p.mem_clock_max_mhz
    assert number(field(idle, "PCIe Generation", "Max")) == p.pcie_gen_max
    assert number(field(idle, "Link Width", "Max")) == p.pcie_width_max
    assert field(idle, "Bus Id") == p.pci_bus_id
    assert number(field(idle, "Instantaneous Power Draw")) == p.idle_power_w
    assert number(field(idle, "GPU Current Temp")) == p.idle_temp_c
    assert number(field(idle, "Clocks", "SM")) == p.idle_sm_clock_mhz
    assert number(field(idle, "Tx Throughput")) == p.idle_pcie_tx_kb_s
    assert number(field(idle, "Rx Throughput")) == p.idle_pcie_rx_kb_s
    mem_temp = field(idle, "Memory Current Temp")
    assert (None if mem_temp == "N/A" else number(mem_temp)) == p.idle_mem_temp_c
    assert number(field(load, "Instantaneous Power Draw")) == p.load_power_w
    assert number(field(load, "GPU Current Temp")) == p.load_temp_c
    assert number(field(load, "FB Memory Usage", "Used")) == p.load_mem_used_mib
    util = field(load, "Utilization", "GPU")
    if p.mig:
        assert util == "N/A"  # NVML offers no GPU-Util while MIG is on
    else:
        assert number(util) == p.load_util_pct
    mig_mode = field(idle, "MIG Mode", "Current")
    assert (mig_mode != "N/A") == p.mig_capable
    assert (mig_mode == "Enabled") == bool(p.mig)
    assert number(field(idle, "Replays Since Reset")) == p.pcie_replays
    # Healthy boards: no DRAM ECC errors, no remapped rows; the fake starts there too.
    fake = FakeNvml([p])
    fake.init()
    h = fake.device_handle(0)
    assert number(field(idle, "ECC Errors", "Volatile", "DRAM Correctable")) == fake.ecc_error_total(
        h, False, False
    )
    assert number(field(idle, "ECC Errors", "Aggregate", "DRAM Uncorrectable")) == fake.ecc_error_total(
        h, True, True
    )
    remap_line = next(ln for ln in idle if ln.split(":")[0].strip() == "Remapped Rows")
    if remap_line.rstrip().endswith("N/A"):  # not reported while MIG is on
        with pytest.raises(NotSupported):
            fake.remapped_rows(h)
    else:
        rows = fake.remapped_rows(h)
        assert number(field(idle, "Remapped Rows", "Correctable Error")) == rows.correctable
        assert number(field(idle, "Remapped Rows", "Uncorrectable Error")) == rows.uncorrectable
        assert field(idle, "Remapped Rows", "Pending") == ("Yes" if rows.pending else "No")
    assert fake.pcie_replay_count(h) == p.pcie_replays
    topo = cap.sections["capabilities :: topo -m"]
    gpu0 = next(ln for ln in topo if ln.startswith("GPU0"))
    assert gpu0.split("\t")[2].strip() == p.cpu_affinity


def test_mig_profile_instances_match_the_capture() -> None:
    p = PROFILES["h100-mig"]
    idle = Capture(p.capture).q("idle")
    gis = [int(ln.split(":")[1]) for ln in idle if ln.strip().startswith("GPU Instance ID")]
    totals = [
        int(number(idle[i + 1].split(":")[1]))
        for i, ln in enumerate(idle)
        if ln.strip() == "Shared FB Memory Usage"
    ]
    assert gis == [s.gpu_instance_id for s in p.mig]
    assert totals == [s.mem_total_mib for s in p.mig]


class ManualClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_energy_integrates_power_over_time() -> None:
    clock = ManualClock()
    nv = FakeNvml([PROFILES["h100"]], clock=clock, energy_mj=5_000)
    nv.init()
    h = nv.device_handle(0)
    gpu = nv.gpu(0)
    gpu.power_w = 100.0
    start = nv.total_energy_mj(h)
    clock.t += 10.0
    gpu.power_w = 500.0  # 10 s at 100 W = 1000 J
    clock.t += 2.0  # 2 s at 500 W = 1000 J
    assert nv.total_energy_mj(h) - start == 2_000_000
    assert nv.power_usage_mw(h) == 500_000
    gpu.reset_energy()
    assert nv.total_energy_mj(h) == 0


def test_calls_before_init_fail_like_nvml() -> None:
    nv = FakeNvml([PROFILES["h200"]])
    with pytest.raises(NvmlError, match="Uninitialized"):
        nv.device_count()


def test_unsupported_lost_and_mig_behaviour() -> None:
    nv = FakeNvml([PROFILES["l40s"], PROFILES["h100-mig"]])
    nv.init()
    l40s, mig = nv.device_handle(0), nv.device_handle(1)
    with pytest.raises(NotSupported):
        nv.memory_temperature_c(l40s)
    with pytest.raises(NotSupported):
        nv.mig_enabled(l40s)
    with pytest.raises(NotSupported):
        nv.utilization_pct(mig)
    inst = nv.mig_devices(mig)
    assert [nv.gpu_instance_id(h) for h in inst] == [2, 3, 9, 10]
    with pytest.raises(NotSupported):
        nv.power_usage_mw(inst[0])
    nv.gpu(0).unsupported.add("ecc_dbe_volatile_total")
    with pytest.raises(NotSupported):
        nv.ecc_dbe_volatile_total(l40s)
    nv.lose_gpu(0)
    with pytest.raises(GpuLost):
        nv.clock_mhz(l40s, Clock.SM)
    with pytest.raises(GpuLost):
        nv.device_handle(0)


def test_xid_events_reach_registered_sets_only() -> None:
    nv = FakeNvml([PROFILES["h100"], PROFILES["h100"]])
    nv.init()
    es = nv.create_event_set()
    nv.register_xid_events(nv.device_handle(1), es)
    nv.inject_xid(0, 13)
    nv.inject_xid(1, 48)
    event = nv.wait_xid(es, 0)
    assert event is not None and (event.device_key, event.xid) == (1, 48)
    assert nv.wait_xid(es, 0) is None


def test_call_latency_is_charged_per_call() -> None:
    import time

    nv = FakeNvml([PROFILES["h100"]], call_latency_s=200e-6)
    nv.init()
    h = nv.device_handle(0)
    t0 = time.perf_counter()
    for _ in range(20):
        nv.gpu_temperature_c(h)
    assert time.perf_counter() - t0 >= 20 * 200e-6
    assert nv.calls["gpu_temperature_c"] == 20


def test_health_counters_nvlink_state_and_throughput() -> None:
    clock = ManualClock()
    nv = FakeNvml([PROFILES["h100"], PROFILES["l40s"]], clock=clock)
    nv.init()
    h100, l40s = nv.device_handle(0), nv.device_handle(1)
    g = nv.gpu(0)
    g.set(ecc_sbe=12, ecc_sbe_agg=40, remap_pending=True, remapped_uncorrectable=1)
    assert nv.ecc_error_total(h100, False, False) == 12 and nv.ecc_error_total(h100, False, True) == 40
    assert nv.remapped_rows(h100).pending and nv.remapped_rows(h100).uncorrectable == 1
    g.nvlink_up[5] = False
    g.nvlink_counters[5] = [120, 7, 1]
    states = nv.nvlink_states(h100)
    assert len(states) == 18 and sum(states) == 17
    assert nv.nvlink_errors(h100, 5).crc_flit == 120
    g.nvlink_bytes_s = (2048.0 * 1024, 1024.0 * 1024)
    before = nv.nvlink_throughput_kib(h100)
    clock.t += 10.0
    after = nv.nvlink_throughput_kib(h100)
    assert (after[0] - before[0], after[1] - before[1]) == (20480, 10240)
    for call in (nv.nvlink_states, nv.nvlink_throughput_kib):
        with pytest.raises(NotSupported):
            call(l40s)
