"""Collector and agent processes that a test can kill -9 by PID and restart.

A crash has to be a real one: in-process servers share the test's memory and
threads, so killing them proves nothing.  Each process here is started with
``python -m ...`` on a free loopback port, watched with psutil (RSS, open
files), and always killed in the caller's ``finally`` (:meth:`Proc.kill`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import psutil

from gpufleet.serverthread import free_port
from testsupport import with_root_on_path


class Proc:
    """One child process with its log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv = argv
        self.env = env
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by this child's own PID (nothing else is touched); waits for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def open_files(self) -> int:
        return int(psutil.Process(self.pid).num_fds())

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a child: this one without GPUFLEET_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def flatten(prefix: str, values: dict[str, Any]) -> dict[str, str]:
    """Nested settings as GPUFLEET_* variables (``{"ingest": {"writers": 1}}`` -> GPUFLEET_INGEST__WRITERS)."""
    out: dict[str, str] = {}
    for k, v in values.items():
        name = f"{prefix}__{k.upper()}" if prefix else f"GPUFLEET_{k.upper()}"
        if isinstance(v, dict):
            out.update(flatten(name, v))
        elif v is not None:
            out[name] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


class CollectorProc(Proc):
    """``gpufleet collector`` (or ``service="api"``) on its own port; restarts keep the port."""

    def __init__(
        self,
        db_url: str,
        workdir: Path,
        settings: dict[str, Any] | None = None,
        port: int | None = None,
        name: str = "collector",
        service: str = "collector",
    ) -> None:
        self.port = port or free_port()
        self.tls = bool((settings or {}).get("tls", {}).get("certfile"))
        values = {"log_level": "WARNING", "data_dir": str(workdir / name), **(settings or {})}
        argv = [
            sys.executable,
            "-m",
            "gpufleet.cli",
            service,
            "--db",
            db_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        super().__init__(argv, with_root_on_path(child_env(flatten("", values))), workdir / f"{name}.log")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def wait_up(self, timeout: float = 60.0, **client: Any) -> None:
        """Until /healthz answers (the app and its lifespan are up); ``client``: httpx options (TLS)."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"collector exited during start-up:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1, **client).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"collector did not start:\n{self.tail()}")
            time.sleep(0.1)


class AgentProc(Proc):
    """``gpufleet agent`` on ``gpus`` fake H100s and the host source, through
    :mod:`testsupport.agentproc` (which records what it produced and what
    was acknowledged); restarts keep the spool, as a node's agent would."""

    def __init__(
        self,
        url: str,
        token: str,
        node: str,
        workdir: Path,
        *,
        gpus: int = 2,
        settings: dict[str, Any] | None = None,
        name: str = "agent",
    ) -> None:
        self.node = node
        self.spool_dir = workdir / f"{name}-spool"
        self.produced = workdir / f"{name}.produced.jsonl"
        self.acked = workdir / f"{name}.acked.jsonl"
        agent = {
            "collector_url": url,
            "token": token,
            "node": node,
            "spool_dir": str(self.spool_dir),
            "metrics_port": 0,
            "attribute_processes": False,
            **(settings or {}),
        }
        values = {"log_level": "INFO", "data_dir": str(workdir / name), "agent": agent}
        argv = [
            sys.executable,
            "-m",
            "testsupport.agentproc",
            str(self.produced),
            str(self.acked),
            "agent",
            "--fake-nvml",
            str(gpus),
        ]
        super().__init__(argv, with_root_on_path(child_env(flatten("", values))), workdir / f"{name}.log")


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    """Kill every listed process on the way out, whatever happened."""
    try:
        yield
    finally:
        for p in procs:
            p.kill()
