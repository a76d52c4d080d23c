"""`gpufleet demo` on its embedded database, as a person runs it: nothing it started outlives it, however it
is stopped, and Grafana reaches its database on loopback TCP as a read-only role."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg
import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.surfaces.fake_grafana import FakeGrafana

pytestmark = pytest.mark.timeout(300)


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    data_dir: Path
    lines: list[str] = field(default_factory=list)
    _q: queue.Queue[str] = field(default_factory=queue.Queue)

    def wait_for(self, text: str, timeout_s: float = 150.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self._q.empty():
                    break
                continue
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} from the demo:\n" + "".join(self.lines[-40:]))

    def drain(self) -> str:
        while not self._q.empty():
            self.lines.append(self._q.get())
        return "".join(self.lines)


def survivors(data_dir: Path) -> list[str]:
    """Processes whose command line names the demo's data directory (its PostgreSQL, the watchdog)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(data_dir) in cmd:
            out.append(f"{p.info['pid']} {cmd}")
    return out


def gone(data_dir: Path, timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = survivors(data_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = survivors(data_dir)
    return left


@pytest.fixture
def demo() -> Iterator[Demo]:
    """A demo on its own embedded database (no GPUFLEET_DATABASE_URL), in a process group of its own as a
    shell runs it.  Its data directory is outside pytest's (whose root pytest keeps private to root, while the
    embedded server runs as a user of its own)."""
    base = Path(tempfile.mkdtemp(prefix="gpufleet-demo-test-"))
    base.chmod(0o755)
    data = base / "data"
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_DATABASE_URL"}
    env["GPUFLEET_DATA_DIR"] = str(data)
    env["COLUMNS"] = "100"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "demo",
            "--backfill-minutes",
            "0.5",
            "--api-port",
            "0",
            "--collector-port",
            "0",
            "--db-port",
            "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    d = Demo(proc, data)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            d._q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        yield d
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for p in psutil.process_iter(["pid", "cmdline"]):  # never leave one behind for the next test
            if str(data) in " ".join(p.info["cmdline"] or []):
                p.kill()
        shutil.rmtree(base, ignore_errors=True)


def test_ctrl_c_to_the_process_group_stops_everything(demo: Demo) -> None:
    demo.wait_for("back-filled")
    assert survivors(demo.data_dir), "the embedded database should be running while the demo runs"
    os.killpg(demo.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    assert demo.proc.wait(60) == 0
    assert "demo stopped" in demo.drain()
    assert gone(demo.data_dir) == []


def test_a_killed_demo_leaves_no_database_behind(demo: Demo) -> None:
    demo.wait_for("back-filled")
    os.kill(demo.proc.pid, signal.SIGKILL)  # no exit handler runs
    demo.proc.wait(10)
    assert gone(demo.data_dir) == [], "the watchdog should stop the embedded database"


def test_sigterm_stops_the_demo_and_its_database(demo: Demo) -> None:
    demo.wait_for("back-filled")
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(60) == 0
    assert gone(demo.data_dir) == []


def test_grafana_reaches_the_demo_database_read_only_on_loopback(demo: Demo) -> None:
    line = demo.wait_for("(data source postgresql://gpufleet_reader@127.0.0.1:")
    reader = line.split("(data source ", 1)[1].split(":", 3)
    url = "postgresql://gpufleet_reader@127.0.0.1:" + reader[2].split("/")[0] + "/gpufleet_demo"
    demo.wait_for("back-filled")
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] > 0  # type: ignore[index]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("DELETE FROM runs")
    token = "glsa_demo_0123456789"
    with FakeGrafana(token) as g:
        env = {"GPUFLEET_DATA_DIR": str(demo.data_dir)}
        r = CliRunner().invoke(app, ["dashboards", "push", "--grafana-url", g.url, "--token", token], env=env)
        assert r.exit_code == 0, r.output
        created = next(q.body for q in g.requests if q.method == "POST" and q.path == "/api/datasources")
        assert created["user"] == "gpufleet_reader" and created["url"].startswith("127.0.0.1:")
        assert (
            created["jsonData"]["database"] == "gpufleet_demo" and created["jsonData"]["sslmode"] == "disable"
        )
