"""Label each GPU row with the run it worked for (``run_id``): a step after collection.

In this order of trust:

1. **Job files** (``job_files_dir``): a scheduler hook (Slurm prolog, a
   Kubernetes device plug-in hook) writes one file per GPU index, named by
   the index (``0``, ``1``...), holding the run id on its first line and
   removes it when the job ends -- the layout of dcgm-exporter's HPC job
   mapping.  An explicit statement by the scheduler beats any guess.
2. **Kubernetes** (``kubernetes.enabled``, :mod:`gpufleet.agent.k8s`): the
   kubelet's device assignments name the pod holding each GPU and MIG
   instance, and the pod's job controller names the run.
3. **dcgm-exporter's pod labels** on the row (``pod``, ``namespace``): the
   run of that pod (through Kubernetes attribution when enabled, else the
   pod itself, ``<namespace>:<pod>``).  The labels are removed from the row.
4. **Processes on the GPU**: the PIDs NVML lists for a GPU are looked up in
   ``/proc``: ``GPUFLEET_RUN_ID`` or ``SLURM_JOB_ID`` from
   ``/proc/PID/environ``, else the Kubernetes pod UID from
   ``/proc/PID/cgroup`` (the run of that pod when Kubernetes attribution
   knows it).  When processes of several runs share a GPU the run with the
   most processes wins (then the lowest PID).

A row that already carries a ``run_id`` (a source that knows it) keeps it; a
GPU with none of these stays unattributed (``None``), never guessed.  MIG
instance rows take their own instance's pod where the kubelet assigned MIG
devices, else their physical GPU's run.  :attr:`Attributor.runs` holds the
Kubernetes runs of the last rows labelled (name, team, labels), which the
agent reports in its node facts (``runs``) for the collector to register.
``proc_root`` is a parameter so tests point it at a temporary tree; reading
other users' ``environ`` needs root or CAP_SYS_PTRACE, and a PID it may not
read is simply not used.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.k8s.attribution import KubernetesAttribution
from gpufleet.agent.k8s.devices import DeviceMap
from gpufleet.agent.k8s.runs import K8sRun, run_id_for
from gpufleet.agent.ratelog import RateLimitedLog
from gpufleet.agent.sources.base import GpuRow

log = logging.getLogger(__name__)

#: Environment variables naming the run, most specific first.
RUN_ENV_VARS = ("GPUFLEET_RUN_ID", "SLURM_JOB_ID")
#: Run ids as the API accepts them (``api.schemas.ID_PATTERN``).
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/\-]{0,127}")  # fullmatch: "$" passes a final newline
#: A pod UID inside a cgroup path: cgroupfs ``.../pod<uid>/...`` or systemd
#: ``...-pod<uid with _ for ->.slice``.
_POD_RE = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
#: How long a PID's answer is reused before /proc is read again, seconds.
PID_CACHE_S = 30.0
#: A pod UID as a run id (what the cgroup path gives).
_UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def read_job_files(directory: Path) -> dict[int, str]:
    """GPU index -> run id from a job-file directory (missing directory: nothing)."""
    out: dict[int, str] = {}
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return out
    except OSError as e:
        log.warning("attribution: cannot list %s: %s", directory, e)
        return out
    for path in entries:
        if not path.name.isdigit():
            continue
        try:
            text = path.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError):
            continue  # removed by the epilog between listing and reading
        except OSError as e:
            log.warning("attribution: cannot read %s: %s", path, e)
            continue
        run_id = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if RUN_ID_RE.fullmatch(run_id):
            out[int(path.name)] = run_id
    return out


def run_from_environ(data: bytes) -> str | None:
    """The run id in a process environment block (NUL-separated ``KEY=value``)."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in RUN_ENV_VARS:
            env[key.decode()] = value.decode(errors="replace")
    for var in RUN_ENV_VARS:
        v = env.get(var, "").strip()
        if v and RUN_ID_RE.fullmatch(v):
            return v
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The Kubernetes pod UID in ``/proc/PID/cgroup`` content (dash form), or None."""
    m = _POD_RE.search(text)
    return m.group(1).replace("_", "-").lower() if m else None


@dataclass
class _Cached:
    run_id: str | None
    at: float


class ProcessRuns:
    """PID -> run id from a ``/proc`` tree, cached per PID for :data:`PID_CACHE_S`."""

    def __init__(self, proc_root: Path | str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = Path(proc_root)
        self.clock = clock
        self._cache: dict[int, _Cached] = {}
        self._ratelog = RateLimitedLog(log, 600.0)

    def run_of(self, pid: int) -> str | None:
        now = self.clock()
        hit = self._cache.get(pid)
        if hit is not None and now - hit.at < PID_CACHE_S:
            return hit.run_id
        run_id = self._lookup(pid)
        self._cache[pid] = _Cached(run_id, now)
        return run_id

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop cached PIDs no longer on any GPU (a PID may be reused by another job)."""
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    def _lookup(self, pid: int) -> str | None:
        base = self.proc_root / str(pid)
        try:
            run_id = run_from_environ((base / "environ").read_bytes())
        except FileNotFoundError:
            return None  # the process exited
        except PermissionError:
            self._ratelog.log(
                logging.WARNING,
                "environ",
                "attribution: no permission to read %s "
                "(run the agent as root or with CAP_SYS_PTRACE); using cgroups only",
                base / "environ",
            )
            run_id = None
        except OSError as e:
            self._ratelog.log(
                logging.WARNING, "environ-err", "attribution: cannot read %s: %s", base / "environ", e
            )
            run_id = None
        if run_id is not None:
            return run_id
        try:
            return pod_uid_from_cgroup((base / "cgroup").read_text(errors="replace"))
        except OSError:
            return None


def pick_run(runs: Iterable[tuple[int, str | None]]) -> str | None:
    """The run with the most processes among (pid, run) pairs; ties go to the lowest PID."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for pid, run in runs:
        if run is None:
            continue
        counts[run] += 1
        first[run] = min(pid, first.get(run, pid))
    if not counts:
        return None
    return min(counts, key=lambda r: (-counts[r], first[r]))


class Attributor:
    """Sets ``run_id`` on GPU rows: job files, Kubernetes, dcgm-exporter pod labels, processes."""

    def __init__(
        self,
        job_files_dir: Path | None = None,
        proc_root: Path | str = "/proc",
        use_processes: bool = True,
        clock: Callable[[], float] = time.monotonic,
        kubernetes: KubernetesAttribution | None = None,
    ) -> None:
        self.job_files_dir = job_files_dir
        self.use_processes = use_processes
        self.processes = ProcessRuns(proc_root, clock)
        self.kubernetes = kubernetes
        #: Kubernetes runs of the rows labelled last, by run id.
        self.runs: dict[str, K8sRun] = {}

    def label(
        self,
        rows: list[GpuRow],
        pids_by_gpu: dict[int, list[int]] | None = None,
        facts: dict[str, Any] | None = None,
    ) -> list[GpuRow]:
        """Set ``run_id`` in place on rows that lack one; returns ``rows``.

        ``facts``: the sources' latest node facts (MIG devices' UUIDs, for Kubernetes device ids).
        """
        jobs = read_job_files(self.job_files_dir) if self.job_files_dir is not None else {}
        places = self.kubernetes.runs_by_place(DeviceMap.build(rows, facts)) if self.kubernetes else {}
        runs: dict[str, K8sRun] = {}
        by_gpu: dict[int, str | None] = {}
        pids_by_gpu = pids_by_gpu if self.use_processes and pids_by_gpu else {}
        for row in rows:
            labels = row.pop("labels", None)
            if row.get("run_id"):
                continue
            gpu, mig = row["gpu"], row.get("mig_instance")
            run: str | None = jobs.get(gpu)
            k8s = None
            if run is None and places:
                k8s = places.get((gpu, mig)) or (places.get((gpu, None)) if mig is not None else None)
            if run is None and k8s is None and isinstance(labels, dict):
                k8s = self._from_labels(labels)
            if k8s is not None:
                run = k8s.run_id
                runs[run] = k8s
            if run is None:
                if gpu not in by_gpu:
                    found = None
                    if gpu in pids_by_gpu:
                        found = pick_run(
                            (pid, self.processes.run_of(pid)) for pid in sorted(pids_by_gpu[gpu])
                        )
                        k8s = self._of_pod_uid(found)
                        if k8s is not None:
                            found = k8s.run_id
                            runs[found] = k8s
                    by_gpu[gpu] = found
                run = by_gpu[gpu]
            row["run_id"] = run
        self.runs = runs
        if self.use_processes:
            self.processes.forget_except(p for pids in pids_by_gpu.values() for p in pids)
        return rows

    def _from_labels(self, labels: dict[str, Any]) -> K8sRun | None:
        """The run of the pod dcgm-exporter names on a row."""
        ns = labels.get("namespace") or labels.get("exported_namespace")
        pod = labels.get("pod") or labels.get("exported_pod")
        if not (isinstance(ns, str) and isinstance(pod, str) and ns and pod):
            return None
        if self.kubernetes is not None:
            return self.kubernetes.run_for_pod(ns, pod)
        uid = labels.get("pod_uid") if isinstance(labels.get("pod_uid"), str) else None
        return K8sRun(
            run_id_for(ns, pod, uid or None),
            pod,
            "Pod",
            ns,
            ns,
            {"k8s.namespace": ns, "k8s.kind": "Pod", "k8s.name": pod},
        )

    def _of_pod_uid(self, run: str | None) -> K8sRun | None:
        if self.kubernetes is None or run is None or not _UID_RE.match(run):
            return None
        return self.kubernetes.run_for_pod_uid(run)
