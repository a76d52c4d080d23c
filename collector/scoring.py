"""Score detector findings against ground-truth labels.

Labels come from the simulator (``labels.json``) or from any other source in
the same shape: expected incidents ``{kind, cause, run_id, node, gpu, start,
end}`` and hard negatives ``{reason, not_kinds, run_id, node, gpu, start,
end}``.  A finding matches a label of the same kind whose scope agrees (run
for run-scoped kinds, node and GPU for GPU-scoped ones, any GPU a finding
lists in ``evidence.gpus``; fields the label leaves empty match anything) and
whose time span overlaps.  Precision,
recall and cause accuracy are per kind; detection latency is the time from a
label's start to the first sweep at which a matching incident was open.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.timeparse import parse_time


def _t(v: Any, default: float) -> float:
    if v is None:
        return default
    if isinstance(v, int | float):
        return float(v)
    return parse_time(v).timestamp()


def _listed(f: Mapping[str, Any]) -> list[tuple[Any, Any]] | None:
    """The GPUs a finding lists (``evidence.gpus``: a run's GPUs throttled for one reason), if any."""
    ev = f.get("evidence")
    gpus = ev.get("gpus") if isinstance(ev, Mapping) and f.get("gpu") is None else None
    if not isinstance(gpus, list):
        return None
    return [(g.get("node"), g.get("gpu")) for g in gpus if isinstance(g, Mapping)]


def _scope_ok(label: Mapping[str, Any], f: Mapping[str, Any]) -> bool:
    listed = _listed(f)
    if listed is not None:
        # one finding for several GPUs: it covers a label of any of them
        lr = label.get("run_id")
        if lr is not None and f.get("run_id") is not None and lr != f.get("run_id"):
            return False
        return any(
            (label.get("node") is None or label.get("node") == n)
            and (label.get("gpu") is None or label.get("gpu") == g)
            for n, g in listed
        )
    for k in ("run_id", "node", "gpu"):
        lv = label.get(k)
        if lv is not None and f.get(k) is not None and lv != f.get(k):
            return False
        if lv is not None and f.get(k) is None and k != "run_id":
            return False
    return True


def _overlap(a0: float, a1: float, b0: float, b1: float, slack: float) -> bool:
    return a0 <= b1 + slack and b0 <= a1 + slack


@dataclass
class KindScore:
    findings: int = 0
    labels: int = 0
    matched_findings: int = 0
    matched_labels: int = 0
    cause_correct: int = 0
    cause_checked: int = 0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.matched_findings / self.findings if self.findings else 1.0

    @property
    def recall(self) -> float:
        return self.matched_labels / self.labels if self.labels else 1.0

    @property
    def cause_accuracy(self) -> float:
        return self.cause_correct / self.cause_checked if self.cause_checked else 1.0


@dataclass
class Score:
    kinds: dict[str, KindScore] = field(default_factory=lambda: defaultdict(KindScore))
    negative_violations: list[dict[str, Any]] = field(default_factory=list)
    unmatched_findings: list[dict[str, Any]] = field(default_factory=list)
    missed_labels: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for k, s in other.kinds.items():
            mine = self.kinds[k]
            for attr in (
                "findings",
                "labels",
                "matched_findings",
                "matched_labels",
                "cause_correct",
                "cause_checked",
            ):
                setattr(mine, attr, getattr(mine, attr) + getattr(s, attr))
            mine.latencies_s.extend(s.latencies_s)
        self.negative_violations += other.negative_violations
        self.unmatched_findings += other.unmatched_findings
        self.missed_labels += other.missed_labels

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, s in sorted(self.kinds.items()):
            out[kind] = {
                "precision": round(s.precision, 3),
                "recall": round(s.recall, 3),
                "cause_accuracy": round(s.cause_accuracy, 3),
                "findings": s.findings,
                "labels": s.labels,
                "median_latency_s": round(statistics.median(s.latencies_s), 1) if s.latencies_s else None,
            }
        return out


def score(
    findings: Iterable[Mapping[str, Any]],
    labels: Mapping[str, Any],
    first_open: Mapping[int, float] | None = None,
    slack_s: float = 60.0,
) -> Score:
    """Score one trace.  ``first_open[i]`` is the sweep time finding ``i`` was first open."""
    t_end = _t(labels.get("end"), float("inf"))
    fs = list(findings)
    spans = [(_t(f["start"], 0.0), _t(f.get("end"), t_end)) for f in fs]
    res = Score()
    matched_f: set[int] = set()
    for lab in labels.get("incidents", []):
        ks = res.kinds[lab["kind"]]
        ks.labels += 1
        l0, l1 = _t(lab["start"], 0.0), _t(lab.get("end"), t_end)
        hits = [
            i
            for i, f in enumerate(fs)
            if f["kind"] == lab["kind"] and _scope_ok(lab, f) and _overlap(l0, l1, *spans[i], slack_s)
        ]
        if not hits:
            res.missed_labels.append(dict(lab))
            continue
        ks.matched_labels += 1
        matched_f.update(hits)
        first = min(hits, key=lambda i: spans[i][0])
        if lab.get("cause") is not None:
            ks.cause_checked += 1
            ks.cause_correct += int(fs[first].get("cause") == lab["cause"])
        if first_open is not None:
            seen = min((first_open[i] for i in hits if i in first_open), default=None)
            if seen is not None:
                ks.latencies_s.append(max(0.0, seen - l0))
    for i, f in enumerate(fs):
        ks = res.kinds[f["kind"]]
        ks.findings += 1
        if i in matched_f:
            ks.matched_findings += 1
        else:
            res.unmatched_findings.append(dict(f))
    for neg in labels.get("hard_negatives", []):
        n0, n1 = _t(neg["start"], 0.0), _t(neg.get("end"), t_end)
        for i, f in enumerate(fs):
            # A finding explained by a real label of its own is not a false alarm.
            if (
                f["kind"] in neg.get("not_kinds", [])
                and _scope_ok(neg, f)
                and i not in matched_f
                and _overlap(n0, n1, *spans[i], 0.0)
            ):
                res.negative_violations.append({"negative": dict(neg), "finding": dict(f)})
    return res
