"""Cut a full-field bundle down to what real fleets send, with honest labels.

Few fleets record every column the simulator writes.  The forms here are the
common ones, so detector quality is measured on them and not only on data
that carries everything:

* ``nvsmi`` — an ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,
  power.draw,memory.used`` loop: ``gpu.csv`` keeps time, node, gpu,
  util_pct, power_w and mem_used_mib; no node facts (no agent ran).
* ``nohost`` — GPU fields only, no host agent: no ``host.csv``.
* ``bare`` — both cuts at once.
* ``dcgm`` — a DCGM profile without GPU-Util (``util_pct`` dropped).

The truth stays the same, except what the data cannot show: without host
data no starvation cause is scored, nor, without the ``job_*`` columns, a
cause only the job's own cgroup shows (a loader held to its quota on a big
host); without reason bits, clocks or link
fields there is no throttling, PCIe or thermal truth, without NVLink fields
or health counters no NVLink or GPU-health truth, and without facts no host
misconfiguration.  Labels dropped that way move to ``labels.json``'s
``cut_labels`` list, so a reader sees what was removed and why.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

FORMS = ("full", "nvsmi", "nohost", "bare", "dcgm")

#: gpu.csv columns an nvidia-smi query loop gives.
NVSMI_COLUMNS = ("time", "node", "gpu", "util_pct", "power_w", "mem_used_mib")


def degrade_bundle(directory: str | Path, form: str) -> dict[str, Any]:
    """Rewrite the bundle in ``directory`` in place as ``form``; return the new labels."""
    if form not in FORMS:
        raise ValueError(f"degrade form {form!r}: expected one of {', '.join(FORMS)}")
    d = Path(directory)
    labels = json.loads((d / "labels.json").read_text(encoding="utf-8"))
    if form == "full":
        return labels
    gpu_only = form in ("nvsmi", "bare")
    no_host = form in ("nohost", "bare")
    if gpu_only:
        _keep_columns(d / "gpu.csv", NVSMI_COLUMNS)
        (d / "nodes.json").unlink(missing_ok=True)
    if form == "dcgm":
        _drop_columns(d / "gpu.csv", ("util_pct",))
    if no_host:
        (d / "host.csv").unlink(missing_ok=True)
    kept, cut = [], []
    for lab in labels.get("incidents", []):
        reason = _unshowable(lab, gpu_only)
        if reason:
            cut.append({**lab, "cut_because": reason})
            continue
        if no_host and lab["kind"] == "starvation" and lab.get("cause") is not None:
            lab = {**lab, "cause": None, "cause_cut_because": "no host data"}
        if (
            gpu_only
            and lab["kind"] == "starvation"
            and lab.get("cause") is not None
            and lab.get("evidence", {}).get("host_shows_cause") is False
        ):
            lab = {
                **lab,
                "cause": None,
                "cause_cut_because": "only the job's cgroup shows it (no job_* columns)",
            }
        if gpu_only and lab["kind"] == "straggler" and lab.get("cause") not in (None, "power_cap", "unknown"):
            lab = {**lab, "cause": None, "cause_cut_because": "no clocks, temperatures or link fields"}
        kept.append(lab)
    labels["incidents"] = kept
    labels["cut_labels"] = labels.get("cut_labels", []) + cut
    labels["degrade"] = form
    (d / "labels.json").write_text(json.dumps(labels, indent=1) + "\n", encoding="utf-8")
    return labels


def _unshowable(label: dict[str, Any], gpu_only: bool) -> str | None:
    if not gpu_only:
        return None
    kind = label["kind"]
    if kind == "throttling":
        return "no clocks-event reasons, clocks or temperatures"
    if kind == "pcie_degraded":
        return "no PCIe link fields"
    if kind == "host_misconfig":
        return "no node facts"
    if kind == "nvlink_degraded":
        return "no NVLink fields"
    if kind == "gpu_health":
        return "no ECC, row-remap or PCIe replay counters"
    return None


def _rewrite(path: Path, cols: list[str]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with path.open(newline="", encoding="utf-8") as src, tmp.open("w", newline="", encoding="utf-8") as dst:
        r = csv.DictReader(src)
        w = csv.writer(dst, lineterminator="\n")
        w.writerow(cols)
        for row in r:
            w.writerow([row[c] for c in cols])
    tmp.replace(path)


def _keep_columns(path: Path, keep: tuple[str, ...]) -> None:
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    _rewrite(path, [c for c in header if c in keep])


def _drop_columns(path: Path, drop: tuple[str, ...]) -> None:
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    _rewrite(path, [c for c in header if c not in drop])
