"""Efficiency beside cost: tokens per energy, MFU and goodput of a run.

Progress (``run_progress``) is cumulative and counts from the run's start:
the work done in a window [lo, hi) is the last report at or before ``hi``
minus the last report at or before ``lo`` (zero at the run's start), and the
rate divides it by the time between those two reports.  An ended run's final
report may come after its end; ``count_after_end`` takes it.

MFU = 6 × params × tokens_per_s ÷ Σ peak BF16 dense FLOP/s of the run's GPUs
(the "6N" training FLOPs per token).  A GPU's model is the ``name`` of its
entry in ``nodes.facts["gpus"]`` (the NVML and dcgm-exporter sources report
it there), else ``nodes.facts["gpu_model"]``; a numeric
``nodes.facts["bf16_dense_peak_flops"]`` overrides the table
(:mod:`gpufleet.accounting.peak_flops`: the precision and datasheet of each
figure, reported as ``peak_dtype`` and ``peak_sources``).  MFU is null when
any GPU's model is unknown or the run has no ``params``, and when it comes out
above 1, which no GPU reaches: then ``mfu_problem`` says why (params, the
tokens reported, the peak) and ``mfu_unchecked`` keeps the figure.  Facts are
read through :class:`gpufleet.facts.NodeFacts`, so one node's malformed facts
leave that node's GPUs without a model (MFU null for its runs), never fail the
accounting of the fleet.

Goodput = the ``productive`` share of the run's GPU-hours in its ledger
(:mod:`gpufleet.accounting.ledger`): the GPU-time no incident explains as idle, hung,
checkpointing, starved, waiting on a straggler or throttled, by the one rule of
:mod:`gpufleet.waste` (overlapping incidents count once, the most specific explaining).
``lost_gpu_hours`` is the rest.  Without a ledger (a caller that asks for none) both are null.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from gpufleet.accounting.peak_flops import peak_of
from gpufleet.evidence import read_lost_time
from gpufleet.facts import NodeFacts
from gpufleet.store.run_model import Run

LOST_TIME_KINDS = ("starvation", "checkpoint_stall")

#: Where a peak came from when a node's facts give it (``bf16_dense_peak_flops``) instead of the table.
FACT_SOURCE = "node fact bf16_dense_peak_flops"


def peak_flops(model: str | None) -> float | None:
    """Peak dense tensor FLOP/s of a GPU model name (:mod:`gpufleet.accounting.peak_flops`), or None."""
    p = peak_of(model)
    return None if p is None else p.flops


@dataclass(frozen=True)
class GpuPeak:
    model: str | None
    flops: float | None
    dtype: str | None
    source: str | None


def node_facts(conn: psycopg.Connection, nodes: Iterable[str]) -> dict[str, NodeFacts]:
    """The facts of ``nodes`` (one query), each read through :class:`NodeFacts`."""
    return {
        n: NodeFacts.read(f)
        for n, f in conn.execute(
            "SELECT node, facts FROM nodes WHERE node = ANY(%s)", (sorted(set(nodes)),)
        ).fetchall()
    }


def gpu_models(
    conn: psycopg.Connection,
    allocations: Sequence[tuple[str, int]],
    facts: Mapping[str, NodeFacts] | None = None,
) -> dict[tuple[str, int], GpuPeak]:
    """Model name and peak (FLOP/s, precision, source) of each allocated GPU, from the nodes' facts (read
    unless given)."""
    if facts is None:
        facts = node_facts(conn, (n for n, _ in allocations))
    out: dict[tuple[str, int], GpuPeak] = {}
    none = NodeFacts()
    for node, gpu in allocations:
        f = facts.get(node, none)
        model = f.gpu_model_of(gpu)
        override = f.bf16_dense_peak_flops
        if override is not None:
            out[(node, gpu)] = GpuPeak(model, override, "bf16", FACT_SOURCE)
            continue
        p = peak_of(model)
        out[(node, gpu)] = (
            GpuPeak(model, None, None, None) if p is None else GpuPeak(model, p.flops, p.dtype, p.source)
        )
    return out


def mfu_problem(mfu: float, params: int, tokens_per_s: float, peak: float, peaks: Sequence[GpuPeak]) -> str:
    """Why an MFU above 1 cannot be (no GPU runs above its peak), and what to check."""
    models = "; ".join(
        sorted(
            {
                f"{p.model or 'unknown model'}: {p.flops / 1e12:g} TFLOP/s {p.dtype} ({p.source})"
                for p in peaks
                if p.flops is not None
            }
        )
    )
    return (
        f"MFU {mfu:.2f} is above 1, which no GPU reaches: 6 x params ({params:,}) x tokens per second "
        f"({tokens_per_s:,.0f}) is {6 * params * tokens_per_s / 1e12:,.0f} TFLOP/s against a peak of "
        f"{peak / 1e12:,.0f} TFLOP/s. Check the run's params, the tokens its progress reports (all ranks "
        f"counted once, not per rank) and the GPUs' peak ({models})"
    )


_PROGRESS_SQL = """
SELECT x.run_id, te.time, te.v, tb.time, tb.v, se.time, se.v, sb.time, sb.v
FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[]) AS x(run_id, lo, hi)
LEFT JOIN LATERAL (SELECT p.time, p.tokens AS v FROM run_progress p WHERE p.run_id = x.run_id
                   AND p.tokens IS NOT NULL AND (x.hi IS NULL OR p.time <= x.hi) ORDER BY p.time DESC LIMIT 1) te ON true
LEFT JOIN LATERAL (SELECT p.time, p.tokens AS v FROM run_progress p WHERE p.run_id = x.run_id
                   AND p.tokens IS NOT NULL AND p.time <= x.lo ORDER BY p.time DESC LIMIT 1) tb ON x.lo IS NOT NULL
LEFT JOIN LATERAL (SELECT p.time, p.samples AS v FROM run_progress p WHERE p.run_id = x.run_id
                   AND p.samples IS NOT NULL AND (x.hi IS NULL OR p.time <= x.hi) ORDER BY p.time DESC LIMIT 1) se ON true
LEFT JOIN LATERAL (SELECT p.time, p.samples AS v FROM run_progress p WHERE p.run_id = x.run_id
                   AND p.samples IS NOT NULL AND p.time <= x.lo ORDER BY p.time DESC LIMIT 1) sb ON x.lo IS NOT NULL"""


@dataclass(frozen=True)
class Window:
    """What efficiency is asked of one run: its window [lo, hi), and whether a report after its end counts."""

    run: Run
    lo: datetime
    hi: datetime
    count_after_end: bool


def progress_many(conn: psycopg.Connection, windows: Sequence[Window]) -> dict[str, dict[str, float | None]]:
    """Tokens and samples done in each run's window, and the token rate over the reports that bound them: the
    last report at or before ``hi`` (any, with ``count_after_end``) less the last at or before ``lo`` (none at
    the run's start), for every run in one round trip."""
    if not windows:
        return {}
    rows = conn.execute(
        _PROGRESS_SQL,
        (
            [w.run.run_id for w in windows],
            [w.lo if w.lo > w.run.start else None for w in windows],
            [None if w.count_after_end else w.hi for w in windows],
        ),
    ).fetchall()
    found = {r[0]: r[1:] for r in rows}
    out: dict[str, dict[str, float | None]] = {}
    for w in windows:
        te, tv, tbt, tbv, se, sv, sbt, sbv = found.get(w.run.run_id, (None,) * 8)
        done: dict[str, float | None] = {"tokens": None, "samples": None, "tokens_per_s": None}
        for column, end_t, end_v, begin_t, begin_v in (
            ("tokens", te, tv, tbt, tbv),
            ("samples", se, sv, sbt, sbv),
        ):
            if end_t is None:
                continue
            t0, v0 = (begin_t, float(begin_v)) if begin_t is not None else (w.run.start, 0.0)
            done[column] = max(float(end_v) - v0, 0.0)
            if column == "tokens":
                span_s = (end_t - t0).total_seconds()
                done["tokens_per_s"] = done[column] / span_s if span_s > 0 else None
        out[w.run.run_id] = done
    return out


def progress(
    conn: psycopg.Connection,
    run_id: str,
    run_start: datetime,
    lo: datetime,
    hi: datetime,
    count_after_end: bool,
) -> dict[str, float | None]:
    """Tokens and samples done in [lo, hi) of one run (:func:`progress_many`)."""
    return progress_many(conn, [Window(Run(run_id, run_start), lo, hi, count_after_end)])[run_id]


def _lost_share(evidence: object) -> float:
    """The lost share of a ``starvation`` or ``checkpoint_stall`` incident, from its stored evidence."""
    ev = read_lost_time(evidence)
    for v in (ev.get("gpu_time_lost_share"), ev.get("run_time_lost_share")):
        if v is not None:
            return min(max(float(v), 0.0), 1.0)
    duty = ev.get("duty_cycle")
    if duty is not None:
        return min(max(1.0 - float(duty), 0.0), 1.0)
    return 1.0


def efficiency(
    conn: psycopg.Connection,
    run: Run,
    lo: datetime,
    hi: datetime,
    allocations: Sequence[tuple[str, int]],
    it_kwh: float,
    count_after_end: bool,
    gpu_hours: float,
    productive_gpu_hours: float | None,
    *,
    done: Mapping[str, float | None] | None = None,
    facts: Mapping[str, NodeFacts] | None = None,
) -> dict[str, Any]:
    """The ``efficiency`` block of a run's accounting; ``productive_gpu_hours`` from its ledger.  ``done``
    (:func:`progress_many`) and ``facts`` (:func:`node_facts`) are read here unless the caller read them for
    many runs at once."""
    if done is None:
        done = progress(conn, run.run_id, run.start, lo, hi, count_after_end)
    tokens, samples, rate = done["tokens"], done["samples"], done["tokens_per_s"]
    it_j = it_kwh * 3.6e6
    models = gpu_models(conn, allocations, facts)
    names = sorted({m.model for m in models.values() if m.model})
    peaks = list(models.values())
    known = bool(peaks) and all(p.flops is not None for p in peaks)
    total_peak = sum(p.flops or 0.0 for p in peaks) if known else None
    dtypes = sorted({p.dtype for p in peaks if p.dtype})
    params = run.params
    mfu = (6.0 * params * rate / total_peak) if params and rate is not None and total_peak else None
    problem = None
    if mfu is not None and mfu > 1.0 and params and rate is not None and total_peak:
        problem = mfu_problem(mfu, params, rate, total_peak, peaks)
    return {
        "tokens": tokens,
        "samples": samples,
        "tokens_per_s": rate,
        "tokens_per_joule": tokens / it_j if tokens is not None and it_j > 0 else None,
        "tokens_per_kwh": tokens / it_kwh if tokens is not None and it_kwh > 0 else None,
        "samples_per_kwh": samples / it_kwh if samples is not None and it_kwh > 0 else None,
        "params": params,
        "gpu_model": names[0] if len(names) == 1 else ("mixed" if names else None),
        "peak_flops": total_peak,
        "peak_dtype": "mixed" if len(dtypes) > 1 else (dtypes[0] if dtypes and known else None),
        "peak_sources": sorted({p.source for p in peaks if p.source}) if known else [],
        # an MFU above 1 is not a figure but a sign of wrong inputs: not reported as MFU, and said why
        "mfu": None if problem else mfu,
        "mfu_unchecked": mfu,
        "mfu_problem": problem,
        "lost_gpu_hours": None if productive_gpu_hours is None else gpu_hours - productive_gpu_hours,
        "goodput": productive_gpu_hours / gpu_hours
        if productive_gpu_hours is not None and gpu_hours > 0
        else None,
    }
