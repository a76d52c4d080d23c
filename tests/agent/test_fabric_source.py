"""The fabric in the host row, on captured /sys and /proc trees (tests/fixtures/realdata/SOURCES.md).

An H100 node's NDR InfiniBand HCAs and RoCE bond (gpud), procfs's and
node_exporter's HCAs (EDR, QDR, an iWARP device without a PMA, 32-bit
counters stuck at their ceiling), procfs's ``eth0`` at 1 Gbit/s and its
``/proc/net/dev``.  Between two readings the test moves counters on as
traffic and link faults would, and checks the row against figures worked
out by hand from the captured values.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.agent.sources.fabric import (
    SATURATED_32,
    ib_rates,
    parse_ib_rate,
    parse_ib_state,
    read_ib_port,
    read_ib_ports,
    read_link_speeds,
)
from gpufleet.agent.sources.host import HostSource, parse_net_dev, read_snapshot
from gpufleet.catalog import HOST_BY_NAME
from tests.conftest import realdata

GPUD_IB = ("gpud", "sys", "class", "infiniband")


def ib_tree(tmp_path: Path, *parts: str) -> Path:
    """A writable copy of a captured ``/sys`` (``sys_root``) holding that ``class/infiniband``."""
    root = tmp_path / "sys"
    shutil.copytree(realdata(*parts), root / "class" / "infiniband")
    return root


def bump(path: Path, by: int) -> None:
    path.write_text(f"{int(path.read_text()) + by}\n")


def test_rate_and_state_as_sysfs_prints_them() -> None:
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == 400e9 / 8
    assert parse_ib_rate("10 Gb/sec (4X)") == 10e9 / 8
    assert parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert parse_ib_rate("") is None
    assert parse_ib_state("4: ACTIVE") == "ACTIVE"
    assert parse_ib_state("1: DOWN") == "DOWN"
    assert parse_ib_state(None) is None


def test_h100_node_hcas(tmp_path: Path) -> None:
    ports = read_ib_ports(ib_tree(tmp_path, *GPUD_IB))
    assert sorted(ports) == ["mlx5_0/1", "mlx5_1/1", "mlx5_bond_0/1"]
    ib0, ib1, bond = ports["mlx5_0/1"], ports["mlx5_1/1"], ports["mlx5_bond_0/1"]
    assert ib0.active and ib0.rate_bytes_s == 50e9 and ib0.link_layer == "InfiniBand"
    assert bond.link_layer == "Ethernet" and bond.rate_bytes_s == 25e9
    # port_rcv_data counts 4-octet words; mlx5 gives the full 64-bit value in counters/.
    assert ib0.traffic["rx_bytes"] == 230539874932483 * 4
    assert ib0.traffic["tx_bytes"] == 230442669431839 * 4
    assert ib0.errors == {
        "symbol_error": 0,
        "link_downed": 0,
        "link_error_recovery": 0,
        "port_rcv_errors": 14,
        "port_xmit_discards": 0,
    }
    # link_downed is an 8-bit counter: at 255 it has stopped counting, so it says nothing.
    assert "link_downed" not in ib1.errors and ib1.errors["symbol_error"] == 0


def test_first_reading_has_capacity_and_state_but_no_rates(tmp_path: Path) -> None:
    row = ib_rates({}, read_ib_ports(ib_tree(tmp_path, *GPUD_IB)), 0.0)
    assert row["ib_link_bytes_s"] == 125e9 and row["ib_ports_down"] == 0
    assert row["ib_rx_bytes_s"] is None and row["ib_symbol_errors"] is None


def test_traffic_errors_and_a_port_down_between_two_readings(tmp_path: Path) -> None:
    sys_root = ib_tree(tmp_path, *GPUD_IB)
    before = read_ib_ports(sys_root)
    c0 = sys_root / "class/infiniband/mlx5_0/ports/1/counters"
    c1 = sys_root / "class/infiniband/mlx5_1/ports/1/counters"
    bump(c0 / "port_rcv_data", 2_500_000_000)  # 10 GB in 2 s: 5 GB/s, 10 % of 50 GB/s
    bump(c0 / "port_xmit_data", 500_000_000)  # 2 GB
    bump(c0 / "port_rcv_packets", 2_000_000)
    bump(c0 / "symbol_error", 7)
    bump(c0 / "link_error_recovery", 1)
    bump(c1 / "port_rcv_data", 5_000_000_000)  # 20 GB in 2 s: 10 GB/s, 20 %: the busiest port
    bump(c1 / "port_rcv_errors", 2)
    bump(c1 / "link_downed", 0)  # still at its ceiling: unknown, not 0
    bond = sys_root / "class/infiniband/mlx5_bond_0/ports/1"
    (bond / "state").write_text("1: DOWN\n")
    row = ib_rates(before, read_ib_ports(sys_root), 2.0)
    assert row["ib_rx_bytes_s"] == pytest.approx((10e9 + 20e9) / 2)
    assert row["ib_tx_bytes_s"] == pytest.approx(2e9 / 2)
    assert row["ib_rx_packets_s"] == pytest.approx(1e6)
    assert row["ib_util_pct"] == pytest.approx(20.0)
    assert row["ib_link_bytes_s"] == 100e9 and row["ib_ports_down"] == 1
    assert row["ib_symbol_errors"] == 7 and row["ib_link_error_recovery"] == 1 and row["ib_rx_errors"] == 2
    assert row["ib_link_downed"] == 0  # from the two ports that count it; mlx5_1's is stuck
    assert row["ib_tx_discards"] == 0


def test_a_counter_that_went_backwards_sits_the_interval_out(tmp_path: Path) -> None:
    sys_root = ib_tree(tmp_path, *GPUD_IB)
    before = read_ib_ports(sys_root)
    for hca in ("mlx5_0", "mlx5_1", "mlx5_bond_0"):
        (sys_root / f"class/infiniband/{hca}/ports/1/counters/port_rcv_data").write_text(
            "12\n"
        )  # driver reload
    row = ib_rates(before, read_ib_ports(sys_root), 1.0)
    assert row["ib_rx_bytes_s"] is None
    assert row["ib_tx_bytes_s"] == 0.0


def test_procfs_hcas_edr_qdr_and_mlx5() -> None:
    ports = read_ib_ports(realdata("procfs", "sys"))
    assert sorted(ports) == ["hfi1_0/1", "mlx4_0/1", "mlx4_0/2", "mlx5_0/1"]
    assert [ports[k].rate_bytes_s for k in sorted(ports)] == [100e9 / 8, 40e9 / 8, 40e9 / 8, 25e9 / 8]
    assert ports["mlx5_0/1"].traffic["tx_bytes"] == 2880761508848 * 4
    assert ports["mlx4_0/1"].traffic["rx_bytes"] == 2221223609 * 4
    assert ib_rates({}, ports, 0.0)["ib_link_bytes_s"] == pytest.approx(205e9 / 8)


def test_node_exporter_hcas_extended_counters_and_no_pma() -> None:
    ports = read_ib_ports(realdata("node_exporter", "sys"))
    mlx4, iwarp = ports["mlx4_0/1"], ports["i40iw0/1"]
    # counters_ext/port_rcv_data_64 is preferred (also 4-octet words).
    assert mlx4.traffic["rx_bytes"] == 4631917 * 4
    assert mlx4.traffic["tx_bytes"] == 3733440 * 4
    assert mlx4.errors["port_xmit_discards"] == 5
    # The iWARP device has no performance-management agent: every counter unknown, never 0.
    assert iwarp.traffic == {} and iwarp.errors == {}
    assert iwarp.active and iwarp.rate_bytes_s == 10e9 / 8


def test_saturated_32_bit_counter_is_unknown(tmp_path: Path) -> None:
    sys_root = ib_tree(tmp_path, "node_exporter", "sys", "class", "infiniband")
    port = sys_root / "class/infiniband/mlx4_0/ports/1"
    shutil.rmtree(port / "counters_ext")
    (port / "counters" / "port_xmit_data").write_text(f"{SATURATED_32}\n")
    assert "tx_bytes" not in read_ib_port(port).traffic
    assert read_ib_port(port).traffic["rx_bytes"] == 4631917 * 4


def test_net_dev_errors_and_drops() -> None:
    nets = parse_net_dev(realdata("sysstat", "root2", "proc", "net", "dev").read_text())
    assert nets["virbr0"].rx_bytes == 1800 and nets["virbr0"].rx_errs == 0 and nets["virbr0"].rx_drop == 0
    assert nets["enp6s0"].tx_packets == 54567 and nets["enp6s0"].tx_errs == 0


def host_tree(tmp_path: Path) -> tuple[Path, Path]:
    """procfs's /proc/net/dev with eth0, its sysfs eth0 at 1 Gbit/s, sysstat's /proc/stat and uptime."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    (proc / "net").mkdir(parents=True)
    shutil.copy(realdata("procfs", "proc", "net", "dev"), proc / "net" / "dev")
    for name in ("stat", "uptime"):
        shutil.copy(realdata("sysstat", "root1", "proc", name), proc / name)
    shutil.copytree(realdata("procfs", "sys", "class", "net"), sys_root / "class" / "net")
    # The capture's eth0/device is a symbolic link into its devices tree: a physical interface.
    (sys_root / "class" / "net" / "eth0" / "device").mkdir()
    shutil.copytree(realdata(*GPUD_IB), sys_root / "class" / "infiniband")
    return proc, sys_root


def move_net(proc: Path, nic: str, rx: int, tx: int, rx_errs: int = 0, tx_drop: int = 0) -> None:
    lines = []
    for line in (proc / "net" / "dev").read_text().splitlines():
        name, sep, rest = line.partition(":")
        if sep and name.strip() == nic:
            v = [int(x) for x in rest.split()]
            v[0] += rx
            v[2] += rx_errs
            v[8] += tx
            v[11] += tx_drop
            line = f"{name}: " + " ".join(str(x) for x in v)
        lines.append(line)
    (proc / "net" / "dev").write_text("\n".join(lines) + "\n")


def test_host_row_carries_the_fabric(tmp_path: Path) -> None:
    proc, sys_root = host_tree(tmp_path)
    assert read_link_speeds(sys_root, ["eth0", "lo"]) == {"eth0": 125e6}
    src = HostSource(proc, sys_root, rapl=False)
    first = src.collect().host
    assert first is not None
    assert first["net_link_bytes_s"] == 125e6 and first["ib_link_bytes_s"] == 125e9
    assert first["net_errors"] is None and first["net_util_pct"] is None
    move_net(proc, "eth0", rx=25_000_000, tx=5_000_000, rx_errs=3, tx_drop=4)  # 2 s at 12.5 MB/s in: 10 %
    move_net(proc, "docker0", rx=1_000_000_000, tx=0, rx_errs=100)  # virtual: not counted
    (proc / "uptime").write_text(f"{float((proc / 'uptime').read_text().split()[0]) + 2.0} 0\n")
    row = src.collect().host
    assert row is not None
    assert row["net_rx_bytes_s"] == pytest.approx(12.5e6) and row["net_tx_bytes_s"] == pytest.approx(2.5e6)
    assert row["net_errors"] == 3 and row["net_drops"] == 4
    assert row["net_util_pct"] == pytest.approx(10.0)
    assert row["ib_rx_bytes_s"] == 0.0 and row["ib_symbol_errors"] == 0
    assert set(row) <= set(HOST_BY_NAME)


def test_link_down_reports_no_speed(tmp_path: Path) -> None:
    _, sys_root = host_tree(tmp_path)
    (sys_root / "class/net/eth0/operstate").write_text("down\n")
    assert read_link_speeds(sys_root, ["eth0"]) == {}
    (sys_root / "class/net/eth0/operstate").write_text("up\n")
    (sys_root / "class/net/eth0/speed").write_text("-1\n")
    assert read_link_speeds(sys_root, ["eth0"]) == {}


def test_fabric_off_leaves_the_row_as_before(tmp_path: Path) -> None:
    proc, sys_root = host_tree(tmp_path)
    snap = read_snapshot(proc, sys_root, rapl=False)
    assert snap.ib is None and snap.links == {}
    row = HostSource(proc, sys_root, rapl=False, fabric=False).collect().host
    assert row is not None and "ib_rx_bytes_s" not in row and "net_errors" not in row
