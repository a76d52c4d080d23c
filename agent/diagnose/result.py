"""One item of the checklist as every reader sees it: status, number, finding, decision.

``skipped`` is an item that cannot run here (no GPU, no DCGM, no permission,
no data set given): it stays in the list with the reason as its finding, so
the checklist always has every item and a missing GPU never reads as a clean
bill of health.  ``unknown`` is an item that ran but had no data to judge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "unknown", "skipped"]
#: Worst first, for the overall status and for sorting.
RANK: dict[str, int] = {"fail": 0, "warn": 1, "unknown": 2, "ok": 3, "skipped": 4}


@dataclass(frozen=True)
class Check:
    check: str
    subject: str
    status: Status
    finding: str
    value: float | str | None = None
    unit: str = ""
    decision: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(checks: Iterable[Check]) -> Status:
    ranked = sorted((c.status for c in checks), key=lambda s: RANK[s])
    return ranked[0] if ranked else "unknown"


def skipped(check: str, subject: str, why: str, unit: str = "") -> Check:
    """An item that cannot run here, with the reason."""
    return Check(check, subject, "skipped", why, None, unit, "")
