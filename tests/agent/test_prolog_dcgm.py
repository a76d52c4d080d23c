"""The Slurm prolog's DCGM diagnostic, with a fake ``dcgmi`` on PATH printing real ``dcgmi diag -j`` output.

The prolog saves the document where the agent's node checks read it
(``agent.dcgm_diag_result_file``) and, only when asked to
(``GPUFLEET_DCGM_DIAG_DRAIN=1``), exits 1 on a failed test so Slurm drains the
node and requeues the job.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gpufleet.agent.diagnose.dcgm_diag import check_dcgm_diag, read_result
from gpufleet.agent.diagnose.view import NodeView
from tests.conftest import realdata

PROLOG = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "prolog.sh"


def failing_doc(tmp_path: Path) -> Path:
    """The real level-1 document with Persistence Mode failed, as DCGM 3.x reports it."""
    doc = json.loads(realdata("VirtualClient", "DCGMI", "DCGMIDiag_r1_results.json").read_text())
    for cat in doc["DCGM GPU Diagnostic"]["test_categories"]:
        for test in cat["tests"]:
            if test["name"] == "Persistence Mode":
                test["results"][0]["status"] = "Fail"
                test["results"][0]["warnings"] = ["Persistence mode for GPU 0 is currently disabled."]
    path = tmp_path / "fail.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def fake_dcgmi(tmp_path: Path, doc: Path, status: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "dcgmi"
    exe.write_text(f'#!/bin/sh\n[ "$1 $2" = "diag -r" ] || exit 9\ncat "{doc}"\nexit {status}\n')
    exe.chmod(0o755)
    return bin_dir


def prolog(tmp_path: Path, bin_dir: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}" if bin_dir else "/usr/bin:/bin"
    full = {
        "PATH": path,
        "GPUFLEET_CONF": "/nonexistent",
        "GPUFLEET_NODE": "n1",
        "GPUFLEET_DCGM_DIAG_FILE": str(tmp_path / "state" / "dcgm-diag.json"),
        **env,
    }
    return subprocess.run(["sh", str(PROLOG)], env=full, capture_output=True, text=True, timeout=60)


def test_a_passing_diagnostic_is_saved_for_the_agent(tmp_path: Path) -> None:
    doc = realdata("VirtualClient", "DCGMI", "DCGMIDiag_r1_results.json")
    r = prolog(tmp_path, fake_dcgmi(tmp_path, doc, 0))
    assert r.returncode == 0, r.stderr
    saved = tmp_path / "state" / "dcgm-diag.json"
    assert saved.read_bytes() == doc.read_bytes()
    result = read_result(saved)
    assert result is not None and len(result.tests) == 9
    assert check_dcgm_diag(NodeView(dcgm_diag=result)).status == "ok"


def test_a_failed_test_is_recorded_and_drains_only_when_asked(tmp_path: Path) -> None:
    bin_dir = fake_dcgmi(tmp_path, failing_doc(tmp_path), 226)
    r = prolog(tmp_path, bin_dir)
    assert r.returncode == 0, r.stderr
    result = read_result(tmp_path / "state" / "dcgm-diag.json")
    assert result is not None and [t.name for t in result.failed] == ["Persistence Mode"]
    assert check_dcgm_diag(NodeView(dcgm_diag=result)).status == "fail"
    r = prolog(tmp_path, bin_dir, GPUFLEET_DCGM_DIAG_DRAIN="1")
    assert r.returncode == 1 and "draining" in r.stderr


def test_no_dcgmi_or_level_0_runs_nothing(tmp_path: Path) -> None:
    assert prolog(tmp_path, None).returncode == 0
    assert not (tmp_path / "state" / "dcgm-diag.json").exists()
    bin_dir = fake_dcgmi(tmp_path, failing_doc(tmp_path), 226)
    r = prolog(tmp_path, bin_dir, GPUFLEET_DCGM_DIAG_LEVEL="0", GPUFLEET_DCGM_DIAG_DRAIN="1")
    assert r.returncode == 0 and not (tmp_path / "state" / "dcgm-diag.json").exists()


def test_garbage_from_dcgmi_leaves_no_result(tmp_path: Path) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("Error: unable to establish a connection to the specified host: localhost\n")
    r = prolog(tmp_path, fake_dcgmi(tmp_path, junk, 255), GPUFLEET_DCGM_DIAG_DRAIN="1")
    assert r.returncode == 0 and not (tmp_path / "state" / "dcgm-diag.json").exists()
