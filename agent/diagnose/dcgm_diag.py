"""DCGM's own active diagnostic on the checklist: ``dcgmi diag -r 1`` (or deeper), judged like the other items.

Level 1 runs DCGM's deployment checks (driver and library access, persistence
mode, pending page retirements or row remaps, inforom, conflicting
processes) in seconds without loading the GPUs; levels 2 and 3 add PCIe,
memory and stress tests that take the GPUs for minutes, for a prolog or an
operator, not a running job.  The result comes from ``dcgmi diag -r N -j``,
whose JSON is read in both layouts DCGM has printed: ``"DCGM GPU
Diagnostic"`` (3.x: ``results[].gpu_ids``, ``info``, ``status``) and ``"DCGM
Diagnostic"`` (4.x: ``results[].entity_id``, ``warnings[]``,
``test_summary``).  ``dcgmi`` exits non-zero when a test fails and still
prints the document, so the document decides.

A run is kept in a result file (``agent.dcgm_diag_result_file``; the Slurm
prolog writes the same file): the agent re-runs it every
``agent.dcgm_diag_interval_s`` in the background and its checks read the
newest result, whoever produced it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.agent.diagnose.result import Check, skipped

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

log = logging.getLogger(__name__)

#: Longest a level may take before the run is abandoned, seconds (level 3 runs for tens of minutes).
TIMEOUT_S = {1: 300.0, 2: 1200.0, 3: 3600.0, 4: 7200.0}


class DcgmUnavailable(RuntimeError):
    """``dcgmi`` cannot run here (not installed, no host engine); the message says why."""


@dataclass(frozen=True)
class DiagTest:
    category: str
    name: str
    #: ``pass``, ``fail``, ``warn``, ``skip`` or ``not run`` (lower case).
    status: str
    gpus: tuple[int, ...] = ()
    detail: str = ""


@dataclass
class DiagResult:
    tests: list[DiagTest] = field(default_factory=list)
    level: int | None = None
    #: When the run finished (epoch seconds), and who ran it (``agent``, ``prolog``, ``diagnose``).
    time: float | None = None
    origin: str | None = None
    #: The run's own error (``runtime_error``), or why the document could not be read.
    error: str | None = None

    @property
    def failed(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status == "fail"]

    @property
    def warned(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status == "warn"]


def _gpus(result: dict[str, Any]) -> tuple[int, ...]:
    ids = result.get("gpu_ids", result.get("entity_id"))
    if isinstance(ids, int):
        return (ids,)
    if isinstance(ids, str):
        return tuple(int(x) for x in ids.replace(" ", "").split(",") if x.isdigit())
    return ()


def _detail(result: dict[str, Any]) -> str:
    parts = []
    for w in result.get("warnings") or []:
        if isinstance(w, dict) and isinstance(w.get("warning"), str):
            parts.append(w["warning"])
        elif isinstance(w, str):
            parts.append(w)
    if isinstance(result.get("info"), str) and result.get("status", "").lower() in ("fail", "warn"):
        parts.append(result["info"])
    return "; ".join(parts)


def parse_diag_json(text: str) -> DiagResult:
    """The tests of a ``dcgmi diag -j`` document; ``error`` set when it is not one."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        return DiagResult(error=f"not JSON: {e}")
    if not isinstance(doc, dict):
        return DiagResult(error="not a JSON object")
    body = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(body, dict):
        return DiagResult(error="no 'DCGM Diagnostic' (or 'DCGM GPU Diagnostic') object")
    out = DiagResult()
    if isinstance(body.get("runtime_error"), str) and body["runtime_error"]:
        out.error = body["runtime_error"]
    cats = body.get("test_categories")
    if not isinstance(cats, list):
        out.error = out.error or "no test_categories list"
        return out
    for cat in cats:
        if not isinstance(cat, dict):
            continue
        category = str(cat.get("category", ""))
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name", ""))
            results = [r for r in test.get("results") or [] if isinstance(r, dict)]
            statuses = [str(r.get("status", "")).lower() for r in results]
            summary = test.get("test_summary")
            if isinstance(summary, dict) and summary.get("status"):
                statuses.append(str(summary["status"]).lower())
            status = next(
                (s for s in ("fail", "warn", "pass", "skip", "not run") if s in statuses), "not run"
            )
            bad = [r for r in results if str(r.get("status", "")).lower() in ("fail", "warn")] or results
            gpus = tuple(sorted({g for r in bad for g in _gpus(r)}))
            detail = "; ".join(d for d in (_detail(r) for r in bad) if d)
            out.tests.append(DiagTest(category, name, status, gpus, detail[:1000]))
    return out


def run_dcgmi(level: int = 1, dcgmi: str = "dcgmi", timeout_s: float | None = None) -> str:
    """``dcgmi diag -r LEVEL -j``'s document. Raises DcgmUnavailable."""
    exe = shutil.which(dcgmi)
    if exe is None:
        raise DcgmUnavailable(f"DCGM not installed ({dcgmi} not on PATH)")
    limit = timeout_s or TIMEOUT_S.get(level, 3600.0)
    try:
        p = subprocess.run(
            [exe, "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise DcgmUnavailable(f"dcgmi diag -r {level} did not finish in {limit:g} s") from e
    except OSError as e:
        raise DcgmUnavailable(f"{dcgmi}: {e.strerror}") from e
    out = p.stdout.strip()
    if not out.startswith("{"):
        err = (p.stderr.strip() or out)[-300:]
        raise DcgmUnavailable(f"dcgmi diag -r {level} exited {p.returncode}: {err or '(no output)'}")
    return out


def run_diag(
    level: int = 1, dcgmi: str = "dcgmi", origin: str = "diagnose", clock: Callable[[], float] = time.time
) -> DiagResult:
    try:
        text = run_dcgmi(level, dcgmi)
    except DcgmUnavailable as e:
        return DiagResult(level=level, time=clock(), origin=origin, error=str(e))
    r = parse_diag_json(text)
    r.level, r.time, r.origin = level, clock(), origin
    return r


def write_result(path: Path, result: DiagResult) -> None:
    """The result as a small JSON file, replaced atomically (the checks may read it at any time)."""
    doc = {
        "level": result.level,
        "time": result.time,
        "origin": result.origin,
        "error": result.error,
        "tests": [
            {
                "category": t.category,
                "name": t.name,
                "status": t.status,
                "gpus": list(t.gpus),
                "detail": t.detail,
            }
            for t in result.tests
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def read_result(path: Path) -> DiagResult | None:
    """A result file: gpufleet's own (``write_result``) or a raw ``dcgmi diag -j`` document a prolog
    saved (its time is the file's modification time). None when there is none."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except OSError:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return DiagResult(time=mtime, origin=str(path), error=f"{path}: not JSON")
    if isinstance(doc, dict) and "tests" in doc and isinstance(doc["tests"], list):
        tests = [
            DiagTest(
                str(t.get("category", "")),
                str(t.get("name", "")),
                str(t.get("status", "")).lower(),
                tuple(int(g) for g in t.get("gpus") or [] if isinstance(g, int)),
                str(t.get("detail", "")),
            )
            for t in doc["tests"]
            if isinstance(t, dict)
        ]
        return DiagResult(
            tests,
            doc.get("level") if isinstance(doc.get("level"), int) else None,
            float(doc["time"]) if isinstance(doc.get("time"), int | float) else mtime,
            str(doc.get("origin") or path),
            doc.get("error") if isinstance(doc.get("error"), str) else None,
        )
    r = parse_diag_json(text)
    r.time, r.origin = mtime, str(path)
    return r


class DiagSchedule:
    """Runs ``dcgmi diag`` in the background every ``interval_s`` and keeps the result file current."""

    def __init__(
        self,
        result_file: Path,
        interval_s: float,
        level: int = 1,
        dcgmi: str = "dcgmi",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.result_file = result_file
        self.interval_s = interval_s
        self.level = level
        self.dcgmi = dcgmi
        self.clock = clock
        self._thread: threading.Thread | None = None

    def due(self) -> bool:
        last = read_result(self.result_file)
        return last is None or last.time is None or self.clock() - last.time >= self.interval_s

    def maybe_start(self) -> bool:
        """Start a run when none is running and the newest result is older than the interval."""
        if self._thread is not None and self._thread.is_alive():
            return False
        if shutil.which(self.dcgmi) is None or not self.due():
            return False
        self._thread = threading.Thread(target=self._run, name="dcgm-diag", daemon=True)
        self._thread.start()
        return True

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        result = run_diag(self.level, self.dcgmi, "agent", self.clock)
        try:
            write_result(self.result_file, result)
        except OSError as e:
            log.warning("dcgm diag: cannot write %s: %s", self.result_file, e)


def check_dcgm_diag(view: NodeView) -> Check:
    r = view.dcgm_diag
    if r is None:
        return skipped("dcgm_diag", "node", view.dcgm_diag_skip or "DCGM diagnostic not run", "tests")
    when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(r.time)) if r.time else "unknown time"
    level = f"level {r.level}" if r.level else "level ?"
    ev: dict[str, Any] = {
        "level": r.level,
        "time": r.time,
        "origin": r.origin,
        "error": r.error,
        "tests": [
            {
                "category": t.category,
                "name": t.name,
                "status": t.status,
                "gpus": list(t.gpus),
                "detail": t.detail,
            }
            for t in r.tests
        ],
    }
    if r.error is not None and not r.tests:
        if "not on PATH" in r.error:
            return skipped("dcgm_diag", "node", r.error, "tests")
        return Check(
            "dcgm_diag",
            "node",
            "unknown",
            f"dcgmi diag ({level}) did not give a result: {r.error}",
            None,
            "tests",
            "check that the DCGM host engine runs (systemctl status nvidia-dcgm)",
            ev,
        )
    failed, warned = r.failed, r.warned
    if failed:
        what = "; ".join(
            f"{t.name}"
            + (f" on GPU {','.join(map(str, t.gpus))}" if t.gpus else "")
            + (f": {t.detail[:160]}" if t.detail else "")
            for t in failed
        )
        return Check(
            "dcgm_diag",
            "node",
            "fail",
            f"{len(failed)} of {len(r.tests)} tests failed ({level}, {when}): {what}",
            len(failed),
            "tests",
            "fix what the failed test names (persistence mode, pending row remaps, a GPU that fails "
            "memory or PCIe tests) before scheduling jobs here; quarantine the node until it passes",
            ev,
        )
    if warned:
        what = "; ".join(t.name for t in warned)
        return Check(
            "dcgm_diag",
            "node",
            "warn",
            f"{len(warned)} of {len(r.tests)} tests warned ({level}, {when}): {what}",
            0,
            "tests",
            "read the warning in dcgmi diag's output",
            ev,
        )
    return Check(
        "dcgm_diag",
        "node",
        "ok",
        f"{sum(t.status == 'pass' for t in r.tests)} of {len(r.tests)} tests passed, the others skipped "
        f"({level}, {when})",
        0,
        "tests",
        "",
        ev,
    )
