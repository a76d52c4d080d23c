"""Run a real Alertmanager (Debian package prometheus-alertmanager) on loopback for tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from gpufleet.serverthread import free_port

CONFIG = """
route:
  receiver: blackhole
  group_wait: 1s
receivers:
  - name: blackhole
"""


def binary() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@contextlib.contextmanager
def alertmanager(workdir: Path) -> Iterator[str]:
    exe = binary()
    if exe is None:
        raise FileNotFoundError("alertmanager is not installed (Debian package prometheus-alertmanager)")
    port, cluster = free_port(), free_port()
    cfg = workdir / "alertmanager.yml"
    cfg.write_text(CONFIG)
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--cluster.listen-address=127.0.0.1:{cluster}",
            f"--cluster.advertise-address=127.0.0.1:{cluster}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"alertmanager did not start: {err[-500:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
