"""One installed name: the wheel holds ``gpufleet`` alone.

The repository keeps its agreed top-level folders (``agent/``, ``collector/``,
``api/``, ``dashboards/``, ``migrations/``); each is linked into the package
as ``gpufleet.<folder>``, and every import goes through that name, so an
installed gpufleet never puts modules called ``api`` or ``agent`` into
site-packages where another distribution's could collide with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("agent", "collector", "api", "dashboards", "migrations")


def test_wheel_installs_one_top_level_name_and_runs_without_the_checkout(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, timeout=300,
                   env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    (whl,) = (tmp_path / "dist").glob("gpufleet-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"gpufleet"}
    for c in COMPONENTS:
        assert f"gpufleet/{c}/__init__.py" in names, c
    # Data the product reads at run time travels too.
    assert "gpufleet/migrations/env.py" in names
    assert any(n.startswith("gpufleet/sim/scenarios/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("gpufleet/dashboards/") and n.endswith(".json") for n in names)

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
    env["PYTHONPATH"] = str(tmp_path / "site")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(tmp_path / "site")), out["file"]
    assert out["bad"] == []
    assert out["tops"] == []
