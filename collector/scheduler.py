"""How the collector acts on a scheduler, for the quarantine hooks and the run actions alike.

Two ways out: a command with a time limit (Slurm's ``scontrol``, ``scancel``) and a PATCH of the
Kubernetes API with the service account's token and CA.  Each translates its failures once into an
:class:`Outcome` that names the cause (binary not found, timed out, exit status and output; token
unreadable, CA unloadable, server unreachable, HTTP status and the server's message), so a hook never
turns an error into silence and its record on the incident says why.  The records both hooks append to
``incidents.actions`` share their results (:data:`DONE`, :data:`DRY_RUN`, ...), their times and the
retry rule (:func:`retry_due`).
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

#: Results recorded on an incident.  ``done`` and ``dry_run`` count as acted on.
DONE, DRY_RUN, FAILED, SKIPPED, RATE_LIMITED = "done", "dry_run", "failed", "skipped", "rate_limited"
ACTED = (DONE, DRY_RUN)
#: How much of a command's or server's reply is kept in the record.
DETAIL_CHARS = 500


@dataclass
class Outcome:
    result: str
    detail: str
    #: What was (or would have been) run: a command line, or the request.
    call: dict[str, Any] = field(default_factory=dict)
    #: A command's whole standard output (``detail`` keeps the end of what it printed).
    output: str = ""


def run_command(cmd: Sequence[str], timeout_s: float, done: str, setting: str) -> Outcome:
    """Run ``cmd``; ``done`` is the detail of a success without output, ``setting`` the setting naming the
    binary (for the hint when it is not found)."""
    call = {"command": list(cmd)}
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return Outcome(
            FAILED,
            f"{cmd[0]}: not found (is this collector on a Slurm login/controller host, or is "
            f"{setting} the full path?)",
            call,
        )
    except subprocess.TimeoutExpired:
        return Outcome(FAILED, f"{Path(cmd[0]).name} did not finish in {timeout_s:g} s", call)
    except OSError as e:
        return Outcome(FAILED, f"{cmd[0]}: {e}", call)
    out = (p.stdout + p.stderr).strip()[-DETAIL_CHARS:]
    if p.returncode != 0:
        return Outcome(FAILED, f"{Path(cmd[0]).name} exited {p.returncode}: {out or '(no output)'}", call)
    return Outcome(DONE, out or done, call, p.stdout)


class KubernetesApi:
    """PATCHes objects of the Kubernetes API with the service account's token (read at each call, as the
    kubelet rotates it) and the cluster's CA."""

    def __init__(
        self,
        api_url: str,
        token_file: Path,
        ca_file: Path | None,
        timeout_s: float = 30.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self._client = client

    def patch(self, path: str, body: Mapping[str, Any], content_type: str, done: str) -> Outcome:
        """PATCH ``path`` (from ``/api`` or ``/apis``) with ``body``; ``done`` is the detail of a success."""
        url = self.api_url + path
        call = {"request": f"PATCH {url}", "body": dict(body)}
        try:
            token = self.token_file.read_text().strip()
        except OSError as e:
            return Outcome(
                FAILED, f"cannot read the service account token {self.token_file}: {e.strerror or e}", call
            )
        if not token:
            return Outcome(FAILED, f"the service account token {self.token_file} is empty", call)
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": content_type,
            "Accept": "application/json",
        }
        try:
            if self._client is not None:
                r = self._client.patch(url, json=dict(body), headers=headers, timeout=self.timeout_s)
            else:
                try:
                    verify = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
                except (OSError, ssl.SSLError) as e:
                    return Outcome(FAILED, f"cannot load the CA {self.ca_file}: {e}", call)
                with httpx.Client(verify=verify, timeout=self.timeout_s) as c:
                    r = c.patch(url, json=dict(body), headers=headers)
        except (httpx.HTTPError, ssl.SSLError) as e:
            return Outcome(FAILED, f"API server unreachable: {type(e).__name__}: {e}"[:DETAIL_CHARS], call)
        if r.status_code != 200:
            try:
                msg = str(r.json().get("message") or r.text)
            except ValueError:
                msg = r.text
            return Outcome(FAILED, f"HTTP {r.status_code}: {msg}"[:DETAIL_CHARS], call)
        return Outcome(DONE, done, call)


def epoch(text: Any) -> float:
    """Epoch seconds of a record's time (0 when unreadable: a retry is then due)."""
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def retry_due(mine: Sequence[Mapping[str, Any]], now: float, retry_after_s: float, max_attempts: int) -> bool:
    """Whether another attempt may be made after the failures among ``mine`` (one hook's records of one
    incident): fewer than ``max_attempts``, the last at least ``retry_after_s`` ago."""
    failures = [a for a in mine if a.get("result") == FAILED]
    if len(failures) >= max_attempts:
        return False
    return not failures or now - epoch(failures[-1].get("time")) >= retry_after_s
