"""Deployment files, checked without a container engine or a cluster: they parse, name real
settings, routes, ports and files, pin their images, and keep secrets out of the files."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel

from gpufleet.api.app import create_app as create_api
from gpufleet.collector.app import create_app as create_collector
from gpufleet.config import ConfigError, Settings, load_settings
from gpufleet.dashboards.model import DS_TYPE
from gpufleet.dashboards.provision import DEFAULT_DS_NAME, DEFAULT_DS_UID, DEFAULT_FOLDER_UID, DataSource
from gpufleet.db.reader import SETTINGS as READER_SETTINGS
from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
GRAFANA = DEPLOY / "grafana" / "provisioning"
SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY$|CREDENTIAL", re.I)
DUMMY_URL = "postgresql://nobody@127.0.0.1:9/none"


# ---------------------------------------------------------------- helpers


def settings_field(env: str) -> bool:
    """Whether ``env`` names a field of gpufleet's Settings (``__`` for nesting)."""
    if env == "GPUFLEET_CONFIG":
        return True
    if not env.startswith("GPUFLEET_"):
        return False
    model: type[BaseModel] = Settings
    parts = env.removeprefix("GPUFLEET_").lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        if i < len(parts) - 1:
            ann = field.annotation
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                return False
            model = ann
    return True


def assert_valid_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    bad = [k for k in env if k.startswith("GPUFLEET_") and not settings_field(k)]
    assert bad == [], f"{where}: not gpufleet settings: {bad}"
    with monkeypatch.context() as m:
        for k in list(os.environ):
            if k.startswith("GPUFLEET_"):
                m.delenv(k)
        for k, v in env.items():
            if k.startswith("GPUFLEET_"):
                m.setenv(k, v)
        try:
            load_settings()
        except ConfigError as e:
            pytest.fail(f"{where}: {e}")


def pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


class _Routes:
    """Whether a GET of a path reaches a route of the collector or the API (no database needed)."""

    def __init__(self, kind: str) -> None:
        settings = load_settings(data_dir=Path("/nonexistent"))
        app = (
            create_collector(DUMMY_URL, settings, run_leader=False)
            if kind == "collector"
            else create_api(DUMMY_URL, settings)
        )
        with warnings.catch_warnings():  # starlette's notice about its httpx dependency
            warnings.simplefilter("ignore")
            from fastapi.testclient import TestClient
        self.client = TestClient(app)  # no lifespan: nothing connects

    def __contains__(self, path: object) -> bool:
        return self.client.get(str(path)).status_code != 404


def routes(kind: str) -> _Routes:
    return _Routes(kind)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_route_checker_knows_real_routes() -> None:
    assert "/readyz" in routes("collector") and "/metrics" in routes("collector")
    assert "/readyz" in routes("api") and "/healthz" in routes("api")
    assert "/nope" not in routes("api") and "/metrics" not in routes("api")


def test_settings_field_checker() -> None:
    assert settings_field("GPUFLEET_DATABASE_URL") and settings_field("GPUFLEET_DETECT__SWEEP_INTERVAL_S")
    assert settings_field("GPUFLEET_AGENT__METRICS_PORT")
    for bad in (
        "GPUFLEET_COLLECTOR_PROT",
        "GPUFLEET_DETECT__NOPE",
        "GPUFLEET_DATABASE_URL__X",
        "DATABASE_URL",
    ):
        assert not settings_field(bad), bad
    assert pinned("timescale/timescaledb:2.17.2-pg16") and pinned("gpufleet@sha256:" + "0" * 64)
    assert not pinned("grafana/grafana") and not pinned("prom/prometheus:latest")
    assert not pinned("registry.example:5000/gpufleet")


# ---------------------------------------------------------------- docker compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


GPUFLEET_SERVICES = ("migrate", "collector", "api")


def test_compose_services_images_and_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    assert set(services) == {"db", "migrate", "collector", "api", "grafana", "prometheus", "alertmanager"}
    for name, svc in services.items():
        assert pinned(svc["image"]), (name, svc["image"])
    assert services["db"]["image"].startswith("timescale/timescaledb:2.")
    for name in GPUFLEET_SERVICES:
        svc = services[name]
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert_valid_settings(env, monkeypatch, f"compose {name}")
        assert urlsplit(env["GPUFLEET_DATABASE_URL"]).password is None
        assert svc["secrets"] == ["db_password"] and "/run/secrets/db_password" in " ".join(svc["entrypoint"])
        build = svc["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file()
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in ("collector", "api"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_compose_keeps_secrets_in_files(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if SECRETISH.search(key):
                assert key.endswith("_FILE") and str(value).startswith("/run/secrets/"), (name, key)
            assert not re.search(r"://[^/@\s]+:[^/@\s]+@", str(value)), (name, key, "password in a URL")
    for name, secret in compose["secrets"].items():
        assert secret["file"] == f"./secrets/{name}"
    assert "secrets/" in (COMPOSE.parent / ".gitignore").read_text().split()
    db = compose["services"]["db"]["environment"]
    assert db["POSTGRES_PASSWORD_FILE"] == "/run/secrets/db_password"


def test_compose_ports_probes_and_scrape_targets_agree(compose: dict[str, Any]) -> None:
    services = compose["services"]
    defaults = Settings.model_fields
    for name, port_field, kind in (("collector", "collector_port", "collector"), ("api", "api_port", "api")):
        svc = services[name]
        port = int(svc["environment"][f"GPUFLEET_{port_field.upper()}"])
        assert port == defaults[port_field].default
        assert svc["ports"] == [f"{port}:{port}"]
        assert svc["environment"][f"GPUFLEET_{name.upper()}_HOST"] == "0.0.0.0"
        probe = " ".join(svc["healthcheck"]["test"])
        path = re.search(rf"http://127\.0\.0\.1:{port}(/\w+)", probe)
        assert path is not None and path.group(1) in routes(kind), probe
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert targets["gpufleet-collector"]["static_configs"][0]["targets"] == [
        f"collector:{defaults['collector_port'].default}"
    ]
    assert "/metrics" in routes("collector")
    am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am == "alertmanager:9093" and services["alertmanager"]["ports"] == ["9093:9093"]


def test_compose_mounts_exist_and_match_grafana_provisioning(compose: dict[str, Any]) -> None:
    base = COMPOSE.parent
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (base / src).exists(), (name, src)
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    provider = yaml.safe_load((GRAFANA / "dashboards" / "gpufleet.yaml").read_text())["providers"][0]
    dash_dir = base / mounts[provider["options"]["path"]]
    assert sorted(p.name for p in dash_dir.glob("*.json")) == sorted(
        p.name for p in (ROOT / "dashboards").glob("*.json")
    )
    assert (base / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA.resolve()
    ds_text = (GRAFANA / "datasources" / "gpufleet.yaml").read_text()
    used = set(re.findall(r"\$\{(\w+)\}", ds_text))
    assert used and used <= set(grafana["environment"]), used - set(grafana["environment"])
    secret_file = re.search(r"\$__file\{/run/secrets/(\w+)\}", ds_text)
    assert secret_file and secret_file.group(1) in grafana["secrets"]
    initdb = base / "initdb" / "10-grafana-role.sh"
    assert initdb.stat().st_mode & stat.S_IXUSR
    assert grafana["environment"]["GRAFANA_PG_USER"] in initdb.read_text()
    for setting, value in READER_SETTINGS:  # the role as `gpufleet db reader` sets one up
        assert (
            f"ALTER ROLE {grafana['environment']['GRAFANA_PG_USER']} SET {setting} = {value};"
            in initdb.read_text()
        )
    assert "grafana_db_password" in compose["services"]["db"]["secrets"]


def test_dockerfile() -> None:
    text = (DEPLOY / "compose" / "Dockerfile").read_text()
    for image in re.findall(r"^FROM\s+(\S+)", text, re.M):
        assert pinned(image), image
    for src in re.findall(r"^COPY\s+(?!--)(.+?)\s+\S+$", text, re.M):
        for part in src.split():
            assert (ROOT / part).exists(), part
    assert re.search(r"^USER\s+10001", text, re.M)
    assert set(re.search(r"^EXPOSE\s+(.+)$", text, re.M).group(1).split()) == {"8410", "8420"}  # type: ignore[union-attr]
    assert '["gpufleet"]' in text


# ---------------------------------------------------------------- Kubernetes


def _k8s_resources() -> list[dict[str, Any]]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = []
    for res in kust["resources"]:
        out += docs(K8S / res)
    return out


def _containers(resources: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for r in resources:
        if r["kind"] in ("Deployment", "Job", "DaemonSet", "StatefulSet"):
            for c in r["spec"]["template"]["spec"]["containers"]:
                out.append((r["metadata"]["name"], r, c))
    return out


def test_k8s_files_parse_and_kustomize_builds() -> None:
    for path in K8S.rglob("*.yaml"):
        assert docs(path), path
    kubectl = tool("kubectl", "kubernetes-client")
    for d in (K8S, K8S / "monitoring"):
        r = subprocess.run(
            [kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 0, r.stderr
        built = [x for x in yaml.safe_load_all(r.stdout) if x]
        for x in built:
            if x["kind"] != "Namespace":
                assert x["metadata"]["namespace"] == "gpufleet", x["metadata"]["name"]


def test_k8s_deployments_probes_ports_and_images(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = _k8s_resources()
    by = {(r["kind"], r["metadata"]["name"]): r for r in resources}
    collector = by[("Deployment", "gpufleet-collector")]
    api = by[("Deployment", "gpufleet-api")]
    assert collector["spec"]["replicas"] >= 2 and api["spec"]["replicas"] >= 2
    config = by[("ConfigMap", "gpufleet-config")]["data"]
    assert_valid_settings({**config, "GPUFLEET_DATABASE_URL": DUMMY_URL}, monkeypatch, "k8s ConfigMap")
    for deploy, kind, port_field in ((collector, "collector", "collector_port"), (api, "api", "api_port")):
        (c,) = deploy["spec"]["template"]["spec"]["containers"]
        assert c["args"] == [kind]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"http": Settings.model_fields[port_field].default}
        assert int(config[f"GPUFLEET_{port_field.upper()}"]) == ports["http"]
        assert config[f"GPUFLEET_{kind.upper()}_HOST"] == "0.0.0.0"
        known = routes(kind)
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] in known and get["port"] in ports, (kind, probe)
        svc = by[("Service", deploy["metadata"]["name"])]
        assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
        assert svc["spec"]["ports"][0]["targetPort"] in ports
        assert svc["spec"]["ports"][0]["port"] == ports["http"]
        assert by[("PodDisruptionBudget", deploy["metadata"]["name"])]["spec"]["minAvailable"] == 1
    for name, _, c in _containers(resources):
        assert pinned(c["image"]), (name, c["image"])
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name


def test_k8s_secrets_are_references_only(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = _k8s_resources()
    assert not [r for r in resources if r["kind"] == "Secret"], "Secrets are created out of band"
    for path in K8S.rglob("*.yaml"):
        for d in docs(path):
            if d.get("kind") == "Secret":
                assert set((d.get("stringData") or {}).values()) == {"REPLACE_ME"} and not d.get("data"), path
            for _, _, c in _containers([d]):
                for e in c.get("env", []):
                    if SECRETISH.search(e["name"]) or e["name"] == "GPUFLEET_DATABASE_URL":
                        assert "secretKeyRef" in e.get("valueFrom", {}), (path.name, e["name"])
                    if e["name"].startswith("GPUFLEET_"):
                        assert settings_field(e["name"]), e["name"]
    job = docs(K8S / "dashboards-push-job.yaml")[0]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][:2] == ["dashboards", "push"]


def test_k8s_monitoring_matches_the_rules_and_services() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("render", K8S / "monitoring" / "render_prometheusrule.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    current = (K8S / "monitoring" / "prometheusrule.yaml").read_text()
    assert current == render.render(), "run deploy/k8s/monitoring/render_prometheusrule.py"
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules" / "gpufleet.rules.yml").read_text())
    assert yaml.safe_load(current)["spec"]["groups"] == rules["groups"]
    monitors = {d["kind"]: d for d in docs(K8S / "monitoring" / "servicemonitor.yaml")}
    svc = next(d for d in docs(K8S / "collector.yaml") if d["kind"] == "Service")
    sm = monitors["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert monitors["PodMonitor"]["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpufleet-agent"
    }


# ---------------------------------------------------------------- systemd


def _unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
            continue
        key, _, value = line.partition("=")
        sections[current].append((key, value))
    return sections


@pytest.mark.parametrize(
    ("unit", "command"), [("gpufleet-collector.service", "collector"), ("gpufleet-api.service", "api")]
)
def test_systemd_units(unit: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    u = _unit(SYSTEMD / unit)
    svc = dict(u["Service"])
    assert svc["ExecStart"].split()[1:] == [command]
    assert svc["User"] == "gpufleet" and svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc["EnvironmentFile"] == "/etc/gpufleet/gpufleet.env"
    assert ("LoadCredential", "pgpass:/etc/gpufleet/pgpass") in u["Service"]
    env = dict(v.split("=", 1) for k, v in u["Service"] if k == "Environment")
    assert env["PGPASSFILE"] == "%d/pgpass"
    assert not [k for k in env if SECRETISH.search(k)]
    assert dict(u["Install"])["WantedBy"] == "multi-user.target"
    example = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "gpufleet.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert urlsplit(example["GPUFLEET_DATABASE_URL"]).password is None
    gpufleet_env = {k: v for k, v in {**env, **example}.items() if k.startswith("GPUFLEET_")}
    assert_valid_settings(gpufleet_env, monkeypatch, unit)
    analyze = tool("systemd-analyze", "systemd")
    exe = shutil.which("gpufleet") or str(ROOT / ".venv" / "bin" / "gpufleet")
    local = tmp_path / unit
    local.write_text((SYSTEMD / unit).read_text().replace("/opt/gpufleet/bin/gpufleet", exe))
    r = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


# ---------------------------------------------------------------- Grafana provisioning


def test_grafana_file_provisioning_matches_the_api_push() -> None:
    (ds,) = yaml.safe_load((GRAFANA / "datasources" / "gpufleet.yaml").read_text())["datasources"]
    pushed = DataSource("db", 5432, "gpufleet", "ro", "pw").payload()
    assert (ds["type"], ds["uid"], ds["name"], ds["access"]) == (
        DS_TYPE,
        DEFAULT_DS_UID,
        DEFAULT_DS_NAME,
        "proxy",
    )
    assert set(ds["jsonData"]) == set(pushed["jsonData"])
    assert ds["jsonData"]["timeInterval"] == pushed["jsonData"]["timeInterval"]
    assert ds["secureJsonData"]["password"].startswith("$__file{")
    (provider,) = yaml.safe_load((GRAFANA / "dashboards" / "gpufleet.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["folderUid"] == DEFAULT_FOLDER_UID
    assert provider["allowUiUpdates"] is False


def test_dcgm_exporter_counters_configmap_builds() -> None:
    kubectl = tool("kubectl", "kubernetes-client")
    d = DEPLOY / "dcgm-exporter"
    r = subprocess.run(
        [kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    (cm,) = [x for x in yaml.safe_load_all(r.stdout) if x]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "gpufleet-dcgm-exporter-counters"
    # The file the exporter reads is the shipped field list, byte for byte.
    assert cm["data"]["dcgm-metrics.csv"] == (d / "counters.csv").read_text()


def test_agent_daemonset_builds_and_mounts_the_kubelet_socket_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl = tool("kubectl", "kubernetes-client")
    r = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "agent")], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    built = {(x["kind"], x["metadata"]["name"]): x for x in yaml.safe_load_all(r.stdout) if x}
    ds = built[("DaemonSet", "gpufleet-agent")]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pinned(c["image"])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    pr = mounts["pod-resources"]
    assert pr["readOnly"] is True and vols["pod-resources"]["hostPath"]["path"] == pr["mountPath"]
    # The agent's settings point at that socket, with Kubernetes attribution on.
    (path := tmp_path / "agent.yaml").write_text(built[("ConfigMap", "gpufleet-agent")]["data"]["agent.yaml"])
    k8s = load_settings(path).agent.kubernetes
    assert k8s.enabled and str(k8s.pod_resources_socket).startswith(pr["mountPath"] + "/")
    # The service account reads pods and the job owners above them, and nothing else.
    assert pod["serviceAccountName"] == "gpufleet-agent"
    role = built[("ClusterRole", "gpufleet-agent")]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}
    resources = {(g, res) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]}
    assert resources == {
        ("", "pods"),
        ("batch", "jobs"),
        ("jobset.x-k8s.io", "jobsets"),
        ("ray.io", "rayclusters"),
    }
    from gpufleet.agent.k8s.pods import OWNER_PATHS

    assert {res for _, res in OWNER_PATHS.values()} == {res for _, res in resources} - {"pods"}
    binding = built[("ClusterRoleBinding", "gpufleet-agent")]
    assert binding["roleRef"]["name"] == "gpufleet-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufleet-agent", "namespace": ds["metadata"]["namespace"]}
    ]


def test_k8s_quarantine_rbac_grants_only_node_get_and_patch() -> None:
    """The opt-in RBAC of the Kubernetes quarantine hook: the collector's account may read and patch
    Nodes (a cordon), nothing more."""
    kubectl = tool("kubectl", "kubernetes-client")
    r = subprocess.run(
        [kubectl, "kustomize", str(K8S / "quarantine")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    built = {x["kind"]: x for x in yaml.safe_load_all(r.stdout) if x}
    assert set(built) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    assert built["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]
    (subject,) = built["ClusterRoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == (
        built["ServiceAccount"]["metadata"]["name"],
        "gpufleet",
    )
    assert built["ClusterRoleBinding"]["roleRef"]["name"] == built["ClusterRole"]["metadata"]["name"]
