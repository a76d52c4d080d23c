"""Every finding's evidence is what gpufleet.evidence declares for its kind.

The simulator's scenarios are replayed as ``gpufleet replay`` does (bundle,
ingest path, rollups, every sweep of the timeline with every detector) and
each finding of every sweep is checked against its kind's ``TypedDict``: no
key it does not declare, every required key present, every value of its
declared type.  The declarations themselves are shown to be checked: one
missing a key the detectors write, or requiring one they do not, fails.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import typing
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import psycopg
import pytest

from gpufleet import evidence, evidence_stored
from gpufleet.collector import rollup
from gpufleet.collector.alerting import EVIDENCE_FIELDS
from gpufleet.collector.bundle import read_bundle
from gpufleet.collector.detectors.registry import DETECTORS, run_detectors
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.collector.incident_store import clean_json
from gpufleet.collector.incidents import MemoryIncidentStore, Plan
from gpufleet.collector.replay import load, sweep_timeline
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.policies import backend_of
from gpufleet.db.scratch import scratch_database
from gpufleet.evidence import (
    EVIDENCE_TYPES,
    GPU_ENTRIES,
    STORED_TYPES,
    IdleGpu,
    SpinningGpu,
    StarvationEvidence,
    StoredIdleGpu,
    StoredSpinningGpu,
    StoredThrottledGpu,
    ThrottledGpu,
    XidMeaning,
    fits,
    read_evidence,
    read_lost_time,
)
from gpufleet.sim import write_bundle
from tests.detectors.builders import GpuSpec, noisy, run_window, steady, times

ROOT = Path(__file__).resolve().parents[2]

#: Scenarios that together raise every kind, and each shape of one (both starvation patterns, a run's
#: throttled GPUs and a lone one, node settings and repeated XIDs, every NVLink and GPU-health cause).
#: Seconds of each, enough to show its faults (gpu_health's failed row remap starts at 1200 s).
SCENARIOS = {
    "mixed_fleet": 1200.0,
    "starvation_io": 1200.0,
    "hw_throttling": 1200.0,
    "host_misconfig": 1200.0,
    "host_placement": 1200.0,
    "nvlink_degraded": 1200.0,
    "nvlink_fallback": 1200.0,
    "gpu_health": 1500.0,
}


def built_windows() -> list[Window]:
    """The shapes no scenario simulates, built as tests/detectors builds them: a run's GPUs steadily at low
    activity on a saturated host (starvation's other pattern: the scenarios' loaders stall in a sawtooth),
    and throttled GPUs no run holds (one finding per GPU, no ``gpus`` list), by reason bit and inferred."""
    saturated: tuple[dict[str, Any], ...] = (
        {"cpu_user_pct": 95.0},
        {"cpu_iowait_pct": 40.0, "disk_util_pct": 99.0},
    )
    out = [
        run_window([GpuSpec(noisy(steady(0.25), seed=i)) for i in range(8)], host=host) for host in saturated
    ]
    for spec in (
        GpuSpec(steady(0.9), throttle=0x4),
        GpuSpec(steady(0.9), throttle=0x20, temp_busy_c=95, dcgm=False, drop=("throttle_reasons",)),
    ):
        w = run_window([spec, spec])
        w.runs = []
        out.append(w)
    # GPUs held and not working: a whole run idle, two of eight unused, and ranks spinning round a dead one.
    long = times(900)
    out.append(run_window([GpuSpec(steady(0.0)) for _ in range(4)], t=long))
    out.append(
        run_window(
            [GpuSpec(steady(0.85)) for _ in range(6)] + [GpuSpec(steady(0.0)) for _ in range(2)], t=long
        )
    )
    out.append(
        run_window(
            [GpuSpec(steady(0.0))]
            + [GpuSpec(steady(0.08), extra={"util_pct": steady(100.0)}) for _ in range(7)],
            t=long,
        )
    )
    return out


class Recording(MemoryIncidentStore):
    """Keeps every finding of every sweep, not only the incidents' last evidence."""

    def __init__(self) -> None:
        super().__init__()
        self.findings: list[Finding] = []

    def sweep(self, findings: Iterable[Finding], now: float, resolve_after_s: float) -> Plan:
        found = list(findings)
        self.findings.extend(found)
        return super().sweep(found, now, resolve_after_s)


@pytest.fixture(scope="module")
def findings(pg_server: str, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> list[Finding]:
    out: list[Finding] = [f for w in built_windows() for f in run_detectors(w).findings]
    for name, duration_s in SCENARIOS.items():
        folder = tmp_path_factory.mktemp("evidence") / name
        write_bundle(name, folder, duration_s=duration_s)
        bundle = read_bundle(folder)
        with scratch_database(pg_server, "gpufleet_evidence") as url:
            migrate.upgrade(url, settings)
            with psycopg.connect(url, autocommit=True) as conn:
                load(conn, bundle)
                rollup.drain(conn, settings.accounting.max_gap_s, backend_of(conn) != "timescaledb")
                store = Recording()
                sweep_timeline(conn, bundle, settings, store=store)
        out.extend(store.findings)
    return out


def _shape(f: Finding) -> str:
    """Which shape of its kind a finding has, so the test can show it saw each."""
    ev: dict[str, Any] = dict(f.evidence)
    if f.kind == "starvation":
        return f"starvation/{ev['pattern']}"
    if f.kind == "throttling":
        return "throttling/run" if "gpus" in ev else "throttling/gpu"
    if f.kind == "idle_allocation":
        return f"idle_allocation/{ev['scope']}"
    return f"{f.kind}/{f.cause}"


def mismatch(kind: str, evidence: object) -> str | None:
    """Why ``evidence`` fits none of ``kind``'s declared shapes (None: it fits one)."""
    shapes = EVIDENCE_TYPES[kind]
    if any(fits(evidence, tp) for tp in shapes):
        return None
    assert isinstance(evidence, dict)
    why = []
    for tp in shapes:
        hints = typing.get_type_hints(tp)
        extra = sorted(set(evidence) - set(hints))
        missing = sorted(tp.__required_keys__ - set(evidence))
        wrong = sorted(k for k in set(evidence) & set(hints) if not fits(evidence[k], hints[k]))
        why.append(f"{tp.__name__}: undeclared {extra}, missing {missing}, wrong type {wrong}")
    return "; ".join(why)


def test_the_scenarios_raise_every_kind_and_shape(findings: list[Finding]) -> None:
    seen = Counter(_shape(f) for f in findings)
    assert {f.kind for f in findings} == set(DETECTORS) == set(EVIDENCE_TYPES)
    for shape in (
        "starvation/oscillating",
        "starvation/steady_low",
        "throttling/run",
        "throttling/gpu",
        "host_misconfig/repeated_xid",
        "host_misconfig/cpu_quota",
        "host_misconfig/numa_affinity",
        "host_misconfig/nfs_stall",
        "nvlink_degraded/links_down",
        "nvlink_degraded/pcie_fallback",
        "nvlink_degraded/link_errors",
        "gpu_health/uncorrectable_ecc",
        "gpu_health/correctable_ecc",
        "gpu_health/pcie_replay",
        "gpu_health/row_remap_pending",
        "gpu_health/row_remap_failed",
        "idle_allocation/all",
        "idle_allocation/some",
        "hung_collective/None",
    ):
        assert seen[shape] > 0, (shape, sorted(seen))


def test_every_finding_writes_exactly_its_declared_evidence(findings: list[Finding]) -> None:
    bad: Counter[tuple[str, str | None, str]] = Counter()
    for f in findings:
        why = mismatch(f.kind, f.evidence)
        if why is not None:
            bad[(f.kind, f.cause, why)] += 1
    assert not bad, bad.most_common(5)


def test_stored_evidence_reads_back_whole(findings: list[Finding]) -> None:
    """What the store writes (strict JSON) reads back as the kind's stored view, every key kept."""
    for f in findings:
        stored = json.loads(json.dumps(clean_json(f.evidence)))
        assert read_evidence(f.kind, stored) == stored, f.kind  # type: ignore[call-overload]


def _without(tp: Any, key: str) -> Any:
    hints = typing.get_type_hints(tp)
    return TypedDict(f"{tp.__name__}Without", {k: v for k, v in hints.items() if k != key})  # type: ignore[operator]


def _requiring(tp: Any, key: str, ann: Any) -> Any:
    return TypedDict(f"{tp.__name__}Requiring", {**typing.get_type_hints(tp), key: ann})  # type: ignore[operator]


def test_a_wrong_declaration_fails(findings: list[Finding]) -> None:
    """The check is not vacuous: starvation's shape without a key it writes, or with one it never writes."""
    starving = [f for f in findings if f.kind == "starvation"]
    assert starving
    for f in starving:
        assert fits(f.evidence, StarvationEvidence)
        assert not fits(f.evidence, _without(StarvationEvidence, "gpu_time_lost_share"))
        assert not fits(f.evidence, _requiring(StarvationEvidence, "lost_gpu_hours", float))
        assert not fits({**f.evidence, "gpu_count": "eight"}, StarvationEvidence)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_evidence_views", ROOT / "tools" / "gen_evidence_views.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_evidence_views"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_stored_views_are_what_the_generator_renders() -> None:
    """The stored views are generated from the written shapes, never edited: the committed module is what
    tools/gen_evidence_views.py renders from them now."""
    committed = ROOT / "gpufleet" / "evidence_stored.py"
    assert committed.read_text() == load_generator().render(), (
        "gpufleet/evidence_stored.py differs from what gpufleet/evidence.py renders: "
        "run python tools/gen_evidence_views.py"
    )


def _structure(tp: Any) -> Any:
    """An annotation as comparable structure: a ``TypedDict`` by its keys, types and required keys (a copy of a
    shape is the shape), anything else as itself."""
    if typing.is_typeddict(tp):
        return (
            "TypedDict",
            tp.__required_keys__,
            {k: _structure(v) for k, v in typing.get_type_hints(tp).items()},
        )
    args = typing.get_args(tp)
    return (typing.get_origin(tp), tuple(_structure(a) for a in args)) if args else tp


def _as_stored(tp: Any) -> Any:
    """What a written annotation is in a stored view: a GPU entry has every key optional, all else as written."""
    if typing.is_typeddict(tp):
        if tp in GPU_ENTRIES:
            return (
                "TypedDict",
                frozenset(),
                {k: _as_stored(v) for k, v in typing.get_type_hints(tp).items()},
            )
        return _structure(tp)
    args = typing.get_args(tp)
    return (typing.get_origin(tp), tuple(_as_stored(a) for a in args)) if args else tp


def test_stored_views_are_the_written_keys_none_required() -> None:
    """Each kind's stored view is its written shapes' keys and types with none required (nothing more, nothing
    less); a GPU entry nested in it is that entry's stored view, other nested shapes are kept as written."""
    assert list(STORED_TYPES) == list(EVIDENCE_TYPES)
    for kind, shapes in EVIDENCE_TYPES.items():
        written: dict[str, Any] = {}
        for tp in shapes:
            for k, v in typing.get_type_hints(tp).items():
                assert written.setdefault(k, _as_stored(v)) == _as_stored(v), (kind, k)
        view = STORED_TYPES[kind]
        assert view.__required_keys__ == frozenset(), kind
        assert _structure(view) == ("TypedDict", frozenset(), written), kind
    swap: dict[Any, Any] = {
        ThrottledGpu: StoredThrottledGpu,
        IdleGpu: StoredIdleGpu,
        SpinningGpu: StoredSpinningGpu,
    }
    assert set(GPU_ENTRIES) == set(swap)
    for tp, view in swap.items():
        assert typing.get_type_hints(view) == typing.get_type_hints(tp)
        assert view.__required_keys__ == frozenset()
    assert typing.get_type_hints(STORED_TYPES["throttling"])["gpus"] == list[StoredThrottledGpu]
    assert typing.get_type_hints(STORED_TYPES["idle_allocation"])["gpus"] == list[StoredIdleGpu]
    assert typing.get_type_hints(STORED_TYPES["hung_collective"])["spinning_gpus"] == list[StoredSpinningGpu]
    # a nested shape kept as written keeps its required keys: a stored entry without them is left out
    _, meanings = typing.get_args(typing.get_type_hints(STORED_TYPES["gpu_health"])["xid_meanings"])
    assert meanings.__required_keys__ == XidMeaning.__required_keys__ == {"name", "meaning"}


def test_stored_views_are_read_from_gpufleet_evidence_by_kind() -> None:
    """Every stored view is importable from gpufleet.evidence, and every kind has a ``read_evidence`` overload
    returning its view."""
    for name, value in vars(evidence_stored).items():
        if name == "STORED_TYPES" or name.startswith("Stored"):
            assert getattr(evidence, name, None) is value, name
    overloads = typing.get_overloads(read_evidence)
    kinds = []
    for fn in overloads:
        hints = typing.get_type_hints(fn)
        (kind,) = typing.get_args(hints["kind"])
        assert hints["return"] is STORED_TYPES[kind], kind
        kinds.append(kind)
    assert sorted(kinds) == sorted(STORED_TYPES), "a kind read without its typed view"


def test_reading_tolerates_old_partial_and_malformed_evidence() -> None:
    # an incident stored before most keys existed, or written by hand
    assert read_evidence("throttling", {"throttled_share": 0.5}) == {"throttled_share": 0.5}
    assert read_evidence("straggler", None) == {}
    assert read_evidence("starvation", ["not", "an", "object"]) == {}
    # a value that does not fit is left out, never raised on; an int is a float, a bool is not
    got = read_evidence(
        "throttling",
        {
            "throttled_share": "lots",
            "clock_ratio": 1,
            "busy_s": True,
            "extra": 3,
            "gpus": [{"node": "n1", "gpu": 0, "clock_ratio": 0.5}, "n2/1", {"node": "n2", "gpu": "one"}],
        },
    )
    assert got == {"clock_ratio": 1, "gpus": [{"node": "n1", "gpu": 0, "clock_ratio": 0.5}, {"node": "n2"}]}
    # a list keeps the items that fit; a nested entry without its required keys is left out
    assert read_evidence(
        "host_misconfig",
        {
            "xid_codes": [13, "79", 79, None],
            "jobs": [{"job": "a", "gpus": [0], "cpu_quota_cores": 2}, {"job": "b"}],
        },
    ) == {"xid_codes": [13, 79], "jobs": [{"job": "a", "gpus": [0], "cpu_quota_cores": 2}]}
    assert read_lost_time({"duty_cycle": 0.25, "pattern": "oscillating"}) == {"duty_cycle": 0.25}
    with pytest.raises(KeyError):
        read_evidence("no_such_kind", {})  # type: ignore[call-overload]


def test_alerting_exports_declared_numeric_fields() -> None:
    """``gpufleet_incident_evidence`` fields are numbers some kind writes (a renamed key is caught here)."""
    for name in EVIDENCE_FIELDS:
        types_ = {
            typing.get_type_hints(tp)[name]
            for shapes in EVIDENCE_TYPES.values()
            for tp in shapes
            if name in typing.get_type_hints(tp)
        }
        assert types_, name
        assert all(fits(1.5, t) or fits(1, t) for t in types_), (name, types_)
