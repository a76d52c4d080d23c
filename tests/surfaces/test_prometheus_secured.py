"""deploy/prometheus/prometheus-secured.yml: promtool accepts it, and a real Prometheus using it
scrapes a collector and an agent whose /metrics need a client certificate and a bearer token,
while a scrape without them is refused."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from gpufleet.agent.metrics import AgentMetrics
from gpufleet.collector.app import create_app as create_collector
from gpufleet.collector.tls import protocol_class
from gpufleet.config import Settings
from gpufleet.metricsauth import MetricsGuard
from gpufleet.serverthread import free_port, serve
from tests.system_tools import tool
from testsupport.certs import TestCA

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
SECURED = PROM / "prometheus-secured.yml"
TOKEN = "prometheus-scrape-token-0123456789"


def _secrets(where: Path, ca: TestCA) -> None:
    secrets = where / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    shutil.copy(ca.pem, secrets / "gpufleet-ca.crt")
    client = ca.client("prometheus")
    shutil.copy(client.cert, secrets / "prometheus.crt")
    shutil.copy(client.key, secrets / "prometheus.key")
    (secrets / "metrics-token").write_text(TOKEN + "\n")


def test_promtool_accepts_the_secured_config(tmp_path: Path) -> None:
    shutil.copy(SECURED, tmp_path / "prometheus.yml")
    shutil.copytree(PROM / "rules", tmp_path / "rules")
    _secrets(tmp_path, TestCA(tmp_path / "pki"))
    r = subprocess.run(
        [tool("promtool", "prometheus"), "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = yaml.safe_load(SECURED.read_text())
    for job in cfg["scrape_configs"]:
        if job["job_name"].startswith("gpufleet-"):
            assert job["scheme"] == "https" and job["authorization"]["credentials_file"]
            assert job["tls_config"]["cert_file"] and job["tls_config"]["key_file"]


def _until(fn: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except (httpx.HTTPError, ValueError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out: {last!r}")


@pytest.mark.timeout(120)
def test_real_prometheus_scrapes_protected_endpoints(db: str, settings: Settings, tmp_path: Path) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("""INSERT INTO incidents (kind, scope_key, run_id, severity, start, last_seen)
                     VALUES ('starvation', 's:run-x', 'run-x', 'warning', now(), now())""")
    ca = TestCA(tmp_path / "pki")
    server = ca.server()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    s = settings.model_copy(
        update={
            "tls": settings.tls.model_copy(
                update={
                    "certfile": server.cert,
                    "keyfile": server.key,
                    "client_ca": ca.pem,
                    "client_cert": "optional",
                }
            ),
            "metrics": settings.metrics.model_copy(
                update={"token_file": token_file, "client_names": ["prometheus"]}
            ),
        }
    )
    agent = AgentMetrics()
    agent.samples_spooled.inc(5)
    agent_port = agent.serve(free_port(), "127.0.0.1", MetricsGuard(TOKEN), server.cert, server.key, ca.pem)
    work = tmp_path / "prom"
    work.mkdir()
    _secrets(work, ca)
    port = free_port()
    try:
        with serve(
            create_collector(db, s, run_leader=False),
            ssl_certfile=str(server.cert),
            ssl_keyfile=str(server.key),
            ssl_ca_certs=str(ca.pem),
            ssl_cert_reqs=ssl.CERT_OPTIONAL,
            http=protocol_class(),
        ) as col:
            # without Prometheus' certificate and token, nothing
            plain = ssl.create_default_context(cafile=str(ca.pem))
            assert httpx.get(col.url + "/metrics", verify=plain, timeout=10).status_code == 403
            cfg = yaml.safe_load(SECURED.read_text())
            cfg["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
            cfg.pop("alerting")
            cfg["rule_files"] = []
            (work / "agents").mkdir()
            (work / "agents" / "nodes.yml").write_text(
                yaml.safe_dump([{"targets": [f"127.0.0.1:{agent_port}"]}])
            )
            for job in cfg["scrape_configs"]:
                if job["job_name"] == "gpufleet-collector":
                    job["static_configs"] = [{"targets": [col.url.removeprefix("https://")]}]
                elif job["job_name"] == "gpufleet-agent":
                    job["file_sd_configs"][0]["files"] = [str(work / "agents" / "*.yml")]
                elif job["job_name"] == "prometheus":
                    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
            (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
            proc = subprocess.Popen(
                [
                    tool("prometheus", "prometheus"),
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                cwd=work,
                stdout=subprocess.DEVNULL,
                stderr=(work / "log").open("w"),
            )
            try:
                api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

                def up() -> dict[str, str] | None:
                    active = api.get("/api/v1/targets").json()["data"]["activeTargets"]
                    jobs = {t["labels"]["job"]: t["health"] for t in active}
                    return jobs if set(jobs.values()) == {"up"} and len(jobs) == 3 else None

                assert _until(up, 60)

                def query(q: str) -> list[dict[str, Any]]:
                    return api.get("/api/v1/query", params={"query": q}).json()["data"]["result"]

                got = _until(lambda: query("gpufleet_incident_open"), 20)
                assert got[0]["metric"]["run_id"] == "run-x"
                assert _until(lambda: query("gpufleet_agent_samples_spooled_total"), 20)[0]["value"][1] == "5"
            finally:
                proc.terminate()
                proc.wait(10)
    finally:
        agent.close()
