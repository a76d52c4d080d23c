"""Container images: the repository builds every image its Kubernetes manifests run.

Each Dockerfile under ``deploy/`` declares the image it builds
(``LABEL io.gpufleet.image=...``); every manifest kustomize renders must run only
those, at the project's version.  The agent's image is the plain install (no
server packages), the server's the server extra; both are multi-stage (build
tools stay in the first stage) and run as an unprivileged user.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.system_tools import tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
WORKLOADS = ("Deployment", "Job", "DaemonSet", "StatefulSet", "CronJob", "ReplicaSet", "Pod")


def dockerfiles() -> dict[str, Path]:
    """Image name -> the Dockerfile that builds it."""
    out: dict[str, Path] = {}
    for path in sorted(DEPLOY.glob("*/Dockerfile")):
        m = re.search(r'^LABEL\s+io\.gpufleet\.image="([^"]+)"', path.read_text(), re.M)
        assert m, f"{path.relative_to(ROOT)} declares no io.gpufleet.image label"
        assert m.group(1) not in out, f"two Dockerfiles build {m.group(1)}"
        out[m.group(1)] = path
    return out


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def stages(text: str) -> list[str]:
    """Each stage's lines, FROM first."""
    parts = re.split(r"(?m)^(?=FROM\s)", text)
    return [p for p in parts if p.startswith("FROM")]


def test_the_agent_and_server_images_are_built_here() -> None:
    assert set(dockerfiles()) == {"gpufleet/gpufleet", "gpufleet/gpufleet-agent"}


@pytest.mark.parametrize("image", ["gpufleet/gpufleet", "gpufleet/gpufleet-agent"])
def test_dockerfiles_are_multi_stage_pinned_and_unprivileged(image: str) -> None:
    path = dockerfiles()[image]
    text = path.read_text()
    built = stages(text)
    assert len(built) >= 2, f"{path}: the build stage's tools must not ship"
    for s in built:
        base = s.split()[1]
        assert re.fullmatch(r"[\w./-]+:\d[\w.-]*|[\w./-]+@sha256:[0-9a-f]{64}", base), f"unpinned base {base}"
    final = built[-1]
    assert "COPY --from=" in final
    user = re.findall(r"^USER\s+(\S+)", final, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root"), f"{path}: runs as root"
    assert re.search(r"^RUN .*pip install", final, re.M) is None, "nothing is installed in the final stage"
    for src in re.findall(r"^COPY\s+(?!--)(.+?)\s+\S+$", text, re.M):
        for part in src.split():
            assert (ROOT / part).exists(), part
    install = re.search(r"pip install .*--prefix=/install\s+(\S+)", text)
    assert install, path
    target = install.group(1).strip("\"'")
    # The agent is the plain install: `pip install gpufleet` (tests/test_packaging.py runs it without any
    # server package); the server adds the server extra.
    assert target == (".[server]" if image == "gpufleet/gpufleet" else "."), target


def rendered() -> dict[str, list[dict[str, Any]]]:
    kubectl = tool("kubectl", "kubernetes-client")
    out = {}
    for kust in sorted(DEPLOY.rglob("kustomization.yaml")):
        r = subprocess.run(
            [kubectl, "kustomize", str(kust.parent)], capture_output=True, text=True, timeout=60, check=False
        )
        assert r.returncode == 0, f"{kust.parent.relative_to(ROOT)}: {r.stderr}"
        out[str(kust.parent.relative_to(ROOT))] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return out


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    if doc.get("kind") != "Pod":
        spec = spec.get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def test_every_manifest_renders_and_runs_only_images_built_here() -> None:
    built = dockerfiles()
    images: dict[str, set[str]] = {}
    for where, docs in rendered().items():
        for d in docs:
            if d.get("kind") in WORKLOADS:
                for c in containers(d):
                    images.setdefault(c["image"], set()).add(where)
    assert images, "no workload rendered"
    for image, where in images.items():
        name, _, tag = image.rpartition(":")
        assert name in built, (
            f"{image} ({', '.join(sorted(where))}) is not built by a Dockerfile under deploy/"
        )
        assert tag == version(), f"{image}: the manifests run release {version()}"
    # The agent's DaemonSet runs the agent's image, the collector and API the server's.
    by_kind = {(d["kind"], d["metadata"]["name"]): d for docs in rendered().values() for d in docs}
    agent = [c["image"] for c in containers(by_kind[("DaemonSet", "gpufleet-agent")])]
    assert agent == [f"gpufleet/gpufleet-agent:{version()}"]
    for name in ("gpufleet-collector", "gpufleet-api"):
        assert {c["image"] for c in containers(by_kind[("Deployment", name)])} == {
            f"gpufleet/gpufleet:{version()}"
        }
