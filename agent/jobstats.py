"""Put each job's own cgroup figures on the GPUs it uses: a step after collection, like attribution.

For every GPU, the processes NVML lists on it are looked up in ``/proc``
(:class:`gpufleet.agent.sources.cgroup.CgroupReader`); the GPU takes the
cgroup holding most of them (then the lowest PID), and every cgroup is read
once per tick however many GPUs it feeds.  Rates are over the time since
that cgroup's previous reading, so the first tick after a job starts carries
its quota but no rates (NULL, not 0).

The figures are the catalog's ``job_*`` fields on the GPU's whole-board row
(MIG instance rows leave them NULL).  A GPU without processes, or whose
processes cannot be found or read, keeps them NULL; nothing here can fail a
tick: a process that exits between the listing and the read is skipped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.ratelog import RateLimitedLog
from gpufleet.agent.sources.base import GpuRow
from gpufleet.agent.sources.cgroup import CgroupPlace, CgroupReader, CgroupStats, rates

log = logging.getLogger(__name__)

#: How long a PID's cgroup is reused before ``/proc/<pid>/cgroup`` is read again, seconds.
PID_CACHE_S = 30.0
JOB_FIELDS = (
    "job_cpu_cores",
    "job_cpu_quota_cores",
    "job_cpu_throttled_share",
    "job_cpu_pressure_pct",
    "job_io_pressure_pct",
)


@dataclass
class _Seen:
    place: CgroupPlace | None
    at: float


@dataclass
class _Last:
    stats: CgroupStats
    at: float


class JobCgroups:
    """Fills the ``job_*`` fields of GPU rows from the cgroups of the processes on each GPU."""

    def __init__(
        self,
        proc_root: Path | str = "/proc",
        sys_root: Path | str = "/sys",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = CgroupReader(proc_root, sys_root)
        self.clock = clock
        self._pids: dict[int, _Seen] = {}
        self._last: dict[str, _Last] = {}
        self._ratelog = RateLimitedLog(log, 600.0)

    def place_of(self, pid: int, now: float) -> CgroupPlace | None:
        hit = self._pids.get(pid)
        if hit is not None and now - hit.at < PID_CACHE_S:
            return hit.place
        try:
            place = self.reader.locate(pid)
        except OSError as e:
            self._ratelog.log(
                logging.WARNING, "locate", "job cgroups: cannot read the cgroup of PID %d: %s", pid, e
            )
            place = None
        self._pids[pid] = _Seen(place, now)
        return place

    def cgroups(self, pids_by_gpu: dict[int, list[int]]) -> dict[int, CgroupPlace]:
        """GPU index -> the cgroup of most of its processes (ties: the lowest PID's)."""
        now = self.clock()
        out: dict[int, CgroupPlace] = {}
        for gpu, pids in pids_by_gpu.items():
            counts: Counter[str] = Counter()
            first: dict[str, tuple[int, CgroupPlace]] = {}
            for pid in sorted(pids):
                place = self.place_of(pid, now)
                if place is None:
                    continue
                counts[place.key] += 1
                first.setdefault(place.key, (pid, place))
            if counts:
                key = min(counts, key=lambda k: (-counts[k], first[k][0]))
                out[gpu] = first[key][1]
        keep = {p for pids in pids_by_gpu.values() for p in pids}
        for pid in [p for p in self._pids if p not in keep]:
            del self._pids[pid]
        return out

    def label(self, rows: list[GpuRow], pids_by_gpu: dict[int, list[int]] | None) -> list[GpuRow]:
        """Set the ``job_*`` fields in place on the whole-GPU rows; returns ``rows``."""
        places = self.cgroups(pids_by_gpu or {})
        now = self.clock()
        figures: dict[str, dict[str, float | None]] = {}
        for place in {p.key: p for p in places.values()}.values():
            try:
                stats = self.reader.read(place)
            except OSError as e:
                self._ratelog.log(
                    logging.WARNING, "read", "job cgroups: cannot read %s: %s", place.cpu_dir, e
                )
                continue
            last = self._last.get(place.key)
            got = rates(last.stats if last else None, stats, now - last.at if last else None)
            self._last[place.key] = _Last(stats, now)
            figures[place.key] = got.catalog()
        for key in [k for k in self._last if k not in figures]:
            del self._last[key]
        for row in rows:
            if row.get("mig_instance") is not None:
                continue
            mine = places.get(row["gpu"])
            values = figures.get(mine.key) if mine is not None else None
            for name in JOB_FIELDS:
                if row.get(name) is None:
                    row[name] = values.get(name) if values is not None else None
        return rows
