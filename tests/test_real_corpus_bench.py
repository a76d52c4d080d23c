"""bench/real_corpus.py's scoring: what counts as found, as a false alarm and as unlabelled.

The replay itself is exercised by tests/detectors/test_real_traces.py; here the
findings are given, so each rule of the table is checked on its own."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from bench import real_corpus as rc
from gpufleet.collector.scoring import score


def excerpt(events: list[dict[str, Any]], must_not: list[str]) -> Any:
    label = {"label": "labelled", "must_not_raise": must_not, "events": events, "reasoning": "test"}
    return rc.Excerpt("src", Path("/nowhere"), "log.csv", {"run_id": "r1", "node": "n1"}, label)


def result(ex: Any, findings: list[dict[str, Any]]) -> Any:
    return rc.ExcerptResult(ex, score(findings, rc.score_labels(ex), slack_s=0.0), findings, 0.0, 10)


def finding(
    kind: str, start: str, end: str | None, node: str | None = None, gpu: int | None = None
) -> dict[str, Any]:
    return {
        "kind": kind,
        "run_id": "r1",
        "node": node,
        "gpu": gpu,
        "start": start,
        "end": end,
        "cause": None,
        "evidence": {},
    }


EV = {
    "kind": "checkpoint_stall",
    "start": "2026-01-01T00:10:00Z",
    "end": "2026-01-01T00:10:30Z",
    "reasoning": "save_steps",
}
GPU_EV = {
    "kind": "straggler",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-01T01:00:00Z",
    "node": "n1",
    "gpu": 3,
    "reasoning": "power cap on GPU 3",
}


def test_overlap_is_found_and_a_miss_by_a_second_is_not() -> None:
    ex = excerpt([EV], [])
    hit = result(ex, [finding("checkpoint_stall", "2026-01-01T00:10:29Z", "2026-01-01T00:12:00Z")])
    miss = result(ex, [finding("checkpoint_stall", "2026-01-01T00:10:31Z", "2026-01-01T00:12:00Z")])
    assert (hit.found, miss.found) == (1, 0)
    # the late one matches no event and is of no forbidden kind: unlabelled, not false
    assert rc.by_kind([miss])["checkpoint_stall"].unlabelled == 1 and miss.false_alarms == []


def test_gpu_scoped_event_needs_its_gpu() -> None:
    ex = excerpt([GPU_EV], [])
    other_gpu = result(ex, [finding("straggler", "2026-01-01T00:20:00Z", None, "n1", 2)])
    same_gpu = result(ex, [finding("straggler", "2026-01-01T00:20:00Z", None, "n1", 3)])
    assert (other_gpu.found, same_gpu.found) == (0, 1)


def test_forbidden_kind_is_a_false_alarm_and_lowers_precision() -> None:
    ex = excerpt([EV], ["starvation"])
    r = result(
        ex,
        [
            finding("checkpoint_stall", "2026-01-01T00:10:00Z", "2026-01-01T00:11:00Z"),
            finding("starvation", "2026-01-01T00:30:00Z", "2026-01-01T00:40:00Z"),
        ],
    )
    assert [f["kind"] for f in r.false_alarms] == ["starvation"]
    out = io.StringIO()
    summary = rc.report([r], out)
    assert summary["found"] == 1 and summary["false_alarms"] == 1 and summary["precision"] == 0.5
    assert summary["kinds"]["starvation"]["false_alarms"] == 1
    text = out.getvalue()
    assert "false  starvation" in text and "src/log.csv" in text
    json.dumps(summary)  # the bench's last line


def test_empty_finding_set_is_the_baseline() -> None:
    ex = excerpt([EV, GPU_EV], ["starvation"])
    summary = rc.report([result(ex, [])], io.StringIO())
    assert summary["value"] == 0.0 and summary["baseline_recall"] == 0.0 and summary["precision"] is None


def test_every_corpus_event_is_well_formed() -> None:
    """Each labelled event of the real corpus has a kind, a span inside its recording's
    and its reasoning; the import section names a run."""
    for ex in rc.excerpts():
        assert ex.imp["run_id"] and ex.imp["node"]
        for ev in ex.events:
            assert {"kind", "start", "end", "reasoning"} <= set(ev)
            assert ev["start"] < ev["end"]
