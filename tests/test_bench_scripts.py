"""Every benchmark and tool script still loads: nothing else imports them, so a moved name would go unseen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: tools/gen_podresources.py takes no options (it rewrites the generated modules; its own test runs it).
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), ROOT / "tools" / "record_gpu_traces.py"])


def test_there_are_scripts() -> None:
    assert {p.name for p in SCRIPTS} >= {"sweep.py", "ingest.py", "detector_quality.py", "vs_prometheus.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_answers_help(script: Path) -> None:
    res = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage" in res.stdout.lower()
