"""What one node's batch may claim about its node, checked before anything is stored.

The wire format bounds each value on its own (``gpufleet.catalog``); these
bounds are about what the values claim together, where one careless or
hostile node would otherwise cost everyone:

* **GPU indices** within ``ingest.max_gpu_index`` (default 255, far above any
  node built), in the samples and in the facts' ``gpu_count`` and ``gpus``: a
  batch naming GPU 4,999 made the node a 5,000-GPU node, whose unallocated
  GPU-hours every fleet report then computed and billed.
* **Runs named** by one batch (its samples' ``run_id`` and its facts' ``runs``)
  at most ``ingest.max_runs_per_batch``: each new run id becomes an inferred
  run, and one batch with 5,000 made 5,000 runs.
* **Energy counter jumps** beyond what any GPU can draw over the interval
  (:data:`gpufleet.db.energy_sql.GPU_POWER_CEILING_W`) are counted, not
  refused: accounting and the rollups already treat such an interval as a
  glitch and integrate its power instead; the count (by the writer, for a
  group of batches at once) tells SREs which nodes send them.

A refusal names the sample and field, as every other refusal does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpufleet.db.energy_sql import GPU_POWER_CEILING_W
from gpufleet.wire import Batch, WireError

#: Counter mJ per second no GPU exceeds.
_CEILING_MJ_S = GPU_POWER_CEILING_W * 1000.0


def check(batch: Batch, max_gpu_index: int, max_runs: int) -> None:
    """Raise :class:`WireError` (422) when the batch claims more than a node can have."""
    if batch.n_gpu:
        gpus = batch.gpu["gpu"].values
        top = int(gpus.max())
        if top > max_gpu_index:
            i = int(np.argmax(gpus > max_gpu_index))
            raise WireError(
                f"GPU index {top} is above the collector's bound of {max_gpu_index} (ingest.max_gpu_index)",
                ("gpu", i, "gpu"),
            )
    if batch.facts:
        _check_facts(batch.facts, max_gpu_index)
    runs = _run_ids(batch)
    facts_runs = batch.facts.get("runs") if batch.facts else None
    if isinstance(facts_runs, dict):
        runs.update(facts_runs)
    if len(runs) > max_runs:
        raise WireError(
            f"the batch names {len(runs)} runs; a batch may name at most {max_runs} "
            "(ingest.max_runs_per_batch)",
            ("gpu", "run_id"),
        )


def _check_facts(facts: dict[str, Any], max_gpu_index: int) -> None:
    """The GPU count and GPU list of the facts within the same bound as the samples' indices."""
    n = facts.get("gpu_count")
    if isinstance(n, int) and n > max_gpu_index + 1:
        raise WireError(
            f"{n} GPUs is more than the collector's bound of {max_gpu_index + 1} (ingest.max_gpu_index)",
            ("facts", "gpu_count"),
        )
    for key in ("gpus", "dcgm_gpus"):
        entries = facts.get(key)
        if not isinstance(entries, list):
            continue
        if len(entries) > max_gpu_index + 1:
            raise WireError(
                f"{len(entries)} GPUs is more than the collector's bound of {max_gpu_index + 1} "
                "(ingest.max_gpu_index)",
                ("facts", key),
            )
        for i, e in enumerate(entries):
            for f in ("gpu", "index"):
                v = e.get(f) if isinstance(e, dict) else None
                if isinstance(v, int) and v > max_gpu_index:
                    raise WireError(
                        f"GPU index {v} is above the collector's bound of {max_gpu_index} "
                        "(ingest.max_gpu_index)",
                        ("facts", key, i, f),
                    )


def _run_ids(batch: Batch) -> set[Any]:
    col = batch.gpu.get("run_id") if batch.n_gpu else None
    if col is None:
        return set()
    values = col.values
    if isinstance(values, list):
        out = set(values)
    else:
        if col.null is not None:
            values = values[~col.null]
        out = set(np.unique(values).tolist())
    out.discard(None)
    return out


def energy_glitches(batches: Sequence[Batch]) -> list[int]:
    """Per batch: samples whose energy counter rose from the same GPU's previous sample in that batch by
    more than any GPU can draw in between (:data:`GPU_POWER_CEILING_W`).

    Counted for a group commit's batches together (one sort of all their rows, keyed by batch and GPU),
    so a shipment pays a share of a few array operations, not a few of its own
    (``bench/request_cpu.py`` prints the cost per request)."""
    parts = [(i, b) for i, b in enumerate(batches) if b.n_gpu > 1 and "energy_mj" in b.gpu]
    out = [0] * len(batches)
    if not parts:
        return out
    sizes = [b.n_gpu for _, b in parts]
    key = np.concatenate([b.gpu["gpu"].values for _, b in parts])
    key += np.repeat(np.array([i for i, _ in parts], dtype=np.int64) << 16, sizes)
    times = np.concatenate([b.gpu["time"].values for _, b in parts])
    energy = np.concatenate([b.gpu["energy_mj"].values for _, b in parts]).astype(np.float64)
    nulls = [b.gpu["energy_mj"].null for _, b in parts]
    if any(n is not None for n in nulls):
        energy[
            np.concatenate(
                [np.zeros(size, bool) if n is None else n for size, n in zip(sizes, nulls, strict=True)]
            )
        ] = np.nan
    # A stable sort by batch and GPU keeps each GPU's samples in the order they were sent (time order
    # from an agent); a pair out of time order is not judged.
    order = np.argsort(key, kind="stable")
    key, times, energy = key[order], times[order], energy[order]
    dt = np.diff(times)
    with np.errstate(invalid="ignore"):
        glitch = (np.diff(energy) > _CEILING_MJ_S * dt) & (dt > 0) & (key[1:] == key[:-1])
    if glitch.any():
        for k in (key[1:][glitch] >> 16).tolist():
            out[k] += 1
    return out
