"""A real Prometheus scrapes a dcgm-exporter endpoint and a node_exporter one and remote-writes to the collector.

Prometheus is the Debian package's (tools/system-deps.sh).  Its queue is set to
send at most 50 samples a request, so every scrape of the 78-series exporter
arrives split over requests (and shards) and must be merged back into one row
per GPU.  The exporter serves gpufleet's constructed dcgm-exporter output
(``tests/fixtures/dcgm_exporter``); the node_exporter endpoint serves counters
that grow at known rates.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psycopg
import pytest

from gpufleet.auth import create_token
from gpufleet.collector.app import create_app
from gpufleet.collector.service import server_options
from gpufleet.config import Settings
from gpufleet.serverthread import free_port, serve
from gpufleet.store.inferred import Inferrer
from tests.system_tools import tool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DCGM = (FIXTURES / "dcgm_exporter" / "shipped_counters_2xh100.prom").read_text()
#: node_exporter's counters grow at these rates: CPU seconds per second by mode (one CPU), bytes per second.
CPU_RATES = {"user": 0.30, "system": 0.10, "iowait": 0.05, "idle": 0.55}
READ_BPS = 4_000_000.0
RX_BPS = 25_000_000.0


def node_exporter_text(t: float, t0: float) -> str:
    dt = t - t0
    lines = ["# TYPE node_cpu_seconds_total counter"]
    for mode, rate in CPU_RATES.items():
        lines.append(f'node_cpu_seconds_total{{cpu="0",mode="{mode}"}} {1000 + rate * dt:.2f}')
    for mode in ("nice", "irq", "softirq", "steal"):
        lines.append(f'node_cpu_seconds_total{{cpu="0",mode="{mode}"}} 0')
    lines += [
        "# TYPE node_disk_read_bytes_total counter",
        f'node_disk_read_bytes_total{{device="nvme0n1"}} {1e9 + READ_BPS * dt:.0f}',
        f'node_disk_reads_completed_total{{device="nvme0n1"}} {1e5 + 100 * dt:.0f}',
        f'node_disk_read_time_seconds_total{{device="nvme0n1"}} {50 + 0.1 * dt:.3f}',
        f'node_disk_written_bytes_total{{device="nvme0n1"}} {2e9:.0f}',
        'node_disk_writes_completed_total{device="nvme0n1"} 200000',
        'node_disk_write_time_seconds_total{device="nvme0n1"} 80',
        f'node_disk_io_time_seconds_total{{device="nvme0n1"}} {40 + 0.2 * dt:.3f}',
        "# TYPE node_network_receive_bytes_total counter",
        f'node_network_receive_bytes_total{{device="eth0"}} {5e9 + RX_BPS * dt:.0f}',
        f'node_network_receive_packets_total{{device="eth0"}} {1e7 + 1000 * dt:.0f}',
        'node_network_transmit_bytes_total{device="eth0"} 3000000000',
        'node_network_transmit_packets_total{device="eth0"} 9000000',
        'node_network_receive_bytes_total{device="lo"} 77',
        'node_network_receive_packets_total{device="lo"} 1',
        'node_network_transmit_bytes_total{device="lo"} 77',
        'node_network_transmit_packets_total{device="lo"} 1',
        "# TYPE node_load1 gauge",
        "node_load1 3.5",
    ]
    return "\n".join(lines) + "\n"


class Exporters:
    """One HTTP server: dcgm-exporter's output at /dcgm, node_exporter's at /node."""

    def __init__(self) -> None:
        t0 = time.time()
        scrapes = {"dcgm": 0, "node": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/dcgm"):
                    body = DCGM
                    scrapes["dcgm"] += 1
                elif self.path.startswith("/node"):
                    body = node_exporter_text(time.time(), t0)
                    scrapes["node"] += 1
                else:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.scrapes = scrapes
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


PROMETHEUS_YML = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dcgm-exporter
    metrics_path: /dcgm
    static_configs: [{{targets: ["127.0.0.1:{exporters}"]}}]
  - job_name: node
    metrics_path: /node
    static_configs: [{{targets: ["127.0.0.1:{exporters}"]}}]
    relabel_configs:
      - {{target_label: node, replacement: gpu-node-7}}
remote_write:
  - url: http://127.0.0.1:{collector}/api/v1/write
    authorization: {{credentials_file: {token}}}
    queue_config: {{max_samples_per_send: 50, batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}}
"""


@pytest.fixture
def prometheus_bin() -> str:
    return tool("prometheus", "prometheus")


@pytest.fixture
def collector_url(db: str, settings: Settings) -> Iterator[str]:
    s = settings.model_copy(
        update={
            "remote_write": settings.remote_write.model_copy(
                update={"merge_delay_s": 2.0, "assemble_every_s": 0.2}
            )
        }
    )
    with serve(create_app(db, s, run_leader=False), **server_options(s)) as srv:
        yield srv.url


def wait(pred: object, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} not reached in {timeout} s; prometheus said:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prometheus_remote_writes_dcgm_exporter_and_node_exporter_series_as_rows(
    prometheus_bin: str, db: str, collector_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        (tmp_path / "token").write_text(create_token(conn, "prometheus", "remote_write"))
    exporters = Exporters()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        PROMETHEUS_YML.format(
            exporters=exporters.port, collector=collector_url.rsplit(":", 1)[1], token=tmp_path / "token"
        )
    )
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def count(sql: str) -> int:
            with psycopg.connect(db) as c:
                return int(c.execute(sql).fetchone()[0])  # type: ignore[index]

        wait(
            lambda: (
                count("SELECT count(DISTINCT time) FROM gpu_samples WHERE node = 'gpu-node-7'") >= 3
                and count(
                    "SELECT count(*) FROM host_samples WHERE node = 'gpu-node-7' AND cpu_idle_pct IS NOT NULL"
                )
                >= 2
            ),
            90,
            "GPU and host rows",
            log,
        )
        with psycopg.connect(db, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT time, gpu, util_pct, power_w, energy_mj, temp_c, mem_total_mib, throttle_reasons, run_id, uuid "
                "FROM gpu_samples WHERE node = 'gpu-node-7' ORDER BY time, gpu"
            ).fetchall()
            # Every scrape is one row per GPU with every field, though no request held a whole scrape.
            per_time: dict[datetime, list[tuple[object, ...]]] = {}
            for r in rows:
                per_time.setdefault(r[0], []).append(r[1:])
            for got in per_time.values():
                assert got == [
                    (
                        0,
                        97.0,
                        pytest.approx(612.345, rel=1e-3),
                        8123456789,
                        61,
                        81559.0,
                        0,
                        "ml-research:llm-pretrain-master-0",
                        "GPU-5e3b8c1a-7d2f-4a96-b1c0-3f8e2d9a4b71",
                    ),
                    (
                        1,
                        100.0,
                        pytest.approx(699.87, rel=1e-3),
                        8412097310,
                        66,
                        81559.0,
                        4,
                        "ml-research:llm-pretrain-worker-0",
                        "GPU-a91c2e47-0b6d-4f38-9e25-c7d4b8f1e063",
                    ),
                ]
            host = conn.execute(
                "SELECT cpu_user_pct, cpu_system_pct, cpu_iowait_pct, cpu_idle_pct, cpu_count, "
                "disk_read_bytes_s, net_rx_bytes_s FROM host_samples WHERE node = 'gpu-node-7' "
                "AND cpu_idle_pct IS NOT NULL ORDER BY time"
            ).fetchall()
            for user, system, iowait, idle, cpus, read_bps, rx_bps in host:
                # Counters are scraped at the exporter's clock but stamped with Prometheus's: a rate over
                # one second moves with the scrapes' jitter (and with /0.01 s CPU rounding).
                assert user == pytest.approx(30, abs=3) and system == pytest.approx(10, abs=2)
                assert iowait == pytest.approx(5, abs=2) and idle == pytest.approx(55, abs=4)
                assert cpus == 1
                assert read_bps == pytest.approx(READ_BPS, rel=0.35) and rx_bps == pytest.approx(
                    RX_BPS, rel=0.35
                )
            Inferrer(300.0).run_once(conn, datetime.now(UTC))
            runs = conn.execute("SELECT run_id, source, team FROM runs ORDER BY run_id").fetchall()
            assert runs == [
                ("ml-research:llm-pretrain-master-0", "inferred", "ml-research"),
                ("ml-research:llm-pretrain-worker-0", "inferred", "ml-research"),
            ]
            alloc = conn.execute("SELECT run_id, node, gpu FROM run_allocations ORDER BY run_id").fetchall()
            assert alloc == [
                ("ml-research:llm-pretrain-master-0", "gpu-node-7", 0),
                ("ml-research:llm-pretrain-worker-0", "gpu-node-7", 1),
            ]
        page = httpx.get(f"{collector_url}/metrics", timeout=10).text
        # Prometheus's own series (up, scrape_duration_seconds ...) and node_load1 are not used.
        assert 'gpufleet_remote_write_dropped_samples_total{reason="unused"}' in page
        assert 'gpufleet_remote_write_groups_total{outcome="stored"}' in page
        requests = [
            line for line in page.splitlines() if line.startswith("gpufleet_remote_write_requests_total")
        ]
        assert requests and all('code="204"' in line for line in requests), requests
        # No request held a whole scrape of the exporter (78 series, 50 samples a request at most).
        assert float(requests[0].rsplit(" ", 1)[1]) >= 2 * len(per_time)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        exporters.stop()
