"""The dcgm-exporter source against the real exposition of an 8×H100 node, over real HTTP on loopback."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpufleet.agent.sources.base import SourceError
from gpufleet.agent.sources.dcgm import DCGM_FP64_BLANK, DCGM_INT64_BLANK, FIELD_BY_ID
from gpufleet.agent.sources.dcgm_exporter import EXPORTER_FIELDS, SERIES, DcgmExporterSource, parse_exposition
from gpufleet.catalog import GPU_BY_NAME, WHOLE_GPU_FIELDS
from gpufleet.collector.window_cache import GPU_COLUMNS as WINDOW_COLUMNS
from tests.conftest import realdata

#: NVLink link state comes from DCGM's link-status call (the dcgm source) and
#: the job_* columns from the agent's own cgroup reader, not from fields
#: dcgm-exporter can print; every other column the detectors read must come
#: from the shipped field list.
GPU_COLUMNS = tuple(
    c for c in WINDOW_COLUMNS if c not in ("nvlink_links_up", "nvlink_links_max") and not c.startswith("job_")
)


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
    assert r0["labels"] == {
        "pod": "vllm-agg-0-vllmdecodeworker-s65j5",
        "namespace": "dynamo-workload",
        "container": "main",
    }
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


LABELS = (
    'gpu="0",UUID="GPU-a",pci_bus_id="00000000:53:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'
)


def series(name: str, value: object, extra: str = "") -> str:
    return f"{name}{{{LABELS}{extra}}} {value}"


def mig(gi: int, profile: str) -> str:
    return f',GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"'


def test_mig_series_device_values_go_to_the_physical_gpu_once() -> None:
    text = (
        "\n".join(
            [
                "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
                series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(2, "3g.40gb")),
                series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789012, mig(9, "1g.10gb")),
                series("DCGM_FI_DEV_POWER_USAGE", 432.21, mig(2, "3g.40gb")),
                series("DCGM_FI_DEV_POWER_USAGE", 432.21, mig(9, "1g.10gb")),
                series("DCGM_FI_PROF_SM_ACTIVE", 0.91, mig(2, "3g.40gb")),
                series("DCGM_FI_PROF_SM_ACTIVE", 0.05, mig(9, "1g.10gb")),
                series("DCGM_FI_DEV_FB_USED", 11091, mig(2, "3g.40gb")),
                series("DCGM_FI_DEV_FB_USED", 9, mig(9, "1g.10gb")),
            ]
        )
        + "\n"
    )
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
    text = (
        "\n".join(
            [
                series("DCGM_FI_DEV_MEMORY_TEMP", DCGM_INT64_BLANK + 2),
                series("DCGM_FI_DEV_POWER_USAGE", DCGM_FP64_BLANK),
                series("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 9139),  # KB/s
                series("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 19191),
                series("DCGM_FI_PROF_PCIE_RX_BYTES", 20_000_000),  # bytes/s, preferred
                series("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 4),
                series("dcgm_sm_clock", 1980),
            ]
        )
        + "\n"
    )
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
    body = (
        "\n".join(
            [
                series("DCGM_FI_DEV_XID_ERRORS", 13),
                series("DCGM_EXP_XID_ERRORS_COUNT", 2, ',xid="48"'),
                series("DCGM_EXP_XID_ERRORS_COUNT", 1, ',xid="13"'),
            ]
        )
        + "\n"
    )
    src.scrape = lambda: body  # type: ignore[method-assign]
    assert src.collect().gpus[0]["xid"] == 48
    src.close()


def test_malformed_exposition_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="malformed"):
        parse_exposition('DCGM_FI_DEV_GPU_TEMP{gpu="0" 30\n')


# ---------------------------------------------------------------- gpufleet's own field list

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "dcgm-exporter" / "counters.csv"
CONSTRUCTED = (
    Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_exporter" / "shipped_counters_2xh100.prom"
)


def counters(path: Path) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of each enabled line of a dcgm-exporter field list."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, typ, help_ = (p.strip() for p in line.split(",", 2))
        out.append((name, typ, help_))
    return out


def test_shipped_counters_file_is_in_the_exporters_format_and_every_field_maps() -> None:
    fields = counters(SHIPPED)
    names = [f[0] for f in fields]
    assert len(names) == len(set(names))
    real_types = {n: t for n, t, _ in counters(realdata("dcgm-exporter", "default-counters.csv"))}
    for name, typ, help_ in fields:
        assert typ in ("gauge", "counter", "label"), name
        assert help_, name
        # Where the stock file enables the same field, the type agrees with it.
        assert real_types.get(name, typ) == typ, name
        if typ != "label":
            field = SERIES.get(name)
            assert field is not None, f"{name} is in counters.csv but the source does not map it"
            assert field.column in GPU_BY_NAME, name
    columns = {SERIES[n].column for n, t, _ in fields if t != "label"}
    # Every column the detectors read, and the accounting's energy and power.
    assert set(GPU_COLUMNS) | {"energy_mj", "power_w"} <= columns
    # The fields the issue names on top of those.
    assert {
        "gr_engine_active",
        "nvlink_bandwidth_mb_s",
        "mem_copy_util_pct",
        "ecc_sbe_vol",
        "ecc_dbe_vol",
        "ecc_sbe_agg",
        "ecc_dbe_agg",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failed",
        "nvlink_tx_bytes_s",
        "nvlink_rx_bytes_s",
        "pcie_replay_count",
        "mem_used_mib",
        "mem_total_mib",
        "mem_clock_mhz",
        "mem_temp_c",
    } <= columns


def test_exporter_fields_agree_with_dcgm_field_definitions() -> None:
    import csv

    with realdata("dcgm", "dcgm_field_ids.csv").open() as f:
        rows = {int(r["field_id"]): r for r in csv.DictReader(f)}
    for fld in EXPORTER_FIELDS:
        row = rows[fld.field_id]
        assert row["name"] == fld.name, fld
        assert set(fld.aliases) <= set(filter(None, row["legacy_aliases"].split(";"))), fld
        assert row["tag"] == fld.tag, fld
        assert row["type"] == {"int64": "DCGM_FT_INT64", "double": "DCGM_FT_DOUBLE"}[fld.dcgm_type], fld
        assert fld.field_id not in FIELD_BY_ID, f"{fld.name} is already in the shared DCGM table"


def test_constructed_scrape_of_the_shipped_file_fills_every_detector_column(server: Server) -> None:
    body = CONSTRUCTED.read_text()
    # The constructed output is consistent with the shipped file: each field once, its HELP and TYPE.
    for name, typ, help_ in counters(SHIPPED):
        if typ == "label":
            assert f'{name}="580.105.08"' in body
            continue
        assert f"# HELP {name} {help_}\n# TYPE {name} {typ}\n" in body, name
    server.body = body
    src = DcgmExporterSource(server.url, timeout_s=5)
    try:
        reading = src.collect()
    finally:
        src.close()
    by_gpu = {r["gpu"]: r for r in reading.gpus}
    assert sorted(by_gpu) == [0, 1]
    for gpu, row in by_gpu.items():
        for column in (*GPU_COLUMNS, "energy_mj", "power_w"):
            assert row.get(column) is not None, (gpu, column)
    g1 = by_gpu[1]
    assert g1["throttle_reasons"] == 4 and g1["sm_clock_mhz"] == 1755 and g1["sm_clock_max_mhz"] == 1980
    assert g1["power_limit_w"] == pytest.approx(700.0) and g1["energy_mj"] == 8412097310
    assert (g1["pcie_gen"], g1["pcie_gen_max"], g1["pcie_width"], g1["pcie_width_max"]) == (5, 5, 16, 16)
    assert (
        g1["ecc_sbe_vol"],
        g1["ecc_sbe_agg"],
        g1["remapped_rows_correctable"],
        g1["pcie_replay_count"],
    ) == (2, 17, 1, 3)
    assert g1["gr_engine_active"] == pytest.approx(0.998201) and g1["mem_copy_util_pct"] == 41
    assert g1["nvlink_bandwidth_mb_s"] == 182011 and g1["xid"] == 0
    # The pod labels stay on the row for attribution.
    assert g1["labels"] == {
        "pod": "llm-pretrain-worker-0",
        "namespace": "ml-research",
        "container": "pytorch",
    }


def test_every_series_of_the_real_capture_maps_or_is_known_unmapped() -> None:
    # The real 8xH100 capture: every DCGM field it shows is one the source maps.
    names = {ln.split("{")[0] for ln in real_lines()}
    assert names and all(SERIES.get(n) is not None for n in names), sorted(
        n for n in names if n not in SERIES
    )
    row = parse_exposition("\n".join(real_lines()) + "\n").rows[(0, None)]
    assert row["mem_copy_util_pct"] == 0


def on_gpu(g: int, name: str, value: object) -> str:
    return series(name, value).replace('gpu="0",UUID="GPU-a"', f'gpu="{g}",UUID="GPU-{g}"')


def test_memory_total_from_the_stock_counters() -> None:
    """The stock default-counters.csv prints free, used and reserved framebuffer memory, not the
    total the catalog keeps: the total is their sum (free + used where the exporter has no reserved
    field), an exported FB_TOTAL wins, and a blank free value leaves the total unknown."""
    stock = [
        n.split(",")[0]
        for n in realdata("dcgm-exporter", "default-counters.csv").read_text().splitlines()
        if n.startswith("DCGM_FI_DEV_FB_")
    ]
    assert stock == ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED"]
    text = (
        "\n".join(
            [
                on_gpu(0, "DCGM_FI_DEV_FB_FREE", 20292),
                on_gpu(0, "DCGM_FI_DEV_FB_USED", 60742),
                on_gpu(0, "DCGM_FI_DEV_FB_RESERVED", 525),
                on_gpu(1, "dcgm_fb_free", 1000),
                on_gpu(1, "dcgm_fb_used", 79000),
                on_gpu(2, "DCGM_FI_DEV_FB_FREE", 10),
                on_gpu(2, "DCGM_FI_DEV_FB_USED", 20),
                on_gpu(2, "DCGM_FI_DEV_FB_TOTAL", 81559),
                on_gpu(3, "DCGM_FI_DEV_FB_FREE", DCGM_INT64_BLANK),
                on_gpu(3, "DCGM_FI_DEV_FB_USED", 5),
            ]
        )
        + "\n"
    )
    rows = parse_exposition(text).rows
    assert rows[(0, None)]["mem_total_mib"] == 81559 and rows[(0, None)]["mem_used_mib"] == 60742
    assert rows[(1, None)]["mem_total_mib"] == 80000
    assert rows[(2, None)]["mem_total_mib"] == 81559
    assert rows[(3, None)].get("mem_total_mib") is None


def test_management_limit_stands_in_for_the_enforced_limit() -> None:
    # A counters file with DCGM_FI_DEV_POWER_MGMT_LIMIT and not the enforced limit: the limit is still known.
    mgmt_only = (
        "\n".join(
            [
                "# HELP DCGM_FI_DEV_POWER_MGMT_LIMIT Power management limit (in W)",
                "# TYPE DCGM_FI_DEV_POWER_MGMT_LIMIT gauge",
                series("DCGM_FI_DEV_POWER_MGMT_LIMIT", "500.000000"),
                series("DCGM_FI_DEV_POWER_USAGE", "498.100000"),
            ]
        )
        + "\n"
    )
    assert parse_exposition(mgmt_only).rows[(0, None)]["power_limit_w"] == pytest.approx(500.0)
    # Both: the enforced limit (what the driver applies after every limiter) wins, in either order.
    for lines in (
        [
            series("DCGM_FI_DEV_POWER_MGMT_LIMIT", "700.000000"),
            series("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "650.000000"),
        ],
        [
            series("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "650.000000"),
            series("DCGM_FI_DEV_POWER_MGMT_LIMIT", "700.000000"),
        ],
    ):
        assert parse_exposition("\n".join(lines) + "\n").rows[(0, None)]["power_limit_w"] == pytest.approx(
            650.0
        )
    # An enforced limit DCGM cannot read (blank) leaves the management limit in place.
    blank = (
        "\n".join(
            [
                series("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", DCGM_FP64_BLANK),
                series("dcgm_power_management_limit", "400.000000"),
            ]
        )
        + "\n"
    )
    assert parse_exposition(blank).rows[(0, None)]["power_limit_w"] == pytest.approx(400.0)
