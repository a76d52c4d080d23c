"""Power caps the fleet planned for runs on this node, applied through NVML to every GPU of the run or none.

Off by default (``agent.power_caps``).  When on, the agent asks the API for
the active plans of the runs on its node (``GET /v1/nodes/{node}/power-caps``,
with its node token) every ``agent.power_cap_poll_s`` and reconciles:

* a plan not yet applied (or changed: a new ``revision``): every GPU the run
  holds on this node must accept the limit (within the board's constraints)
  before any is touched; then each GPU's current limit is remembered in the
  state file and the new one set (``nvmlDeviceSetPowerManagementLimit``); if
  any GPU refuses, the ones already set are put back, so the run's GPUs here
  carry the cap together or not at all;
* a plan that is gone (the run ended, or the plan was withdrawn or failed on
  another node): each GPU gets back the limit it had.

The state file is written before a limit is set, so an agent killed half way
restores on its next start what it had changed.  What happened to each plan
(``applied``, ``failed`` with the reason, ``restored``) goes to the node facts
(``power_caps``), where the API and the collector read it: a failure on any
node withdraws the cap from all of the run's nodes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.sources.nvml_api import NvmlApi, NvmlError, PynvmlApi
from gpufleet.config import AgentSettings

log = logging.getLogger(__name__)

#: A limit closer than this to the one set already is the same limit (NVML works in mW).
SAME_MW = 500


@dataclass(frozen=True)
class Plan:
    run_id: str
    revision: int
    limit_w: float
    gpus: tuple[int, ...]


def parse_plans(doc: Any) -> list[Plan]:
    """The API's answer; a malformed one raises ValueError naming what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("plans"), list):
        raise ValueError('power-cap plans: expected {"plans": [...]}')
    out = []
    for i, p in enumerate(doc["plans"]):
        try:
            limit = float(p["limit_w"])
            gpus = tuple(int(g) for g in p["gpus"])
            plan = Plan(str(p["run_id"]), int(p["revision"]), limit, gpus)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"power-cap plans: entry {i} malformed: {e!r}") from e
        if not limit > 0 or not gpus:
            raise ValueError(f"power-cap plans: entry {i}: limit_w must be above 0 W and gpus non-empty")
        out.append(plan)
    return out


class PowerCapper:
    """Sets one limit on a set of GPUs, all or none, and puts the previous limits back."""

    def __init__(self, api: NvmlApi, state_file: Path) -> None:
        self.api = api
        self.state_file = state_file
        #: run_id -> {"revision", "limit_w", "previous_mw": {gpu: mW}}
        self.state: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.error(
                "power caps: cannot read %s (%s): the limits it recorded cannot be restored",
                self.state_file,
                e,
            )
            return {}
        return doc if isinstance(doc, dict) else {}

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.state, sort_keys=True))
        os.replace(tmp, self.state_file)

    def apply(self, plan: Plan) -> dict[str, Any]:
        """The report of applying ``plan``: ``applied`` or ``failed`` (nothing changed) with the reason."""
        mw = round(plan.limit_w * 1000)
        report: dict[str, Any] = {"revision": plan.revision, "limit_w": plan.limit_w, "gpus": list(plan.gpus)}
        try:
            handles = {g: self.api.device_handle(g) for g in plan.gpus}
            for g, h in handles.items():
                lo, hi = self.api.power_limit_constraints_mw(h)
                if not lo <= mw <= hi:
                    return {
                        **report,
                        "state": "failed",
                        "detail": f"GPU {g} accepts {lo / 1000:g}-{hi / 1000:g} W, "
                        f"not {plan.limit_w:g} W; no GPU was changed",
                    }
            previous = {g: self.api.power_management_limit_mw(h) for g, h in handles.items()}
        except NvmlError as e:
            return {**report, "state": "failed", "detail": f"{e}; no GPU was changed"}
        # Remember what to put back before changing anything (a restore after a crash needs it).
        kept = self.state.get(plan.run_id, {}).get("previous_mw", {})
        self.state[plan.run_id] = {
            "revision": plan.revision,
            "limit_w": plan.limit_w,
            "previous_mw": {str(g): kept.get(str(g), previous[g]) for g in plan.gpus},
        }
        self._save()
        done: list[int] = []
        for g, h in handles.items():
            try:
                self.api.set_power_management_limit_mw(h, mw)
            except NvmlError as e:
                undo = self._put_back(plan.run_id, done)
                return {
                    **report,
                    "state": "failed",
                    "detail": f"GPU {g}: {e}; the {len(done)} GPU(s) set before were "
                    f"put back" + (f" except {undo}" if undo else ""),
                }
            done.append(g)
        log.warning(
            "power caps: run %s: %g W on GPUs %s (revision %d)",
            plan.run_id,
            plan.limit_w,
            ",".join(map(str, plan.gpus)),
            plan.revision,
        )
        return {
            **report,
            "state": "applied",
            "previous_w": {str(g): round(w / 1000, 3) for g, w in previous.items()},
        }

    def _put_back(self, run_id: str, gpus: list[int] | None = None) -> list[str]:
        """Restore the remembered limits (of ``gpus``, or all); the GPUs that refused, with why."""
        entry = self.state.get(run_id)
        failed: list[str] = []
        if entry is None:
            return failed
        for g, mw in entry["previous_mw"].items():
            if gpus is not None and int(g) not in gpus:
                continue
            try:
                self.api.set_power_management_limit_mw(self.api.device_handle(int(g)), int(mw))
            except NvmlError as e:
                failed.append(f"GPU {g}: {e}")
        if not failed:
            del self.state[run_id]
            self._save()
        return failed

    def restore(self, run_id: str) -> dict[str, Any]:
        entry = self.state.get(run_id)
        if entry is None:
            return {"state": "restored", "detail": "nothing was set"}
        failed = self._put_back(run_id)
        if failed:
            return {
                "revision": entry["revision"],
                "state": "failed",
                "detail": "restore: " + "; ".join(failed),
            }
        log.warning("power caps: run %s: previous limits restored", run_id)
        return {
            "revision": entry["revision"],
            "limit_w": entry["limit_w"],
            "state": "restored",
            "restored_w": {g: round(mw / 1000, 3) for g, mw in entry["previous_mw"].items()},
        }


class PlanFollower:
    """Polls the plans for this node and reconciles the GPUs with them; its reports are node facts."""

    def __init__(
        self,
        capper: PowerCapper,
        fetch: Callable[[], list[Plan]],
        poll_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capper = capper
        self.fetch = fetch
        self.poll_s = poll_s
        self.clock = clock
        self._next = 0.0
        #: run_id -> the latest report, sent as ``facts["power_caps"]``.
        self.reports: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sync now and every ``poll_s`` in a thread of its own (the API may be slow; ticks must not wait)."""

        def loop() -> None:
            while True:
                try:
                    self.sync()
                except Exception:  # a bug here must not end the loop that restores limits
                    log.exception("power caps: sync failed")
                if self._stop.wait(self.poll_s):
                    return

        self._thread = threading.Thread(target=loop, name="power-caps", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def maybe_sync(self) -> bool:
        if self.clock() < self._next:
            return False
        self._next = self.clock() + self.poll_s
        self.sync()
        return True

    def sync(self) -> Mapping[str, dict[str, Any]]:
        with self._lock:
            return self._sync()

    def _sync(self) -> Mapping[str, dict[str, Any]]:
        try:
            plans = {p.run_id: p for p in self.fetch()}
        except (httpx.HTTPError, ValueError) as e:
            # The plans are unknown, not empty: leave the GPUs as they are until the API answers.
            log.warning("power caps: cannot read the plans: %s", e)
            return self.reports
        for run_id in list(self.capper.state):
            plan = plans.get(run_id)
            held = self.capper.state[run_id]
            if plan is None:
                self.reports[run_id] = self.capper.restore(run_id)
            elif plan.revision != held["revision"] or abs(plan.limit_w - held["limit_w"]) * 1000 >= SAME_MW:
                self.reports[run_id] = self.capper.apply(plan)
        for run_id, plan in plans.items():
            last = self.reports.get(run_id)
            if run_id in self.capper.state or (
                last is not None and last.get("revision") == plan.revision and last.get("state") == "failed"
            ):
                continue  # applied already, or failed at this revision (a new revision retries)
            self.reports[run_id] = self.capper.apply(plan)
        for run_id in [r for r in self.reports if r not in plans and r not in self.capper.state]:
            if self.reports[run_id].get("state") != "restored":
                self.reports[run_id] = {**self.reports[run_id], "state": "restored"}
        return self.reports

    def facts(self) -> dict[str, Any]:
        with self._lock:
            return (
                {"power_caps": {k: dict(v) for k, v in sorted(self.reports.items())}} if self.reports else {}
            )


def api_fetcher(
    api_url: str, node: str, token: str | None, timeout_s: float = 10.0, verify: Any = True
) -> Callable[[], list[Plan]]:
    """Reads ``GET /v1/nodes/{node}/power-caps`` with the node's token."""
    url = f"{api_url.rstrip('/')}/v1/nodes/{node}/power-caps"
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def fetch() -> list[Plan]:
        r = httpx.get(url, headers=headers, timeout=timeout_s, verify=verify)
        r.raise_for_status()
        return parse_plans(r.json())

    return fetch


def follower_from_settings(settings: AgentSettings, node: str) -> PlanFollower | None:
    """The agent's follower when ``agent.power_caps`` is on (it needs ``agent.api_url``), else None."""
    if not settings.power_caps:
        return None
    if not settings.api_url:
        raise ValueError("agent.power_caps needs agent.api_url: the API the plans are read from")
    api = PynvmlApi()
    try:
        api.init()
    except NvmlError as e:
        log.error("power caps: agent.power_caps is on but NVML cannot start (%s): no cap is applied", e)
        return None
    capper = PowerCapper(api, settings.power_cap_state_file)
    fetch = api_fetcher(
        settings.api_url,
        node,
        settings.token,
        settings.request_timeout_s,
        str(settings.ca_file) if settings.ca_file else True,
    )
    return PlanFollower(capper, fetch, settings.power_cap_poll_s)
