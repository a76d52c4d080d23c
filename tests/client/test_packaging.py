"""gpufleet-client is its own distribution: its wheel needs nothing beyond the standard library."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"


def test_client_wheel_imports_without_gpufleet_or_any_dependency(tmp_path: Path) -> None:
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
            str(tmp_path / "dist"),
            str(CLIENT),
        ],
        check=True,
        timeout=300,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    (whl,) = (tmp_path / "dist").glob("gpufleet_client-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        z.extractall(tmp_path / "site")
    assert {n.split("/", 1)[0] for n in names if ".dist-info" not in n} == {"gpufleet_client"}
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert all("extra ==" in line for line in requires), requires
    # -I -S: no site-packages at all (so neither gpufleet nor any third-party package), only the wheel.
    probe = f"""
import sys
sys.path.insert(0, {str(tmp_path / "site")!r})
import gpufleet_client
from gpufleet_client import report_progress, ProgressReporter
rep = ProgressReporter("http://127.0.0.1:9", "t", start=False, timeout_s=0.5)
rep.report("r", tokens=1)
assert rep.flush() is False and rep.stats.failed == 1
try:
    import gpufleet
except ImportError:
    pass
else:
    raise SystemExit("gpufleet importable")
third = sorted(m for m in sys.modules if m.split(".")[0] in ("httpx", "pydantic", "psycopg", "numpy", "gpufleet"))
assert not third, third
print("ok", gpufleet_client.__version__)
"""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok 0.1.0"
