"""The dcgm-exporter source against the real exposition of an 8×H100 node, over real HTTP on loopback."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.agent.sources.base import SourceError
from gpufleet.agent.sources.dcgm import DCGM_FP64_BLANK, DCGM_INT64_BLANK
from gpufleet.agent.sources.dcgm_exporter import DcgmExporterSource, parse_exposition
from gpufleet.catalog import WHOLE_GPU_FIELDS
from tests.conftest import realdata


def real_lines() -> list[str]:
    """The dcgm-exporter metric lines captured on a real node (from a markdown report)."""
    text = realdata("dcgm-exporter-output-samples", "accelerator-metrics.md").read_text()
    lines = [ln for ln in text.splitlines() if re.match(r"^DCGM_FI_\w+\{", ln)]
    assert len(lines) == 30
    return lines


def with_type_lines(lines: list[str]) -> str:
    """Add the HELP/TYPE lines dcgm-exporter prints, typed as its default-counters.csv says."""
    types = {}
    for row in realdata("dcgm-exporter", "default-counters.csv").read_text().splitlines():
        parts = [p.strip() for p in row.lstrip("#").split(",")]
        if len(parts) >= 3 and parts[0].startswith("DCGM_"):
            types[parts[0]] = parts[1]
    out: list[str] = []
    seen: set[str] = set()
    for ln in lines:
        name = ln.split("{")[0]
        if name not in seen:
            seen.add(name)
            out += [f"# HELP {name} {name}", f"# TYPE {name} {types.get(name, 'gauge')}"]
        out.append(ln)
    return "\n".join(out) + "\n"


class Server:
    """A loopback HTTP server whose /metrics body and status tests can change."""

    def __init__(self) -> None:
        self.body = ""
        self.status = 200
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = server.body.encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


def test_real_exposition_maps_to_eight_gpu_rows() -> None:
    parsed = parse_exposition("\n".join(real_lines()) + "\n")
    rows = parsed.rows
    assert sorted(rows) == [(g, None) for g in range(8)]
    r0 = rows[(0, None)]
    assert r0["uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    assert (r0["temp_c"], r0["power_w"], r0["util_pct"]) == (30, pytest.approx(113.611), 0)
    assert rows[(7, None)]["power_w"] == pytest.approx(66.997)
    # Only GPU 0 ran a pod; empty pod_uid is not passed through.
    assert r0["labels"] == {"pod": "vllm-agg-0-vllmdecodeworker-s65j5", "namespace": "dynamo-workload",
                            "container": "main"}
    assert "labels" not in rows[(1, None)]
    assert parsed.gpus[3]["name"] == "NVIDIA H100 80GB HBM3"
    assert parsed.gpus[3]["driver_version"] == "580.105.08"


def test_scrape_over_http_with_help_and_type_lines(server: Server) -> None:
    server.body = with_type_lines(real_lines())
    src = DcgmExporterSource(server.url, timeout_s=5)
    try:
        reading = src.collect()
        assert len(reading.gpus) == 8
        by_gpu = {r["gpu"]: r for r in reading.gpus}
        assert by_gpu[5]["power_w"] == pytest.approx(65.742)
        assert by_gpu[5]["xid"] is None  # no XID series exported: unknown, not 0
        facts = src.facts()
        assert [g["gpu"] for g in facts["gpus"]] == list(range(8))
        assert facts["gpus"][0]["hostname"] == "gpu-node-1"
    finally:
        src.close()


def test_http_errors_are_source_errors(server: Server) -> None:
    server.status = 500
    src = DcgmExporterSource(server.url, timeout_s=5)
    with pytest.raises(SourceError, match="500"):
        src.collect()
    src.close()
    refused = DcgmExporterSource("http://127.0.0.1:9/metrics", timeout_s=2)
    with pytest.raises(SourceError, match="scraping"):
        refused.collect()
    refused.close()


LABELS = 'gpu="0",UUID="GPU-a",pci_bus_id="00000000:53:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'


def series(name: str, value: object, extra: str = "") -> str:
    return f"{name}{{{LABELS}{extra}}} {value}"


def mig(gi: int, profile: str) -> str:
    return f',GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"'


def test_mig_series_device_values_go_to_the_physical_gpu_once() -> None:
    text = "\n".join([
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(2, "3g.40gb")),
        series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(9, "1g.10gb")),
        series("DCGM_FI_DEV_POWER_USAGE", 432.21, mig(2, "3g.40gb")),
        series("DCGM_FI_DEV_POWER_USAGE", 432.21, mig(9, "1g.10gb")),
        series("DCGM_FI_PROF_SM_ACTIVE", 0.91, mig(2, "3g.40gb")),
        series("DCGM_FI_PROF_SM_ACTIVE", 0.05, mig(9, "1g.10gb")),
        series("DCGM_FI_DEV_FB_USED", 11091, mig(2, "3g.40gb")),
        series("DCGM_FI_DEV_FB_USED", 9, mig(9, "1g.10gb")),
    ]) + "\n"
    rows = parse_exposition(text).rows
    assert set(rows) == {(0, None), (0, 2), (0, 9)}
    parent = rows[(0, None)]
    assert parent["energy_mj"] == 123456789012 and parent["power_w"] == pytest.approx(432.21)
    for gi, sm, fb in ((2, 0.91, 11091), (9, 0.05, 9)):
        inst = rows[(0, gi)]
        assert inst["sm_active"] == pytest.approx(sm) and inst["mem_used_mib"] == fb
        for name in WHOLE_GPU_FIELDS:
            assert inst[name] is None, name
    energies = [r["energy_mj"] for r in rows.values() if r.get("energy_mj") is not None]
    assert energies == [123456789012]


def test_blanks_units_legacy_names_and_priorities() -> None:
    text = "\n".join([
        series("DCGM_FI_DEV_MEMORY_TEMP", DCGM_INT64_BLANK + 2),
        series("DCGM_FI_DEV_POWER_USAGE", DCGM_FP64_BLANK),
        series("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 9139),  # KB/s
        series("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 19191),
        series("DCGM_FI_PROF_PCIE_RX_BYTES", 20_000_000),  # bytes/s, preferred
        series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 4),
        series("dcgm_sm_clock", 1980),
    ]) + "\n"
    row = parse_exposition(text).rows[(0, None)]
    assert row["mem_temp_c"] is None and row["power_w"] is None
    assert row["pcie_tx_bytes_s"] == 9139 * 1024
    assert row["pcie_rx_bytes_s"] == 20_000_000
    assert row["throttle_reasons"] == 4 and row["sm_clock_mhz"] == 1980


def test_xid_gauge_reports_changes_only(server: Server) -> None:
    src = DcgmExporterSource(server.url, timeout_s=5)
    try:
        server.body = series("DCGM_FI_DEV_XID_ERRORS", 0) + "\n"
        assert src.collect().gpus[0]["xid"] == 0
        server.body = series("DCGM_FI_DEV_XID_ERRORS", 79) + "\n"
        assert src.collect().gpus[0]["xid"] == 79
        assert src.collect().gpus[0]["xid"] == 0  # same gauge value: nothing new
        server.body = series("DCGM_FI_DEV_XID_ERRORS", DCGM_INT64_BLANK + 2) + "\n"
        assert src.collect().gpus[0]["xid"] is None
    finally:
        src.close()


def test_xid_window_count_wins_over_the_gauge() -> None:
    src = DcgmExporterSource("http://unused.invalid/metrics")
    body = "\n".join([
        series("DCGM_FI_DEV_XID_ERRORS", 13),
        series("DCGM_EXP_XID_ERRORS_COUNT", 2, ',xid="48"'),
        series("DCGM_EXP_XID_ERRORS_COUNT", 1, ',xid="13"'),
    ]) + "\n"
    src.scrape = lambda: body  # type: ignore[method-assign]
    assert src.collect().gpus[0]["xid"] == 48
    src.close()


def test_malformed_exposition_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="malformed"):
        parse_exposition('DCGM_FI_DEV_GPU_TEMP{gpu="0" 30\n')
