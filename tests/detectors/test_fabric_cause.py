"""The network cause from the nodes' fabric columns (collector.detectors.fabric), on host series as the window holds them."""

from __future__ import annotations

import numpy as np

from gpufleet.collector.detectors.fabric import (
    FABRIC_COLUMNS,
    collective_network_cause,
    node_fabric,
    straggler_network_cause,
)
from gpufleet.collector.detectors.window import Series

T = np.arange(0.0, 600.0, 10.0)


def host(node: str, **cols: float | list[float]) -> Series:
    """A node's host series over 10 minutes: every fabric column 0 unless given (a value or per-sample list)."""
    out = {c: np.zeros(T.shape) for c in FABRIC_COLUMNS}
    for name, v in cols.items():
        out[name] = np.asarray(v, dtype=float) if isinstance(v, list) else np.full(T.shape, float(v))
    return Series(node, None, T, out)


def spike(at: int, value: float) -> list[float]:
    v = [0.0] * len(T)
    v[at] = value
    return v


def test_link_errors_on_the_stragglers_node_only() -> None:
    hosts = {"n1": host("n1", ib_symbol_errors=spike(20, 37)), "n2": host("n2"), "n3": host("n3")}
    f = straggler_network_cause("n1", ["n1", "n2", "n3"], hosts, 0, 600)
    assert f is not None and f.reason == "link_errors" and f.nodes == ["n1"]
    assert f.evidence["straggler"]["link_faults"] == {"ib_symbol_errors": 37}
    # Outside the window: not this straggle.
    assert straggler_network_cause("n1", ["n2", "n3"], hosts, 300, 600) is None
    # The same errors everywhere say nothing about the straggler.
    everywhere = {n: host(n, ib_symbol_errors=spike(20, 37)) for n in ("n1", "n2")}
    assert straggler_network_cause("n1", ["n2"], everywhere, 0, 600) is None


def test_port_down_loss_and_saturation() -> None:
    down = straggler_network_cause("a", ["b"], {"a": host("a", ib_ports_down=1), "b": host("b")}, 0, 600)
    assert down is not None and down.reason == "port_down"
    lossy = {"a": host("a", ib_tx_discards=5.0), "b": host("b", net_drops=0.1)}  # 300 vs 6 packets
    lost = straggler_network_cause("a", ["b"], lossy, 0, 600)
    assert lost is not None and lost.reason == "packet_loss"
    busy = {"a": host("a", ib_util_pct=93.0), "b": host("b", ib_util_pct=40.0)}
    f = straggler_network_cause("a", ["b"], busy, 0, 600)
    assert f is not None and f.reason == "saturated" and f.evidence["straggler"]["link_util_pct"] == 93.0
    both = {"a": host("a", ib_util_pct=93.0), "b": host("b", ib_util_pct=91.0)}
    assert straggler_network_cause("a", ["b"], both, 0, 600) is None


def test_nodes_without_fabric_columns_are_never_implicated() -> None:
    bare = Series("a", None, T, {"cpu_user_pct": np.zeros(T.shape)})
    assert not node_fabric(bare, "a", 0, 600).reported
    assert straggler_network_cause("a", ["b"], {"a": bare, "b": host("b")}, 0, 600) is None
    assert collective_network_cause(["a"], {"a": bare}, 0, 600) is None
    nan = host("a")
    nan.cols = {c: np.full(T.shape, np.nan) for c in FABRIC_COLUMNS}
    assert not node_fabric(nan, "a", 0, 600).reported


def test_slow_collective_of_a_whole_run() -> None:
    hosts = {n: host(n, ib_util_pct=88.0) for n in ("n1", "n2", "n3")}
    f = collective_network_cause(["n1", "n2", "n3"], hosts, 0, 600)
    assert f is not None and f.reason == "saturated" and f.nodes == ["n1", "n2", "n3"]
    hosts["n2"] = host("n2", ib_link_downed=spike(5, 1))
    f = collective_network_cause(["n1", "n2", "n3"], hosts, 0, 600)
    assert f is not None and f.reason == "link_errors" and f.nodes == ["n2"]
    quiet = {n: host(n, ib_util_pct=30.0) for n in ("n1", "n2")}
    assert collective_network_cause(["n1", "n2"], quiet, 0, 600) is None
