"""The per-run ledger against the simulator's truth: how far each run's idle and hung shares of its
GPU-hours lie from what the scenario put there.

    python bench/ledger_truth.py [--scenario bench/heldout/heldout_idle_hung.yaml] [--tolerance 0.05]

The scenario is written as a trace bundle (``python -m gpufleet.sim bundle``) and replayed as an
outside user would (``gpufleet replay``: ingest, every sweep, accounting into ACCOUNTING.json, in a
temporary database on the test server).  The truth of each run is the labelled waste of its GPUs
over its accounted window: an ``idle_allocation`` label's GPUs over its span, a ``hung_collective``
label's every GPU of the run (spinners and dead ranks alike) over its span.  The baseline is the
accounting before the ledger, where every GPU-hour read as productive (error = the truth itself).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from testsupport.pg import server_url

ROOT = Path(__file__).resolve().parents[1]

#: Label kind -> the ledger state it puts GPU-time in.
STATE = {"idle_allocation": "idle", "hung_collective": "hung"}


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def truth(labels: dict, runs: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per run, the share of its GPU-hours each waste state should hold."""
    out: dict[str, dict[str, float]] = {}
    for inc in labels["incidents"]:
        state = STATE.get(inc["kind"])
        run = runs.get(inc.get("run_id") or "")
        if state is None or run is None or not run["gpu_hours"]:
            continue
        lo = max(_epoch(inc["start"]), _epoch(run["window_start"]))
        hi = min(_epoch(inc["end"]) if inc["end"] else _epoch(run["window_end"]), _epoch(run["window_end"]))
        gpus = (
            run["gpu_count"]
            if state == "hung"
            else len(inc["evidence"].get("gpus") or []) or run["gpu_count"]
        )
        share = gpus * max(hi - lo, 0.0) / 3600.0 / run["gpu_hours"]
        out.setdefault(inc["run_id"], {}).setdefault(state, 0.0)
        out[inc["run_id"]][state] += share
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "bench" / "heldout" / "heldout_idle_hung.yaml"))
    ap.add_argument("--tolerance", type=float, default=0.05, help="largest error a run's share may have")
    args = ap.parse_args()
    env = dict(os.environ, GPUFLEET_DATABASE_URL=server_url())
    with tempfile.TemporaryDirectory() as tmp:
        bundle, acc = Path(tmp) / "bundle", Path(tmp) / "ACCOUNTING.json"
        subprocess.run(
            [sys.executable, "-m", "gpufleet.sim", "bundle", args.scenario, str(bundle)],
            check=True,
            env=env,
            cwd=ROOT,
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet.cli",
                "replay",
                str(bundle),
                "--findings",
                str(Path(tmp) / "FINDINGS.jsonl"),
                "--accounting",
                str(acc),
                "--quiet",
            ],
            check=True,
            env=env,
            cwd=ROOT,
        )
        runs = {r["run_id"]: r for r in json.loads(acc.read_text())}
        labels = json.loads((bundle / "labels.json").read_text())
    want = truth(labels, runs)
    worst = baseline = 0.0
    rows = []
    print(f"{'run':<18} {'state':<6} {'truth':>7} {'ledger':>7} {'error':>7}")
    for rid in sorted(runs):
        ledger = runs[rid].get("ledger") or {}
        hours = runs[rid]["gpu_hours"] or 1.0
        for state in ("idle", "hung"):
            t = want.get(rid, {}).get(state, 0.0)
            got = float((ledger.get(state) or {}).get("gpu_hours") or 0.0) / hours
            if t == 0.0 and got == 0.0:
                continue
            err = abs(got - t)
            worst, baseline = max(worst, err), max(baseline, t)
            rows.append({"run": rid, "state": state, "truth": round(t, 4), "ledger": round(got, 4)})
            print(f"{rid:<18} {state:<6} {t:7.3f} {got:7.3f} {err:7.3f}")
    print(
        f"largest error {worst:.3f} (tolerance {args.tolerance}); before the ledger (all productive): "
        f"{baseline:.3f}"
    )
    print(
        json.dumps(
            {
                "name": "ledger_truth",
                "value": round(worst, 4),
                "unit": "share of run GPU-hours",
                "baseline": round(baseline, 4),
                "tolerance": args.tolerance,
                "within": worst <= args.tolerance,
                "scenario": Path(args.scenario).name,
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
