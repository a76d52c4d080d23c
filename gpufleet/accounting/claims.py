"""What accounting asks the energy queries for: claims on GPU and host time, and their sums."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Source = Literal["auto", "rollup", "raw"]
SOURCES: tuple[Source, ...] = ("auto", "rollup", "raw")


@dataclass(frozen=True)
class GpuClaim:
    """Energy of one whole GPU over [lo, hi), accountable to ``group`` (a run, the idle GPUs, the fleet)."""

    group: str
    node: str
    gpu: int
    lo: datetime
    hi: datetime


@dataclass(frozen=True)
class HostClaim:
    """Host energy of ``node`` over [lo, hi), times ``share`` (GPUs held ÷ GPUs the node reports)."""

    group: str
    node: str
    lo: datetime
    hi: datetime
    share: float


@dataclass
class Sums:
    """Energy of a (group, segment): GPU joules, covered GPU-seconds, share-weighted host joules."""

    gpu_j: float = 0.0
    gpu_covered_s: float = 0.0
    host_j: float = 0.0

    def add(self, gpu_j: float, gpu_covered_s: float, host_j: float) -> None:
        self.gpu_j += gpu_j
        self.gpu_covered_s += gpu_covered_s
        self.host_j += host_j


#: (group number, 1-based tariff segment)
Key = tuple[int, int]
#: a query row: group number, segment, GPU joules, covered GPU-seconds, host joules
Row = tuple[int, int, float, float, float]


def collect(rows: Iterable[Row], into: dict[Key, Sums]) -> None:
    for grp, seg, gpu_j, gpu_s, host_j in rows:
        into.setdefault((grp, int(seg)), Sums()).add(gpu_j or 0.0, gpu_s or 0.0, host_j or 0.0)
