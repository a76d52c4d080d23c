"""Real GPU recordings through the real replay: hard negatives, positive controls, accounting.

The excerpts under ``tests/fixtures/realtraces/`` are nvidia-smi logs of real
machines (provenance and labels in that folder's SOURCES.md and each
``labels.json``).  Each is imported with :func:`gpufleet.collector.nvsmi_import.
import_nvidia_smi` as its labels say and replayed by :func:`gpufleet.collector.replay.replay`: the
collector's ingest path, every sweep of the timeline with every detector,
and the accounting, on a real PostgreSQL database.

* Hard negatives: what the labels say must not be raised is not raised, and
  the detectors are shown to have looked at every sample (the run started
  before the excerpt, so its warm-up hides nothing).
* Positive controls: the blocked-rank checkpoint signature written into a
  real background (:func:`inject_blocked_rank_checkpoints` mutates real
  data), which the checkpoint detector must find; so the hard negatives
  cannot pass merely because nothing is ever found on these traces.
* Accounting: the run's GPU energy equals a trapezoidal integration of the
  raw ``power_W`` column done here, independently of the importer.
* Labelled events: every event a ``labels.json`` lists (from the recording's
  own context, SOURCES.md) is a test case of its own, found when a finding of
  its kind overlaps it; ``bench/detector_quality.py --real`` prints the same
  scoring as a table.  The corpus is read and imported by
  ``bench/real_corpus.py`` for both.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

# bench/real_corpus.py: how the corpus is read and imported, one place for the bench and the tests.
from bench import real_corpus as corpus
from gpufleet.collector.bundle import read_bundle
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.replay import ReplayResult, replay
from gpufleet.collector.scoring import score
from gpufleet.collector.window_cache import WindowCache, load_runs
from gpufleet.config import Settings

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "realtraces"
NANOGPT = REAL / "nanogpt_pr643_8xh100"
GEMM = "gpu_metrics_0329-0331_gemm_periodic_dips.csv"
CEILING = "gpu_metrics_0324-0325_power_ceiling.csv"


def labels(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "labels.json").read_text())
    return doc


EXCERPTS = [
    (folder, name)
    for folder in sorted(p for p in REAL.iterdir() if p.is_dir())
    for name in labels(folder)["excerpts"]
]


def import_excerpt(folder: Path, name: str, out: Path) -> dict[str, Any]:
    """Import one excerpt as its labels.json says (format, node, model, zone, run and its start);
    return that section (the folder's, with the excerpt's own over it)."""
    (ex,) = [e for e in corpus.excerpts(REAL) if e.folder == folder and e.name == name]
    corpus.import_excerpt(ex, out)
    return dict(ex.imp)


Span = dict[tuple[str, str, int], tuple[float, float]]


def replay_bundle(url: str, bundle: Path, settings: Settings) -> tuple[ReplayResult, Span]:
    """Replay ``bundle`` into ``url``.  Also returns, per (run, node, GPU) in the last sweep's
    window, how far the span the detectors evaluated (the run's region after warm-up,
    :attr:`Frame.region`) reaches beyond the window's samples: (region start - first
    sample, region end - last sample), seconds."""
    result = replay(url, bundle, settings)
    b = read_bundle(bundle)
    det = settings.detect
    # The last sweep replay made (collector.replay.sweep_timeline steps the same way).
    now = float(
        np.arange(b.t_min + det.sweep_interval_s, b.t_max + det.sweep_interval_s, det.sweep_interval_s)[-1]
    )
    with psycopg.connect(url, autocommit=True) as conn:
        cache = WindowCache(det.window_s)
        cache.load(conn, now - det.window_s, now)
        runs = load_runs(conn, now - det.window_s, now)
    window = cache.window(now, runs, b.facts)
    fr = Frame(window, det)
    lo, hi = fr.region
    spans: Span = {}
    for ri, rows in fr.run_rows.items():
        for r in rows.tolist():
            t = fr.row_times(r)
            node, gpu = fr.keys[r]
            spans[(window.runs[ri].run_id, node, gpu)] = (
                float(lo[r]) - float(t[0]),
                float(hi[r]) - float(t[-1]),
            )
    return result, spans


def kinds(result: ReplayResult) -> list[str]:
    return sorted(f["kind"] for f in result.findings)


# -- hard negatives --------------------------------------------------------------------


@pytest.mark.parametrize("folder,name", EXCERPTS, ids=[n for _, n in EXCERPTS])
def test_hard_negative_raises_nothing_it_must_not(
    db: str, settings: Settings, tmp_path: Path, folder: Path, name: str
) -> None:
    label = labels(folder)["excerpts"][name]
    assert label["label"] in ("hard_negative", "labelled") and label["must_not_raise"]
    imp = import_excerpt(folder, name, tmp_path / "b")
    result, spans = replay_bundle(db, tmp_path / "b", settings)
    # The detectors evaluated this run on every GPU, over all of the last window's samples:
    # the run's region begins at or before the first sample and ends at or after the last.
    gpus = {(r["node"], int(r["gpu"])) for r in _raw_rows(tmp_path / "b")}
    assert {(run, node, gpu) for run, node, gpu in spans} == {(imp["run_id"], n, g) for n, g in gpus}
    for key, (before, after) in spans.items():
        assert before <= 0.0 and after >= 0.0, (key, before, after)
    assert result.sweeps >= 10
    raised = [f for f in result.findings if f["kind"] in label["must_not_raise"]]
    assert raised == [], json.dumps(raised, indent=1, default=str)


# -- positive controls on real backgrounds ---------------------------------------------


def inject_blocked_rank_checkpoints(
    gpu_csv: Path, offsets_s: list[float], pause_s: float = 12.0, writer: int = 0, seed: int = 0
) -> int:
    """Rewrite ``gpu_csv`` (an imported real recording: this mutates real data) with the
    blocked-rank checkpoint signature of a synchronous job (SOURCES.md, and the
    checkpoint_stall detector's docstring): during ``pause_s`` seconds from each offset
    after the first sample, rank ``writer`` runs no kernel (GPU-Util 0-5 %, ~145 W, its
    process writing the checkpoint) while every other rank keeps a collective kernel
    resident (GPU-Util 100 %) at idle-level power (150-160 W), spinning until the writer
    returns.  Samples outside the pauses keep their recorded values.  Returns the number
    of rows changed."""
    with gpu_csv.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    t0 = _epoch(rows[0]["time"])
    rng = random.Random(seed)
    changed = 0
    for row in rows:
        dt = _epoch(row["time"]) - t0
        if not any(o <= dt < o + pause_s for o in offsets_s):
            continue
        if int(row["gpu"]) == writer:
            row["util_pct"], row["power_w"] = str(rng.randint(0, 5)), f"{rng.uniform(143.0, 147.0):.2f}"
        else:
            row["util_pct"], row["power_w"] = "100", f"{rng.uniform(150.0, 160.0):.2f}"
        changed += 1
    with gpu_csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return changed


@pytest.mark.parametrize("name", [GEMM, CEILING])
def test_blocked_rank_checkpoint_on_a_real_background_is_found(
    db: str, settings: Settings, tmp_path: Path, name: str
) -> None:
    """Two 12 s pauses 40 s apart written into the filler (gemm) and the power-limit
    plateau (ceiling) recordings: one checkpoint_stall for the run, from GPU data alone,
    naming rank 0 as the writer; no starvation."""
    imp = import_excerpt(NANOGPT, name, tmp_path / "b")
    assert inject_blocked_rank_checkpoints(tmp_path / "b" / "gpu.csv", [15.0, 55.0]) > 0
    result, _ = replay_bundle(db, tmp_path / "b", settings)
    stalls = [f for f in result.findings if f["kind"] == "checkpoint_stall"]
    assert len(stalls) == 1, json.dumps(result.findings, indent=1, default=str)
    ev = stalls[0]["evidence"]
    assert stalls[0]["run_id"] == imp["run_id"] and stalls[0]["node"] is None
    assert ev["basis"] == "gpu_only" and ev["writer_gpu"] == f"{imp['node']}/0"
    assert ev["blocking_gpus"] == [f"{imp['node']}/0"] and ev["spinning_gpus"] == 7
    assert ev["period_s"] == pytest.approx(40.0, abs=1.0) and ev["pause_s"] == pytest.approx(12.0, abs=1.5)
    # The power reference is the model's board power: the log has no limit.
    assert ev["activity_basis"] == "util+model_power"
    assert "starvation" not in kinds(result), json.dumps(result.findings, indent=1, default=str)


# -- accounting ----------------------------------------------------------------------


def test_gpu_energy_equals_trapezoidal_integration_of_the_raw_log(
    db: str, settings: Settings, tmp_path: Path
) -> None:
    imp = import_excerpt(NANOGPT, GEMM, tmp_path / "b")
    result, _ = replay_bundle(db, tmp_path / "b", settings)
    (acc,) = result.accounting
    # Independent of the importer: the recording's own columns, its own timestamps.
    series: dict[str, list[tuple[float, float]]] = {}
    with (NANOGPT / GEMM).open(newline="") as f:
        for row in csv.DictReader(f):
            series.setdefault(row["gpu_index"].strip(), []).append(
                (_epoch(row["timestamp"]), float(row["power_W"]))
            )
    joules = sum(
        (p0 + p1) / 2.0 * (t1 - t0)
        for pts in series.values()
        for (t0, p0), (t1, p1) in itertools.pairwise(sorted(pts))
    )
    assert acc["run_id"] == imp["run_id"] and acc["gpu_count"] == 8
    assert acc["gpu_kwh"] == pytest.approx(joules / 3.6e6, rel=1e-6)
    # The run started 12.4 minutes before the excerpt: that time has no samples.
    start = datetime.fromisoformat(imp["run_start"].replace("Z", "+00:00")).timestamp()
    t_last = max(t for pts in series.values() for t, _ in pts)
    t_first = min(t for pts in series.values() for t, _ in pts)
    assert acc["gpu_hours"] == pytest.approx(8 * (t_last - start) / 3600.0, rel=1e-6)
    assert acc["coverage"] == pytest.approx((t_last - t_first) / (t_last - start), rel=1e-3)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).astimezone(UTC).timestamp()


def _raw_rows(bundle: Path) -> list[dict[str, str]]:
    with (bundle / "gpu.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_excerpts_are_byte_exact_copies_still() -> None:
    """The excerpts stay as SOURCES.md describes them: untouched files (their sha256 where
    labels.json records it, else the header line first)."""
    for folder, name in EXCERPTS:
        data = (folder / name).read_bytes()
        text = data.decode()
        assert text.endswith("\n") and "\r" not in text
        digest = labels(folder)["excerpts"][name].get("sha256")
        if digest is not None:
            assert hashlib.sha256(data).hexdigest() == digest, (folder.name, name)
            continue
        header = text.split("\n", 1)[0]
        assert header in (
            "timestamp,gpu_index,temperature_C,utilization_gpu_percent,power_W",
            "timestamp,memory.used,memory.total,utilization.gpu",
        )


def test_every_folder_names_its_licence_and_source() -> None:
    """A recording is in the corpus only with the licence it was published under beside it
    (or, for the first two sources, SOURCES.md's licence note) and its section in SOURCES.md."""
    sources = (REAL / "SOURCES.md").read_text()
    for folder in sorted(p for p in REAL.iterdir() if p.is_dir()):
        assert f"`{folder.name}/`" in sources, folder.name
        if folder.name not in ("nanogpt_pr643_8xh100", "rpf_fork_1gpu_60s"):
            assert (folder / "LICENSE").is_file(), folder.name


# -- labelled events: the corpus target is every one of them found ----------------------


EVENTS = [(ex, i) for ex in corpus.excerpts(REAL) for i in range(len(ex.events))]


def test_corpus_has_labelled_events() -> None:
    """The event tests below are generated from the labels; an empty corpus would make them vacuous."""
    assert EVENTS
    for ex, i in EVENTS:
        ev = ex.events[i]
        assert {"kind", "start", "end", "reasoning"} <= set(ev), (ex.source, ex.name, i)
        assert _epoch(ev["start"]) < _epoch(ev["end"]), (ex.source, ex.name, i)


@pytest.mark.parametrize(
    "ex,i", EVENTS, ids=[f"{ex.source}/{ex.events[i]['kind']}@{ex.events[i]['start']}" for ex, i in EVENTS]
)
def test_labelled_event_is_found(db: str, settings: Settings, tmp_path: Path, ex: Any, i: int) -> None:
    """A finding of the event's kind overlaps its span (and names its GPU where it names one).
    Expected to fail for the kinds the detectors do not report yet (the bench's table says which)."""
    ev = ex.events[i]
    corpus.import_excerpt(ex, tmp_path / "b")
    result = replay(db, tmp_path / "b", settings)
    lab = {
        "incidents": [
            {
                "kind": ev["kind"],
                "run_id": ex.imp["run_id"],
                "node": ev.get("node"),
                "gpu": ev.get("gpu"),
                "start": ev["start"],
                "end": ev["end"],
            }
        ]
    }
    s = score(result.findings, lab, slack_s=0.0)
    assert not s.missed_labels, f"{ev['kind']} {ev['start']}..{ev['end']} not found; findings: " + json.dumps(
        result.findings, default=str
    )
