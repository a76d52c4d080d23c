"""Report a training run's progress to the gpufleet API, for tokens per kWh, MFU and goodput.

Call it from the training loop every few minutes with *cumulative* counts
since the run started (a lost report then costs nothing: the next one
carries the total)::

    report_progress("https://gpufleet.example:8420", token, "llm-7b", tokens=step * tokens_per_step)

The token needs the ``write_runs`` capability (an admin token, or the node
token of a node the run uses).
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

import httpx


class ProgressError(RuntimeError):
    """The API refused or could not take the report; the message says why (never the token)."""


def report_progress(
    api_url: str,
    token: str,
    run_id: str,
    *,
    tokens: float | None = None,
    samples: float | None = None,
    time: datetime | None = None,
    timeout_s: float = 10.0,
    client: httpx.Client | None = None,
) -> None:
    """POST cumulative ``tokens``/``samples`` to ``/v1/runs/{run_id}/progress`` (time: now by default)."""
    if tokens is None and samples is None:
        raise ValueError("give tokens or samples (cumulative counts)")
    if time is not None and time.tzinfo is None:
        raise ValueError("time needs a UTC offset")
    body: dict[str, object] = {}
    if tokens is not None:
        body["tokens"] = float(tokens)
    if samples is not None:
        body["samples"] = float(samples)
    if time is not None:
        body["time"] = time.isoformat()
    url = f"{api_url.rstrip('/')}/v1/runs/{quote(run_id, safe='')}/progress"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        if client is None:
            with httpx.Client(timeout=timeout_s) as c:
                r = c.post(url, json=body, headers=headers)
        else:
            r = client.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise ProgressError(f"progress for run {run_id!r} not sent: {type(e).__name__}: {e}") from e
    if r.status_code != 204:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ProgressError(f"progress for run {run_id!r} refused: HTTP {r.status_code}: {detail}")
