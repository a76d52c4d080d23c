"""The data a detector sees: a window of samples, runs and node facts.

Built by the live sweep from the database and by ``gpufleet replay`` from a
trace bundle; detectors never touch either source directly.  Series hold
float64 arrays with NaN for NULL, sorted by time (epoch seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet.evidence import Evidence
from gpufleet.store.run_model import Run, RunState, overlaps, state_at

GpuKey = tuple[str, int]


@dataclass
class Series:
    """Samples of one GPU (``gpu`` set) or one host (``gpu`` None)."""

    node: str
    gpu: int | None
    t: np.ndarray
    cols: dict[str, np.ndarray]
    uuid: str | None = None

    def get(self, name: str) -> np.ndarray:
        """The column, or all-NaN when the source never reported it."""
        col = self.cols.get(name)
        if col is None:
            return np.full(self.t.shape, np.nan)
        return col

    def has(self, name: str) -> bool:
        col = self.cols.get(name)
        if col is None or not col.shape[0]:
            return False
        # A reported column usually holds its latest sample: no scan of the whole series then
        # (a sweep asks this about 20,000 times at 10,000 GPUs).
        return math.isfinite(col[-1]) or bool(np.isfinite(col).any())

    def __len__(self) -> int:
        return int(self.t.shape[0])


@dataclass
class RunInfo:
    """A run on the detectors' clock (epoch seconds); the rules of :mod:`gpufleet.store.run_model` apply."""

    run_id: str
    start: float
    end: float | None
    allocations: list[GpuKey]
    name: str | None = None
    site: str | None = None
    #: Progress the run reported (``gpufleet-client``): report times (epoch seconds) and cumulative
    #: tokens, ascending; empty when it reports none.  A hang shows as no tokens for that long.
    progress_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    progress_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def tokens_between(self, lo: float, hi: float) -> float | None:
        """Tokens reported over ``[lo, hi]`` (None: no report at or before ``lo`` and one after it)."""
        t = self.progress_t
        if t.size == 0:
            return None
        a = int(np.searchsorted(t, lo, side="right")) - 1
        b = int(np.searchsorted(t, hi, side="right")) - 1
        if a < 0 or b <= a:
            return None
        return float(self.progress_tokens[b] - self.progress_tokens[a])

    @classmethod
    def of(cls, run: Run) -> RunInfo:
        return cls(
            run_id=run.run_id,
            start=run.start.timestamp(),
            end=None if run.end is None else run.end.timestamp(),
            allocations=list(run.allocations),
            name=run.name,
            site=run.site,
        )

    def overlaps(self, lo: float, hi: float) -> bool:
        return overlaps(self.start, self.end, lo, hi)

    def state_at(self, t: float) -> RunState:
        return state_at(self.start, self.end, t)


@dataclass
class Window:
    """Everything a sweep at time ``t_end`` looks at, from ``t_start``."""

    t_start: float
    t_end: float
    gpus: dict[GpuKey, Series] = field(default_factory=dict)
    hosts: dict[str, Series] = field(default_factory=dict)
    runs: list[RunInfo] = field(default_factory=list)
    node_facts: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Finding:
    """One detector's verdict at the end of a window (contracts.md section 2)."""

    kind: str
    cause: str | None
    severity: str
    start: float
    #: The kind's own figures (:mod:`gpufleet.evidence` declares each kind's keys).
    evidence: Evidence
    run_id: str | None = None
    node: str | None = None
    gpu: int | None = None
    #: Time of the last sample showing the condition (epoch seconds); the
    #: incident lifecycle ends an incident there, not at the sweep that
    #: noticed the recovery.  None: the sweep time.
    last_active: float | None = None
    #: How long an intermittent condition (periodic pauses, sparse XIDs) may
    #: go unseen before its incident counts as over, seconds; None: the
    #: lifecycle's own hold-off alone.
    hold_s: float | None = None
    #: What else sets incidents of one run apart (a run-scoped finding only): throttling of a run's GPUs
    #: is one incident per reason, so its reason is part of the scope.
    qualifier: str | None = None

    @property
    def scope_key(self) -> str:
        """What an incident is about: one open incident per (kind, scope)."""
        if self.qualifier is not None and self.run_id is not None and self.gpu is None:
            return f"{self.kind}|run|{self.run_id}|{self.qualifier}"
        if self.gpu is not None:
            return f"{self.kind}|gpu|{self.node}|{self.gpu}|{self.run_id or ''}"
        if self.run_id is not None:
            return f"{self.kind}|run|{self.run_id}"
        return f"{self.kind}|node|{self.node}"
