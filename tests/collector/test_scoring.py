"""Scoring rules, and the quality gate on a few labelled scenarios replayed end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.collector.scoring import score

LABELS = {
    "end": "2026-12-01T11:00:00Z",
    "incidents": [
        {
            "kind": "straggler",
            "cause": "power_cap",
            "run_id": "r1",
            "node": "n1",
            "gpu": 4,
            "start": "2026-12-01T10:10:00Z",
            "end": "2026-12-01T10:40:00Z",
        },
        {
            "kind": "starvation",
            "cause": "io",
            "run_id": "r2",
            "node": None,
            "gpu": None,
            "start": "2026-12-01T10:00:00Z",
            "end": None,
        },
    ],
    "hard_negatives": [
        {
            "reason": "uniform_power_cap",
            "not_kinds": ["straggler"],
            "run_id": "r3",
            "node": None,
            "gpu": None,
            "start": "2026-12-01T10:00:00Z",
            "end": "2026-12-01T11:00:00Z",
        }
    ],
}


def f(kind: str, start: str, end: str | None = None, **kw: object) -> dict:
    return {
        "kind": kind,
        "start": start,
        "end": end,
        "cause": kw.pop("cause", None),
        "run_id": kw.pop("run_id", None),
        "node": kw.pop("node", None),
        "gpu": kw.pop("gpu", None),
    }


def test_matching_precision_recall_cause_and_negatives() -> None:
    findings = [
        f("straggler", "2026-12-01T10:11:00Z", cause="thermal", run_id="r1", node="n1", gpu=4),  # wrong cause
        f("straggler", "2026-12-01T10:11:00Z", cause="power_cap", run_id="r1", node="n1", gpu=5),  # wrong GPU
        f("starvation", "2026-12-01T10:30:00Z", cause="io", run_id="r2"),
        f(
            "straggler", "2026-12-01T10:20:00Z", cause="power_cap", run_id="r3", node="n9", gpu=0
        ),  # hard negative
    ]
    s = score(findings, LABELS, first_open={0: LABELS_T("10:12:00"), 2: LABELS_T("10:31:00")})
    st = s.kinds["straggler"]
    assert (st.labels, st.matched_labels, st.findings, st.matched_findings) == (1, 1, 3, 1)
    assert st.cause_accuracy == 0.0 and st.latencies_s == [120.0]
    assert s.kinds["starvation"].recall == 1.0 and s.kinds["starvation"].latencies_s == [1860.0]
    assert len(s.negative_violations) == 1 and s.negative_violations[0]["finding"]["run_id"] == "r3"
    assert score([], LABELS).kinds["straggler"].recall == 0.0


def test_a_finding_listing_gpus_matches_a_label_of_each() -> None:
    labels = {
        "end": "2026-12-01T11:00:00Z",
        "incidents": [
            {
                "kind": "throttling",
                "cause": "thermal",
                "run_id": "r1",
                "node": "n1",
                "gpu": g,
                "start": "2026-12-01T10:10:00Z",
                "end": "2026-12-01T10:40:00Z",
            }
            for g in (2, 3, 7)
        ],
        "hard_negatives": [
            {
                "reason": "healthy",
                "not_kinds": ["throttling"],
                "run_id": None,
                "node": "n2",
                "gpu": 0,
                "start": "2026-12-01T10:00:00Z",
                "end": "2026-12-01T11:00:00Z",
            }
        ],
    }
    one = {
        **f("throttling", "2026-12-01T10:11:00Z", cause="thermal", run_id="r1", node="n1"),
        "evidence": {"gpus": [{"node": "n1", "gpu": 2}, {"node": "n1", "gpu": 3}]},
    }
    s = score([one], labels)
    th = s.kinds["throttling"]
    assert (th.labels, th.matched_labels, th.findings, th.matched_findings) == (3, 2, 1, 1)
    assert [m["gpu"] for m in s.missed_labels] == [7] and s.negative_violations == []
    stray = {
        **f("throttling", "2026-12-01T10:11:00Z", cause="thermal", run_id="r9"),
        "evidence": {"gpus": [{"node": "n2", "gpu": 0}]},
    }
    assert len(score([stray], labels).negative_violations) == 1


def LABELS_T(hms: str) -> float:
    from gpufleet.timeparse import parse_time

    return parse_time(f"2026-12-01T{hms}Z").timestamp()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "scenario", ["straggler_thermal", "starvation_cpu", "checkpoint_stalls", "uniform_power_cap", "demo"]
)
def test_quality_gate_on_labelled_scenarios(scenario: str, tmp_path: Path, pg_server: str) -> None:
    from bench import detector_quality

    s, _, _ = detector_quality.run_scenario(scenario, 1500.0, None, tmp_path)
    assert s.negative_violations == []
    assert s.missed_labels == []
    assert s.unmatched_findings == []
    for kind, ks in s.kinds.items():
        assert ks.cause_accuracy >= 0.9, kind
        assert all(lat <= 2 * 600 for lat in ks.latencies_s), (kind, ks.latencies_s)
