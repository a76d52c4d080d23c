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

File names, cell forms and the write-then-rename are
:mod:`gpufleet.collector.bundle_files`, as for every other bundle writer.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path
from typing import Any

from gpufleet.collector.bundle_files import (
    GPU_CSV,
    HOST_CSV,
    LABELS_JSON,
    NODES_JSON,
    BundleWriter,
    line,
    text,
)

FORMS = ("full", "nvsmi", "nohost", "bare", "dcgm")

#: gpu.csv columns an nvidia-smi query loop gives.
NVSMI_COLUMNS = ("time", "node", "gpu", "util_pct", "power_w", "mem_used_mib")
#: The gpu.csv column a DCGM profile without GPU-Util lacks.
DCGM_DROPPED = ("util_pct",)


def degrade_bundle(directory: str | Path, form: str) -> dict[str, Any]:
    """Rewrite the bundle in ``directory`` as ``form``, the whole directory at once; return the new labels."""
    if form not in FORMS:
        raise ValueError(f"degrade form {form!r}: expected one of {', '.join(FORMS)}")
    # The real directory, so a link to a bundle still leads to it once the degraded bundle replaces it.
    d = Path(directory).resolve()
    labels = json.loads((d / LABELS_JSON).read_text(encoding="utf-8"))
    if form == "full":
        return labels
    gpu_only = form in ("nvsmi", "bare")
    no_host = form in ("nohost", "bare")
    gpu_keep = NVSMI_COLUMNS if gpu_only else None
    gpu_drop = DCGM_DROPPED if form == "dcgm" else ()
    # What the new bundle does not take over from the old one as it is.
    dropped = {LABELS_JSON}
    if gpu_keep is not None or gpu_drop:
        dropped.add(GPU_CSV)
    if gpu_only:
        dropped.add(NODES_JSON)
    if no_host:
        dropped.add(HOST_CSV)
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
    # The degraded bundle is written whole beside the old one and then takes its place, so a failure
    # part way (a full disk, a gpu.csv without a header) leaves the bundle as it was, never cut data
    # under labels that still claim what it no longer shows.
    with BundleWriter(d) as bundle:
        for entry in d.iterdir():
            if entry.name not in dropped:
                _carry(entry, bundle.path(entry.name))
        if GPU_CSV in dropped:
            _write_columns(d / GPU_CSV, bundle, keep=gpu_keep, drop=gpu_drop)
        bundle.write_json(LABELS_JSON, labels)
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


def _carry(src: Path, dst: Path) -> None:
    """Put ``src`` into the new bundle unchanged: a link stays a link (relative ones still resolve, the
    new directory takes the old one's place), a file is hard-linked where the file system allows, so a
    large ``host.csv`` is not copied only to replace itself, and copied where it does not."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _write_columns(
    src: Path, bundle: BundleWriter, *, keep: tuple[str, ...] | None, drop: tuple[str, ...]
) -> None:
    """``src`` rewritten into the new bundle with those of its header's columns that are in ``keep``
    (all, if None) and not in ``drop``, in the header's order.  A cell is written back as :func:`text`
    writes it, so one that needs quoting keeps its quotes (a bare carriage return included, which the
    reader would take for a line break)."""
    with src.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ValueError(f"{src}: empty file, no header row to cut columns from")
        cols = [c for c in reader.fieldnames if (keep is None or c in keep) and c not in drop]
        with bundle.open_csv(src.name, [text(c) for c in cols]) as out:
            out.writelines(_line([row[c] or "" for c in cols]) for row in reader)


def _line(cells: list[str]) -> str:
    """``line(text(c) for c in cells)``, without a call per cell for the rows (nearly all) where no cell
    needs quoting: a cut ``gpu.csv`` has some forty cells a row."""
    joined = ",".join(cells)
    if (
        joined.count(",") == len(cells) - 1
        and '"' not in joined
        and "\n" not in joined
        and "\r" not in joined
    ):
        return joined + "\n"
    return line(text(c) for c in cells)
