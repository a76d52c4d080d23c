"""Detector quality on the labelled scenario set: precision, recall, cause
accuracy and detection latency per kind, and hard negatives that raised something.

    python bench/detector_quality.py [--scenarios a,b,...] [--duration 3600] [--interval 1]
                                     [--degrade full|nvsmi|nohost|bare|dcgm|all]
    python bench/detector_quality.py --real     (the real-recording corpus: bench/real_corpus.py)

Each scenario of the simulator is written as a trace bundle, replayed exactly
as ``gpufleet replay`` does (ingest path, rollups, every sweep of the
timeline) and its findings scored against the scenario's labels.
``--degrade`` first cuts each bundle down to a form real fleets send
(:mod:`gpufleet.sim.degrade`: nvidia-smi fields only, no host agent,
both, or DCGM without GPU-Util), with the labels the cut data can still
show; ``all`` runs the full form and every cut, a table each.  The
baseline is the same scoring of an empty finding set (recall 0).  The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

from gpufleet.collector import rollup
from gpufleet.collector.bundle import read_bundle
from gpufleet.collector.incidents import MemoryIncidentStore, Plan
from gpufleet.collector.replay import load, sweep_timeline
from gpufleet.collector.scoring import Score, score
from gpufleet.config import load_settings
from gpufleet.db import migrate
from gpufleet.db.policies import backend_of
from gpufleet.db.scratch import scratch_database
from gpufleet.sim import scenario_names, write_bundle
from gpufleet.sim.degrade import FORMS, degrade_bundle
from testsupport.pg import server_url

#: Scenarios never tuned on (bench/heldout/README.md).
HELDOUT = Path(__file__).resolve().parent / "heldout"


class TimedStore(MemoryIncidentStore):
    """Remembers the sweep time each incident was first opened (for latency)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened_at: dict[int, float] = {}

    def apply(self, plan: Plan) -> None:
        first = self._next_id
        super().apply(plan)
        for k in range(len(plan.opens)):
            self.opened_at[first + k] = plan.now


def run_scenario(
    name: str, duration_s: float | None, interval_s: float | None, workdir: Path, form: str = "full"
) -> tuple[Score, float, dict]:
    settings = load_settings()
    out = workdir / f"{Path(name).stem}-{form}"
    info = write_bundle(name, out, duration_s=duration_s, sample_interval_s=interval_s, overwrite=True)
    labels = degrade_bundle(out, form)
    bundle = read_bundle(out)
    t0 = time.perf_counter()
    with scratch_database(server_url(), "gpufleet_quality") as url:
        migrate.upgrade(url, settings)
        with psycopg.connect(url, autocommit=True) as conn:
            load(conn, bundle)
            rollup.drain(conn, settings.accounting.max_gap_s, backend_of(conn) != "timescaledb")
            store = TimedStore()
            sweep_timeline(conn, bundle, settings, store=store)
    incidents = store.incidents()
    findings: list[dict] = []
    first_open: dict[int, float] = {}
    for i in incidents:
        for row in i.records():
            if i.id in store.opened_at:
                first_open[len(findings)] = store.opened_at[i.id]
            findings.append(row)
    del info
    return score(findings, labels, first_open), time.perf_counter() - t0, labels


def run_form(
    names: list[str], form: str, duration_s: float | None, interval_s: float | None
) -> dict[str, object]:
    """Score every scenario in one form; print its table; return its figures."""
    total = Score()
    baseline = Score()
    per: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            s, secs, labels = run_scenario(name, duration_s, interval_s, Path(tmp), form)
            total.add(s)
            baseline.add(score([], labels))
            per[name] = {
                "violations": len(s.negative_violations),
                "missed": len(s.missed_labels),
                "unmatched": len(s.unmatched_findings),
                "seconds": round(secs, 1),
            }
            print(
                f"{Path(name).stem:<22} missed {len(s.missed_labels):>2}  false {len(s.unmatched_findings):>2}  "
                f"hard-negative hits {len(s.negative_violations):>2}  ({secs:.0f} s)",
                flush=True,
            )
            for m in s.missed_labels:
                print(
                    f"    missed: {m['kind']} {m.get('run_id')} {m.get('node')}/{m.get('gpu')} cause={m.get('cause')}"
                )
            for f in s.unmatched_findings:
                print(
                    f"    false:  {f['kind']} {f.get('run_id')} {f.get('node')}/{f.get('gpu')} cause={f.get('cause')}"
                )
            for v in s.negative_violations:
                print(f"    hard negative {v['negative']['reason']}: {v['finding']['kind']}")
    summary = total.summary()
    print(f"{'kind':<18}{'precision':>10}{'recall':>8}{'cause':>8}{'latency s':>11}{'labels':>8}   [{form}]")
    for kind, k in summary.items():
        print(
            f"{kind:<18}{k['precision']:>10}{k['recall']:>8}{k['cause_accuracy']:>8}"
            f"{k['median_latency_s']!s:>11}{k['labels']:>8}"
        )
    lat = [x for k in total.kinds.values() for x in k.latencies_s]
    base_recall = min((k.recall for k in baseline.kinds.values() if k.labels), default=0.0)
    print(f"baseline (no detector): recall {base_recall:.2f}   [{form}]")
    return {
        "baseline_recall": base_recall,
        "min_precision": min((v["precision"] for v in summary.values()), default=1.0),
        "min_recall": min((v["recall"] for v in summary.values()), default=1.0),
        "min_cause_accuracy": min((v["cause_accuracy"] for v in summary.values()), default=1.0),
        "median_latency_s": round(statistics.median(lat), 1) if lat else None,
        "hard_negative_hits": len(total.negative_violations),
        "scenarios": per,
        "kinds": summary,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", help="comma-separated; default: every shipped scenario but the 24 h demo")
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of each scenario (default: 3600 for shipped ones, a held-out one's own)",
    )
    ap.add_argument(
        "--heldout",
        action="store_true",
        help="score the held-out scenarios of bench/heldout/ (never tuned on) instead",
    )
    ap.add_argument("--interval", type=float, default=None, help="sampling interval override, seconds")
    ap.add_argument(
        "--degrade",
        choices=(*FORMS, "all"),
        default="full",
        help="cut the bundles to a form real fleets send (default: every field)",
    )
    ap.add_argument(
        "--real", action="store_true", help="score the real-recording corpus instead (bench/real_corpus.py)"
    )
    args = ap.parse_args()
    if args.real:
        from bench import real_corpus

        return real_corpus.main()
    if args.heldout:
        names = [str(p) for p in sorted(HELDOUT.glob("*.yaml"))]
        duration = args.duration
    else:
        names = args.scenarios.split(",") if args.scenarios else [n for n in scenario_names() if n != "demo"]
        duration = args.duration if args.duration is not None else 3600.0
    forms = list(FORMS) if args.degrade == "all" else [args.degrade]
    results = {}
    for form in forms:
        print(f"== form {form}", flush=True)
        results[form] = run_form(names, form, duration, args.interval)
    worst = {
        k: min(r[k] for r in results.values() if r[k] is not None)
        for k in ("min_precision", "min_recall", "min_cause_accuracy")
    }
    hits = sum(r["hard_negative_hits"] for r in results.values())
    print(
        json.dumps(
            {
                "name": "detector_quality",
                "value": worst["min_recall"],
                "unit": "min_recall",
                **worst,
                "hard_negative_hits": hits,
                "baseline_recall": max(float(r["baseline_recall"]) for r in results.values()),
                "forms": results if len(forms) > 1 else None,
                **({} if len(forms) > 1 else {k: v for k, v in results[forms[0]].items() if k not in worst}),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
