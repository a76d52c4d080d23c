"""The detectors against the real-recording corpus: events found per source and per kind.

    python bench/detector_quality.py --real          (or: python bench/real_corpus.py)

Every recording under ``tests/fixtures/realtraces/`` is imported as its
``labels.json`` says (format, node, GPU model, zone, run and its start) and
replayed exactly as ``gpufleet replay`` does (:func:`gpufleet.collector.replay.
replay`: ingest, rollups, every sweep of the timeline).  Its findings are then
held against the labels, which come from each recording's own context (its
training or job script, its logs, its README; SOURCES.md says which):

* an **event** ``{kind, start, end, node?, gpu?}`` is found when a finding of
  its kind overlaps its span (and names its GPU where the event names one);
* a finding of a kind the excerpt lists in ``must_not_raise`` is a **false
  alarm**; other findings that match no event are **unlabelled**: the
  recording's context neither asks for them nor rules them out, so they
  count against nothing.  Precision is events' findings over events'
  findings and false alarms.

The baseline beside each figure is the same scoring of an empty finding set
(recall 0 wherever there is an event).  Kinds no detector reports (such as
``idle_allocation``) are scored like the others, so the table shows what the
detectors cannot see yet.  The last line is JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from gpufleet.collector.detectors.registry import DETECTORS
from gpufleet.collector.nvsmi_import import ImportSummary, import_nvidia_smi
from gpufleet.collector.replay import replay
from gpufleet.collector.scoring import Score, score
from gpufleet.config import Settings, load_settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from testsupport.pg import server_url

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "realtraces"


@dataclass
class Excerpt:
    """One recording of the corpus and its labels."""

    source: str
    folder: Path
    name: str
    #: The folder's ``import`` section with the excerpt's own ``import`` over it.
    imp: dict[str, Any]
    label: dict[str, Any]

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self.label.get("events", []))

    @property
    def must_not_raise(self) -> list[str]:
        return list(self.label.get("must_not_raise", []))


def excerpts(corpus: Path = CORPUS) -> list[Excerpt]:
    """Every labelled recording of the corpus, in folder and file order."""
    out = []
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir()):
        doc = json.loads((folder / "labels.json").read_text())
        for name, label in doc["excerpts"].items():
            imp = {**doc["import"], **label.get("import", {})}
            out.append(Excerpt(folder.name, folder, name, imp, label))
    return out


def import_excerpt(ex: Excerpt, out: Path) -> ImportSummary:
    """Import one recording as its labels say (node, model, zone, columns, run and its start)."""
    imp = ex.imp
    return import_nvidia_smi(
        [ex.folder / ex.name],
        out,
        node=imp["node"],
        run_id=imp["run_id"],
        run_start=datetime.fromisoformat(imp["run_start"].replace("Z", "+00:00")),
        gpu_name=imp.get("gpu_name"),
        tz=ZoneInfo(imp.get("tz", "UTC")),
        columns=imp.get("columns"),
    )


def score_labels(ex: Excerpt) -> dict[str, Any]:
    """The excerpt's labels in :func:`gpufleet.collector.scoring.score`'s shape."""
    run = ex.imp["run_id"]
    incidents = [
        {
            "kind": e["kind"],
            "run_id": run,
            "node": e.get("node"),
            "gpu": e.get("gpu"),
            "start": e["start"],
            "end": e["end"],
            "cause": e.get("cause"),
        }
        for e in ex.events
    ]
    negatives = (
        [
            {
                "reason": f"{ex.source}/{ex.name}",
                "not_kinds": ex.must_not_raise,
                "run_id": None,
                "node": None,
                "gpu": None,
                "start": 0.0,
                "end": None,
            }
        ]
        if ex.must_not_raise
        else []
    )
    return {"incidents": incidents, "hard_negatives": negatives}


@dataclass
class ExcerptResult:
    excerpt: Excerpt
    score: Score
    findings: list[dict[str, Any]]
    seconds: float
    sweeps: int

    @property
    def found(self) -> int:
        return sum(k.matched_labels for k in self.score.kinds.values())

    @property
    def false_alarms(self) -> list[dict[str, Any]]:
        return [v["finding"] for v in self.score.negative_violations]


def run_excerpt(ex: Excerpt, url: str, settings: Settings, workdir: Path) -> ExcerptResult:
    """Import, replay into the empty database ``url`` and score one recording.  (Slack 0:
    a finding counts only when its span overlaps the event's.)"""
    bundle = workdir / f"{ex.source}-{ex.name}"
    import_excerpt(ex, bundle)
    t0 = time.perf_counter()
    result = replay(url, bundle, settings)
    secs = time.perf_counter() - t0
    return ExcerptResult(
        ex, score(result.findings, score_labels(ex), slack_s=0.0), result.findings, secs, result.sweeps
    )


def run_corpus(corpus: Path = CORPUS, settings: Settings | None = None) -> list[ExcerptResult]:
    settings = settings or load_settings()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for ex in excerpts(corpus):
            with scratch_database(server_url(), "gpufleet_realcorpus") as url:
                migrate.upgrade(url, settings)
                results.append(run_excerpt(ex, url, settings, Path(tmp)))
    return results


@dataclass
class KindRow:
    labelled: int = 0
    found: int = 0
    findings: int = 0
    matched_findings: int = 0
    false_alarms: int = 0
    sources: set[str] = field(default_factory=set)

    @property
    def recall(self) -> float | None:
        return round(self.found / self.labelled, 3) if self.labelled else None

    @property
    def unlabelled(self) -> int:
        return self.findings - self.matched_findings - self.false_alarms

    @property
    def precision(self) -> float | None:
        judged = self.matched_findings + self.false_alarms
        return round(self.matched_findings / judged, 3) if judged else None


def by_kind(results: list[ExcerptResult]) -> dict[str, KindRow]:
    rows: dict[str, KindRow] = defaultdict(KindRow)
    for r in results:
        for kind, k in r.score.kinds.items():
            row = rows[kind]
            row.labelled += k.labels
            row.found += k.matched_labels
            row.findings += k.findings
            row.matched_findings += k.matched_findings
            if k.labels:
                row.sources.add(r.excerpt.source)
        for f in r.false_alarms:
            rows[f["kind"]].false_alarms += 1
    return dict(sorted(rows.items()))


def report(results: list[ExcerptResult], out: Any = sys.stdout) -> dict[str, Any]:
    """Print the per-source and per-kind tables; return the JSON summary."""

    def say(s: str = "") -> None:
        print(s, file=out, flush=True)

    say(f"{'source / excerpt':<62}{'events':>9}{'findings':>9}{'false':>7}{'sweeps':>7}{'s':>6}")
    per_source: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        ex = r.excerpt
        labelled = len(ex.events)
        say(
            f"{ex.source + '/' + ex.name:<62}{f'{r.found}/{labelled}':>9}{len(r.findings):>9}"
            f"{len(r.false_alarms):>7}{r.sweeps:>7}{r.seconds:>6.0f}"
        )
        for m in r.score.missed_labels:
            say(
                f"    missed {m['kind']} {m['start']} .. {m['end']}"
                + (f" {m['node']}/{m['gpu']}" if m.get("gpu") is not None else "")
            )
        for f in r.false_alarms:
            say(
                f"    false  {f['kind']} {f.get('node')}/{f.get('gpu')} {f['start']} .. {f.get('end')}"
                f" cause={f.get('cause')}"
            )
        for f in r.score.unmatched_findings:
            if f not in r.false_alarms:
                say(f"    other  {f['kind']} {f.get('node')}/{f.get('gpu')} {f['start']} .. {f.get('end')}")
        s = per_source[ex.source]
        s["labelled"] += labelled
        s["found"] += r.found
        s["findings"] += len(r.findings)
        s["false_alarms"] += len(r.false_alarms)
        s["excerpts"] += 1
    say()
    say(f"{'source':<30}{'excerpts':>9}{'events found':>14}{'findings':>10}{'false alarms':>14}")
    for src, s in sorted(per_source.items()):
        events = f"{s['found']}/{s['labelled']}"
        say(f"{src:<30}{s['excerpts']:>9}{events:>14}{s['findings']:>10}{s['false_alarms']:>14}")
    kinds = by_kind(results)
    say()
    say(
        f"{'kind':<18}{'events':>8}{'found':>7}{'recall':>8}{'baseline':>9}{'findings':>9}{'on events':>10}"
        f"{'false':>7}{'unlabelled':>11}{'precision':>10}  detector"
    )
    for kind, k in kinds.items():
        rec = "-" if k.recall is None else f"{k.recall:.2f}"
        prec = "-" if k.precision is None else f"{k.precision:.2f}"
        base = "-" if not k.labelled else "0.00"
        say(
            f"{kind:<18}{k.labelled:>8}{k.found:>7}{rec:>8}{base:>9}{k.findings:>9}{k.matched_findings:>10}"
            f"{k.false_alarms:>7}{k.unlabelled:>11}{prec:>10}  {'yes' if kind in DETECTORS else 'none reports it'}"
        )
    labelled = sum(k.labelled for k in kinds.values())
    found = sum(k.found for k in kinds.values())
    matched = sum(k.matched_findings for k in kinds.values())
    false_alarms = sum(k.false_alarms for k in kinds.values())
    recall = round(found / labelled, 3) if labelled else None
    say(
        f"all kinds: {found}/{labelled} events found, {false_alarms} false alarms on {len(results)} recordings "
        f"from {len(per_source)} sources; baseline (no detector): 0/{labelled}"
    )
    return {
        "name": "detector_quality_real",
        "value": recall,
        "unit": "event_recall",
        "events": labelled,
        "found": found,
        "false_alarms": false_alarms,
        "precision": round(matched / (matched + false_alarms), 3) if matched + false_alarms else None,
        "baseline_recall": 0.0 if labelled else None,
        "sources": {k: dict(v) for k, v in sorted(per_source.items())},
        "kinds": {
            kind: {
                "events": k.labelled,
                "found": k.found,
                "recall": k.recall,
                "findings": k.findings,
                "on_events": k.matched_findings,
                "false_alarms": k.false_alarms,
                "unlabelled": k.unlabelled,
                "precision": k.precision,
                "detector": kind in DETECTORS,
            }
            for kind, k in kinds.items()
        },
    }


def main() -> int:
    summary = report(run_corpus())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
