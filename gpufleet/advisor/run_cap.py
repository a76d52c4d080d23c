"""One power cap for all of a run's GPUs, from measured tokens per joule, with what it saves.

The fleet-wide advisor (:mod:`gpufleet.advisor.power_cap`) pools every run of
a model on one GPU model into levels, one per power limit observed, each
with its tokens per joule and tokens per second per GPU.  For a run, this
module takes the levels of its own model on its own GPUs and proposes the
limit with the most tokens per joule within ``max_throughput_loss`` of the
fastest level: one cap for every GPU of the run (a synchronous job waits for
its slowest rank, so a cap on some GPUs only makes them stragglers).

What it saves is stated for the same work: the energy per token falls from
the level at the run's current limit to the proposed level's, so over any
number of tokens the GPU energy falls by ``1 - tpj_now / tpj_proposed``;
applied to the run's measured GPU power (its GPUs' energy over the last
``recent`` window, from the accounting's per-minute rollup) this is the kWh
a day of the run's work saves, and at its site's PUE and energy price what
that costs.  The run takes longer by the throughput loss, which the answer
states beside it.  Where the run already runs at the proposed limit, or at
a lower one, the answer says to keep it.  Where its model has no two
comparable limits the answer says what is missing (``enough_data: false``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from gpufleet.advisor.power_cap import AdvisorSettings, keep_points, power_cap_advice
from gpufleet.gpu_models import gpu_model_names
from gpufleet.store.sites import get_site
from gpufleet.timeparse import iso

RUN_SQL = """
SELECT r.run_id, r.name, r.labels->>'model', r.start, r."end", r.site,
       array_agg(a.node ORDER BY a.node, a.gpu), array_agg(a.gpu ORDER BY a.node, a.gpu),
       bool_or(a.sharing <> 'exclusive')
FROM runs r JOIN run_allocations a ON a.run_id = r.run_id
WHERE r.run_id = %s
GROUP BY r.run_id
"""

#: The newest enforced limit of each of the run's GPUs within the last quarter hour.
LIMITS_SQL = """
SELECT DISTINCT ON (s.node, s.gpu) s.node, s.gpu, s.power_limit_w
FROM gpu_samples s JOIN run_allocations a ON a.node = s.node AND a.gpu = s.gpu
WHERE a.run_id = %s AND s.time > %s AND s.time <= %s AND s.power_limit_w IS NOT NULL AND s.mig_instance IS NULL
ORDER BY s.node, s.gpu, s.time DESC
"""

#: The run's GPU energy and the GPU-seconds it covers, over a period (the accounting's minute rollup).
ENERGY_SQL = """
SELECT coalesce(sum(e.energy_j), 0)::float8, coalesce(sum(e.covered_s), 0)::float8
FROM gpu_energy_1m e JOIN run_allocations a ON a.node = e.node AND a.gpu = e.gpu
WHERE a.run_id = %s AND e.bucket >= %s AND e.bucket < %s
"""


class UnknownRun(LookupError):
    pass


@dataclass(frozen=True)
class RunCapSettings:
    """How a run's proposal reads the data: levels at least a few minutes long suit one run's life."""

    advisor: AdvisorSettings = field(
        default_factory=lambda: AdvisorSettings(warmup_s=120.0, min_segment_s=120.0, min_level_s=300.0)
    )
    #: The run's power is measured over this much of its latest time.
    recent: timedelta = timedelta(hours=1)
    #: Limits this close to the run's are the run's (W).
    same_limit_w: float = 5.0


def keep_points_for_readers(conn: psycopg.Connection, run_ids: list[str]) -> int:
    """Keep the points of those of ``run_ids`` that ended, as both readers read them: the fleet-wide
    advice (its default settings) and one run's proposal (:class:`RunCapSettings`, whose shorter
    stretches make other points); what the collector's leader does as runs end.  Returns how many runs
    were looked at."""
    keep_points(conn, run_ids, RunCapSettings().advisor)
    return keep_points(conn, run_ids)


def _r(x: float | None, digits: int = 6) -> float | None:
    return round(x, digits) if x is not None and math.isfinite(x) else None


def _level_at(levels: list[dict[str, Any]], limit: float, tol: float) -> dict[str, Any] | None:
    usable = [lv for lv in levels if lv.get("enough")]
    near = [lv for lv in usable if abs(lv["power_limit_w"] - limit) <= tol]
    return near[0] if near else None


def propose_run_cap(
    conn: psycopg.Connection,
    run_id: str,
    max_throughput_loss: float = 0.05,
    now: datetime | None = None,
    settings: RunCapSettings | None = None,
) -> dict[str, Any]:
    """The proposal for ``run_id``; raises UnknownRun when the run does not exist or holds no GPU."""
    cfg = settings or RunCapSettings()
    t_now = now or datetime.now(UTC)
    row = conn.execute(RUN_SQL, (run_id,)).fetchone()
    if row is None:
        raise UnknownRun(run_id)
    _, name, label, start, end, site, nodes, gpus, shared = row
    model = label or name or run_id
    pairs = list(zip(nodes, gpus, strict=True))
    facts = {
        n: f
        for n, f in conn.execute(
            "SELECT node, facts FROM nodes WHERE node = ANY(%s)", (sorted(set(nodes)),)
        ).fetchall()
    }
    kinds = Counter(
        gpu_model_names(facts.get(n)).get(int(g)) or gpu_model_names(facts.get(n)).get(-1) for n, g in pairs
    )
    out: dict[str, Any] = {
        "run_id": run_id,
        "model": model,
        "gpu_model": None,
        "gpus": len(pairs),
        "max_throughput_loss": max_throughput_loss,
        "enough_data": False,
        "reasons": [],
        "current_limit_w": None,
        "proposed_limit_w": None,
        "action": "none",
        "basis": "tokens_per_joule",
        "at": iso(t_now),
    }
    if len([k for k in kinds if k]) != 1 or None in kinds:
        out["reasons"].append(
            f"the run's GPUs are not all of one known model (node facts name them): {dict(kinds)}"
        )
        return out
    gpu_model = next(iter(kinds))
    assert gpu_model is not None
    out["gpu_model"] = gpu_model
    if shared:
        out["reasons"].append(
            "the run holds a GPU it shares (time-slicing, MPS or MIG): the limit would cap "
            "the other tenants too"
        )
        return out
    limits = [float(r[2]) for r in conn.execute(LIMITS_SQL, (run_id, t_now - timedelta(minutes=15), t_now))]
    current = Counter(round(x) for x in limits).most_common(1)[0][0] if limits else None
    out["current_limit_w"] = current
    out["current_limits_w"] = sorted(set(limits))
    adv_cfg = replace(cfg.advisor, lookback=max(cfg.advisor.lookback, t_now - start + timedelta(minutes=1)))
    advice = power_cap_advice(conn, gpu_model, max_throughput_loss, model=model, now=t_now, settings=adv_cfg)
    models = advice.get("models") or []
    if not models:
        out["reasons"] += advice.get("reasons") or [f"no run of {model!r} reported progress"]
        return out
    m = models[0]
    out["levels"] = m["levels"]
    out["runs_compared"] = sorted({r for lv in m["levels"] for r in lv["runs"]})
    if not m["enough_data"]:
        out["reasons"] += m["reasons"]
        return out
    rec, ref = m["recommendation"], m["reference"]
    proposed = float(rec["power_limit_w"])
    out["enough_data"] = True
    out["proposed_limit_w"] = proposed
    out["throughput_loss"] = rec["throughput_loss"]
    if current is None:
        out["reasons"].append(
            "the run's GPUs reported no power limit in the last 15 minutes: the saving "
            "against its current limit is not known"
        )
        now_level = ref
    else:
        now_level = _level_at(m["levels"], current, cfg.same_limit_w) or ref
    tpj_now, tpj_new = float(now_level["tokens_per_joule"]), float(rec["tokens_per_joule"])
    saving = max(0.0, 1.0 - tpj_now / tpj_new) if tpj_new > 0 else 0.0
    out["compared_with"] = {
        "power_limit_w": now_level["power_limit_w"],
        "tokens_per_joule": tpj_now,
        "tokens_per_s_per_gpu": now_level["tokens_per_s_per_gpu"],
    }
    out["energy_per_token_saving"] = _r(saving)
    out["throughput_loss_vs_now"] = _r(
        1.0 - float(rec["tokens_per_s_per_gpu"]) / float(now_level["tokens_per_s_per_gpu"])
    )
    if current is not None and current <= proposed + cfg.same_limit_w:
        out["action"] = "keep"
        out["reasons"].append(
            f"the run already runs at {current:g} W, at or below the proposed {proposed:g} W"
        )
    elif saving > 0:
        out["action"] = "cap"
    # What a day of the run's work costs now, and what the cap saves of it (same tokens).
    t1 = min(end, t_now) if end is not None else t_now
    t0 = max(start, t1 - cfg.recent)
    joules, covered = conn.execute(ENERGY_SQL, (run_id, t0, t1)).fetchone() or (0.0, 0.0)
    price = get_site(conn, site, t_now) if site else {}
    pue = float(price.get("pue") or 1.0)
    per_kwh = price.get("price_per_kwh")
    exp: dict[str, Any] = {
        "measured_from": iso(t0),
        "measured_to": iso(t1),
        "gpu_seconds": _r(covered, 1),
        "pue": pue,
        "currency": price.get("currency"),
        "price_per_kwh": per_kwh,
    }
    if covered > 0:
        power_per_gpu = joules / covered
        gpu_kwh_day = power_per_gpu * len(pairs) * 86400.0 / 3.6e6
        exp.update(
            power_w_per_gpu=_r(power_per_gpu, 2),
            gpu_kwh_per_day_now=_r(gpu_kwh_day, 4),
            gpu_kwh_per_day_saved=_r(gpu_kwh_day * saving, 4),
            facility_kwh_per_day_saved=_r(gpu_kwh_day * saving * pue, 4),
            cost_per_day_saved=_r(gpu_kwh_day * saving * pue * float(per_kwh), 4)
            if per_kwh is not None
            else None,
        )
    else:
        out["reasons"].append("no GPU energy of the run in its latest hour: the daily saving is not known")
    out["expected_saving"] = exp
    return out
