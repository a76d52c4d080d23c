"""The incident lifecycle: open once, update, hold-off, resolve, reopen."""

from __future__ import annotations

import json

import pytest

from gpufleet.collector.detectors import Finding
from gpufleet.collector.incidents import MemoryIncidentStore, Open, Resolve, Update, plan_sweep, rfc3339

T = 1_800_000_000.0
HOLD = 120.0


def thr(
    start: float = T,
    *,
    gpu: int = 0,
    last: float | None = None,
    severity: str = "warning",
    cause: str = "thermal",
    run: str | None = "r1",
    **ev: object,
) -> Finding:
    return Finding(
        "throttling",
        cause,
        severity,
        start,
        {"throttled_share": 0.9, **ev},
        run_id=run,
        node="n0",
        gpu=gpu,
        last_active=last,
    )


def sweep_every(store: MemoryIncidentStore, t0: float, t1: float, step: float, findings_at) -> None:  # type: ignore[no-untyped-def]
    t = t0
    while t <= t1:
        store.sweep(findings_at(t), t, HOLD)
        t += step


def test_open_once_then_update() -> None:
    store = MemoryIncidentStore()
    p1 = store.sweep([thr(T - 30, last=T)], T, HOLD)
    assert [type(a) for a in p1.actions] == [Open]
    p2 = store.sweep([thr(T - 30, last=T + 5, severity="critical", share=1)], T + 5, HOLD)
    assert [type(a) for a in p2.actions] == [Update]
    assert len(store.open) == 1 and store.resolved == []
    inc = store.open_incidents()[0]
    assert inc.start == T - 30
    assert inc.last_seen == T + 5 and inc.last_active == T + 5
    assert inc.severity == "critical" and inc.evidence["share"] == 1
    assert inc.id == 1


def test_cause_is_kept_unless_it_was_unknown_or_it_got_worse() -> None:
    store = MemoryIncidentStore()
    store.sweep([thr(cause="thermal")], T, HOLD)
    store.sweep([thr(cause="power_cap")], T + 5, HOLD)
    assert store.open_incidents()[0].cause == "thermal"
    store.sweep([thr(cause="power_brake", severity="critical")], T + 10, HOLD)
    assert store.open_incidents()[0].cause == "power_brake"
    s2 = MemoryIncidentStore()
    f = Finding("starvation", "unknown", "warning", T, {}, run_id="r1")
    s2.sweep([f], T, HOLD)
    s2.sweep([Finding("starvation", "cpu", "warning", T, {}, run_id="r1")], T + 5, HOLD)
    assert s2.open_incidents()[0].cause == "cpu"


def test_one_incident_per_scope_even_with_duplicate_findings() -> None:
    plan = plan_sweep([], [thr(T - 10), thr(T - 20, severity="critical"), thr(T - 5, gpu=1)], T, HOLD)
    assert len(plan.opens) == 2
    by_gpu = {o.incident.gpu: o.incident for o in plan.opens}
    assert by_gpu[0].severity == "critical" and by_gpu[0].start == T - 20


def test_scope_includes_the_run() -> None:
    store = MemoryIncidentStore()
    store.sweep([thr(run="r1")], T, HOLD)
    store.sweep([thr(run="r2")], T + 5, HOLD)
    assert sorted(i.run_id or "" for i in store.open_incidents()) == ["r1", "r2"]


def test_blinking_off_for_a_sweep_neither_resolves_nor_reopens() -> None:
    store = MemoryIncidentStore()
    seen = lambda t: [] if T + 50 <= t < T + 100 else [thr(T, last=t)]  # noqa: E731
    sweep_every(store, T, T + 300, 5, seen)
    assert len(store.incidents()) == 1 and store.resolved == []


def test_resolves_after_the_hold_off_at_the_last_active_time() -> None:
    store = MemoryIncidentStore()
    seen = lambda t: [thr(T, last=t - 2)] if t < T + 200 else []  # noqa: E731
    sweep_every(store, T, T + 310, 5, seen)  # last seen at T + 195
    assert store.resolved == []  # clear for less than the hold-off
    p = store.sweep([], T + 195 + HOLD, HOLD)
    assert [type(a) for a in p.actions] == [Resolve]
    (inc,) = store.resolved
    assert inc.state == "resolved" and inc.end == T + 195 - 2


def test_reopens_after_a_real_recovery() -> None:
    store = MemoryIncidentStore()
    seen = lambda t: [thr(t - 10, last=t)] if t < T + 100 or t >= T + 400 else []  # noqa: E731
    sweep_every(store, T, T + 600, 5, seen)
    incs = store.incidents()
    assert len(incs) == 2
    first, second = incs
    assert first.state == "resolved" and second.state == "open"
    assert first.end is not None and second.start >= first.end
    assert second.id == 2


def test_reopened_incident_never_starts_before_the_previous_ended() -> None:
    store = MemoryIncidentStore()
    store.sweep([thr(T, last=T + 50)], T + 50, HOLD)
    store.sweep([], T + 50 + HOLD, HOLD)
    # The detector dates the new episode back into the old one.
    store.sweep([thr(T + 20, last=T + 300)], T + 300, HOLD)
    old, new = store.incidents()
    assert new.start == old.end == T + 50


def test_detector_hold_extends_the_hold_off() -> None:
    store = MemoryIncidentStore()
    f = Finding(
        "checkpoint_stall",
        None,
        "warning",
        T,
        {"period_s": 900},
        run_id="r1",
        last_active=T + 60,
        hold_s=1350.0,
    )
    store.sweep([f], T + 60, HOLD)
    store.sweep([], T + 60 + 1000, HOLD)
    assert len(store.open) == 1
    store.sweep([], T + 60 + 1350, HOLD)
    assert len(store.resolved) == 1


def test_findings_format() -> None:
    store = MemoryIncidentStore()
    store.sweep(
        [
            thr(T - 30, last=T),
            Finding(
                "starvation", "cpu", "critical", T - 100.5, {"period_s": 20.0}, run_id="r9", last_active=T
            ),
        ],
        T,
        HOLD,
    )
    store.sweep([thr(T - 30, last=T + 5)], T + 5, HOLD)
    store.sweep([], T + 5 + HOLD, HOLD)
    recs = store.records()
    assert [r["kind"] for r in recs] == ["starvation", "throttling"]
    starv, throt = recs
    assert set(starv) == {"kind", "run_id", "node", "gpu", "start", "end", "cause", "severity", "evidence"}
    assert starv == {
        "kind": "starvation",
        "run_id": "r9",
        "node": None,
        "gpu": None,
        "start": "2027-01-15T07:58:19.500Z",
        "end": "2027-01-15T08:00:00Z",
        "cause": "cpu",
        "severity": "critical",
        "evidence": {"period_s": 20.0},
    }
    assert throt["end"] == rfc3339(T + 5) and (throt["node"], throt["gpu"], throt["run_id"]) == (
        "n0",
        0,
        "r1",
    )
    json.dumps(recs)
    # Still open at the end of a trace: end null.
    store.sweep([thr(T + 500, last=T + 500)], T + 500, HOLD)
    assert store.records()[-1]["end"] is None


def test_bad_hold_off() -> None:
    with pytest.raises(ValueError):
        plan_sweep([], [], T, -1)


def test_a_grouped_throttling_incident_is_one_findings_row_per_gpu() -> None:
    """contracts.md section 2: GPU-scoped kinds set node and gpu, whatever the incident groups."""
    gpus = [
        {"node": "n0", "gpu": g, "since": rfc3339(T - 60 + g), "throttled_share": 0.5 + g / 10}
        for g in (0, 1, 2)
    ]
    grouped = Finding(
        "throttling",
        "thermal",
        "warning",
        T - 60,
        {"gpu_count": 3, "gpus": gpus, "throttled_share": 0.6},
        run_id="r1",
        node="n0",
        gpu=None,
        last_active=T,
        qualifier="thermal",
    )
    store = MemoryIncidentStore()
    store.sweep([grouped], T, HOLD)
    assert len(store.incidents()) == 1
    rows = store.records()
    assert [(r["node"], r["gpu"], r["start"]) for r in rows] == [
        ("n0", g, rfc3339(T - 60 + g)) for g in (0, 1, 2)
    ]
    assert [r["evidence"]["throttled_share"] for r in rows] == [0.5, 0.6, 0.7]
    assert all(r["run_id"] == "r1" and r["kind"] == "throttling" and r["end"] is None for r in rows)


def test_a_gpu_of_a_grouped_incident_keeps_the_onset_the_first_sweep_saw() -> None:
    """A later window dates a long throttle from its own start; the row still starts where it began."""

    def grouped(since: float) -> Finding:
        gpus = [{"node": "n0", "gpu": 0, "since": rfc3339(since), "throttled_share": 0.9}]
        return Finding(
            "throttling",
            "thermal",
            "warning",
            since,
            {"gpu_count": 1, "gpus": gpus},
            run_id="r1",
            node="n0",
            gpu=None,
            last_active=T,
            qualifier="thermal",
        )

    store = MemoryIncidentStore()
    store.sweep([grouped(T - 60)], T, HOLD)
    store.sweep([grouped(T + 540)], T + 600, HOLD)
    (row,) = store.records()
    assert row["start"] == rfc3339(T - 60)
