"""The runs-in-Prometheus board: every query answered by a real Prometheus scraping the collector and
dcgm-exporter, and every series it names one the collector or dcgm-exporter exports."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.collector.app import create_app
from gpufleet.collector.run_metrics import compute, store
from gpufleet.collector.service import server_options
from gpufleet.config import RunMetricsSettings, Settings
from gpufleet.dashboards import build
from gpufleet.dashboards.loader import load_prometheus
from gpufleet.serverthread import free_port, serve
from tests.accounting.builders import constant_power, gpu_samples, node, site
from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
DCGM = (ROOT / "tests" / "fixtures" / "dcgm_exporter" / "shipped_counters_2xh100.prom").read_text()
UUIDS = ("GPU-5e3b8c1a-7d2f-4a96-b1c0-3f8e2d9a4b71", "GPU-a91c2e47-0b6d-4f38-9e25-c7d4b8f1e063")


def board() -> dict[str, Any]:
    return load_prometheus()["gpufleet-prom-runs"]


def exprs(d: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in d["panels"] if p["type"] != "row" for t in p["targets"]]


def test_the_board_is_built_and_reads_only_its_prometheus_variable() -> None:
    assert build.stale() == []
    d = board()
    assert d["id"] is None and d["schemaVersion"] >= 39
    ds = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert ds == [{**ds[0], "name": "datasource", "query": "prometheus"}]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"] and all(
                t["datasource"] == p["datasource"] and t["expr"] for t in p["targets"]
            )
    assert sum(1 for p in d["panels"] if p["type"] != "row") >= 10


def test_every_series_it_names_is_exported() -> None:
    contracts = (ROOT / "docs" / "contracts.md").read_text()
    counters = {
        line.split(",")[0].strip()
        for line in (ROOT / "deploy" / "dcgm-exporter" / "counters.csv").read_text().splitlines()
        if line.startswith("DCGM_")
    }
    text = " ".join(e for _, e in exprs(board())) + " ".join(
        v["definition"] for v in board()["templating"]["list"] if v["type"] == "query"
    )
    names = set(re.findall(r"\b(gpufleet_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)", text))
    assert names
    for name in names:
        if name.startswith("DCGM_"):
            assert name in counters, f"{name} is not in deploy/dcgm-exporter/counters.csv"
        else:
            base = name.removesuffix("_total")
            assert f"`{name}" in contracts or f"`{base}" in contracts, (
                f"{name} is not in docs/contracts.md section 4"
            )


class Exporter:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = DCGM.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def collector(db: str, settings: Settings) -> Iterator[str]:
    """A collector whose run figures cover a running run on the exporter's two GPUs, one with an open incident."""
    now = datetime.now(UTC)
    with psycopg.connect(db, autocommit=True) as conn:
        site(conn, "s1", pue=1.2, price=0.25, gpu_hour=2.0, currency="EUR", carbon=300.0)
        node(
            conn, "gpu-node-7", 2, "s1", facts={"gpus": [{"gpu": i, "uuid": u} for i, u in enumerate(UUIDS)]}
        )
        conn.execute(
            "INSERT INTO runs (run_id, site, team, start) VALUES (%s, %s, %s, %s)",
            ("ml-research:llm-pretrain", "s1", "ml-research", now - timedelta(hours=1)),
        )
        for g in (0, 1):
            conn.execute(
                "INSERT INTO run_allocations (run_id, node, gpu) VALUES (%s, %s, %s)",
                ("ml-research:llm-pretrain", "gpu-node-7", g),
            )
        t0 = (now - timedelta(hours=1) - datetime(2026, 12, 1, 10, tzinfo=UTC)).total_seconds()
        gpu_samples(conn, constant_power("gpu-node-7", (0, 1), 600.0, t0, t0 + 3500))
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, run_id, node, gpu, state, start, last_seen, evidence) "
            "VALUES ('pcie_degraded', 'p|0', 'ml-research:llm-pretrain', 'gpu-node-7', 0, 'open', %s, %s, "
            "'{}')",
            (now - timedelta(minutes=30), now),
        )
        store(conn, compute(conn, RunMetricsSettings(per_gpu=True), now), now)
    with serve(create_app(db, settings, run_leader=False), **server_options(settings)) as srv:
        yield srv.url


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prometheus_answers_every_panel_with_data(collector: str, tmp_path: Path) -> None:
    exporter = Exporter()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: gpufleet
    static_configs: [{{targets: ["127.0.0.1:{collector.rsplit(":", 1)[1]}"]}}]
  - job_name: dcgm-exporter
    static_configs: [{{targets: ["127.0.0.1:{exporter.port}"]}}]
""")
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                tool("prometheus", "prometheus"),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    api = f"{base}/api/v1/query"

    def query(expr: str) -> dict[str, Any]:
        return httpx.get(api, params={"query": expr}, timeout=10).json()

    def ready() -> bool:
        # until its storage is open Prometheus answers every API call "503 Service Unavailable" in plain text
        return httpx.get(f"{base}/-/ready", timeout=5).status_code == 200

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if ready() and all(
                    query(q).get("data", {}).get("result")
                    for q in (
                        "gpufleet_gpu_run_info",
                        "DCGM_FI_DEV_GPU_UTIL",
                        "gpufleet_run_energy_kwh_total",
                    )
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"Prometheus has no series yet:\n{log.read_text()[-3000:]}")
        for title, expr in exprs(board()):
            got = query(expr.replace("$team", ".*").replace("$run", ".*"))
            assert got["status"] == "success", (title, got)
            assert got["data"]["result"], f"{title}: no data for {expr}"
        per_run = query(
            "avg by (run) (DCGM_FI_DEV_GPU_UTIL * on(UUID) group_left(run, team) gpufleet_gpu_run_info)"
        )
        (row,) = per_run["data"]["result"]
        assert row["metric"]["run"] == "ml-research:llm-pretrain" and float(row["value"][1]) == pytest.approx(
            98.5
        )
        for v in board()["templating"]["list"]:
            if v["type"] == "query":
                m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["definition"])
                assert m, v["definition"]
                series = httpx.get(
                    f"{base}/api/v1/series", params={"match[]": m.group(1).replace("$team", ".*")}, timeout=10
                ).json()
                assert {s[m.group(2)] for s in series["data"]}, v["name"]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        exporter.server.shutdown()
