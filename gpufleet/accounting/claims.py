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


@dataclass(frozen=True)
class Member:
    """One GPU (or host, ``gpu`` 0) of a batch, with the group it is accounted to."""

    grp: int
    node: str
    gpu: int = 0
    share: float = 1.0


@dataclass
class Batch:
    """Claims that share their time ranges: every range applies to every member.

    A run's GPUs share one window, so its claims travel as a few ranges and
    one member list instead of ranges × GPUs rows.  ``sign`` -1 subtracts a
    range; ``seg`` > 0 sends its buckets to that tariff segment instead of
    the segment of each bucket's start (rollups only).
    """

    ranges: list[tuple[datetime, datetime, int, int]]  # (lo, hi, sign, seg)
    members: list[Member]


def batches(claims: Iterable[GpuClaim | HostClaim], groups: dict[str, int]) -> list[Batch]:
    """Claims grouped by their time range."""
    by_window: dict[tuple[datetime, datetime], Batch] = {}
    for c in claims:
        b = by_window.setdefault((c.lo, c.hi), Batch([(c.lo, c.hi, 1, 0)], []))
        if isinstance(c, GpuClaim):
            b.members.append(Member(groups[c.group], c.node, c.gpu))
        else:
            b.members.append(Member(groups[c.group], c.node, 0, c.share))
    return list(by_window.values())
