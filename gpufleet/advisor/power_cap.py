"""Power-cap advisor: the power limit that gives the most tokens per joule within a throughput budget.

From fleet data alone.  For every run of one GPU model that reports progress
(``run_progress``, cumulative tokens), each minute of the run is put at the
power limit its GPUs ran under (``gpu_stats_1m.power_limit_w``, the enforced
limit of every sample) with its exact energy (``gpu_energy_1m``, the
accounting's per-minute energy) and its tokens (the progress reports
interpolated linearly at the minute's edges).  Stretches of minutes at one
limit are the *points*: a run that never saw its limit change gives one
point, a run whose limit was changed gives one per limit.  Minutes are left
out, and the reason counted, where the run's GPUs ran at different limits,
where the limit changed in that minute or the next, where energy coverage is
incomplete, outside the reports, or in the run's first ``warmup_s``.  A run
that holds a GPU with declared sharing is left out whole (counted under
:data:`SHARED`): the limit and the energy are the GPU's, its tokens only
one tenant's.

Points of one model (``runs.labels.model``, else the run's name) at one
limit (rounded to ``level_step_w``) pool into a *level*: tokens per joule =
tokens / joules, tokens per second per GPU = tokens / GPU-seconds.  The
reference is the level with the highest throughput; the advice is the level
with the most tokens per joule whose throughput is within
``max_throughput_loss`` of it.  Only limits actually observed are advised
(nothing is interpolated between them), and a level needs at least
``min_level_s`` of counted time.  Where the data cannot support an answer
(no progress, one limit only, too little time at a limit) the advice says
``enough_data: false`` and lists why.

Runs of different sizes compare through per-GPU throughput; runs of the same
model whose batch size or sequence length differ do not compare, which the
advisor cannot see: the points are in the answer so that an operator can.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg

from gpufleet.advisor import kept_minutes, kept_points
from gpufleet.gpu_models import gpu_model_names
from gpufleet.timeparse import iso_at

_RUNS = """
SELECT r.run_id, r.name, r.labels->>'model', extract(epoch FROM r.start)::float8,
       extract(epoch FROM r."end")::float8,
       array_agg(a.node ORDER BY a.node, a.gpu), array_agg(a.gpu ORDER BY a.node, a.gpu),
       bool_or(a.sharing <> 'exclusive')
FROM runs r JOIN run_allocations a ON a.run_id = r.run_id
WHERE EXISTS (SELECT 1 FROM run_progress p WHERE p.run_id = r.run_id AND p.tokens IS NOT NULL)
  AND {where}
GROUP BY r.run_id
ORDER BY r.start, r.run_id
"""
#: Runs with progress overlapping [%s, %s), with their GPUs.
RUNS_SQL = _RUNS.format(where="""coalesce(r."end", 'infinity') > %s AND r.start < %s""")
#: The same, of model %s only (as :func:`_model_of` names it).
RUNS_OF_MODEL_SQL = _RUNS.format(
    where="""coalesce(r."end", 'infinity') > %s AND r.start < %s
  AND coalesce(nullif(r.labels->>'model', ''), nullif(r.name, ''), r.run_id) = %s"""
)
#: Runs with progress among %s, with their GPUs.
RUNS_OF_SQL = _RUNS.format(where="r.run_id = ANY(%s)")

#: Why a run on a declared-shared GPU (time-slicing, MPS, a MIG instance) is left out: the power limit
#: and the energy counter are the whole GPU's, shared with runs whose tokens are not this run's.
SHARED = "run on a shared GPU (its limit and energy are the whole GPU's)"

PROGRESS_SQL = """
SELECT run_id, extract(epoch FROM time)::float8, tokens FROM run_progress
WHERE run_id = ANY(%s) AND tokens IS NOT NULL ORDER BY run_id, time
"""


@dataclass(frozen=True)
class AdvisorSettings:
    """How the advisor reads the data (defaults suit minute rollups and runs of hours)."""

    #: Start-up of each run (load, compile, first steps) left out, seconds.
    warmup_s: float = 600.0
    #: Shortest stretch at one limit counted as a point, seconds.
    min_segment_s: float = 300.0
    #: Counted time a level needs before it is compared, seconds.
    min_level_s: float = 900.0
    #: Limits this close pool into one level, W.
    level_step_w: float = 5.0
    #: Share of a minute's GPU-seconds the energy rollup must cover.
    min_coverage: float = 0.95
    #: How far back runs are looked at.
    lookback: timedelta = timedelta(days=30)
    #: Seconds a request may spend reading runs not kept yet before it stops (what it read is kept,
    #: so the next request goes on from there); None: no limit.
    budget_s: float | None = None


class AdviceUnfinished(Exception):
    """The runs not kept yet took longer than the budget: ``done`` of ``todo`` were read and kept."""

    def __init__(self, done: int, todo: int, seconds: float) -> None:
        super().__init__(
            f"the advice needs {todo} runs read that no earlier request kept; {done} were read and kept in "
            f"{seconds:.0f} s, the rest are read by the next request"
        )
        self.done, self.todo, self.seconds = done, todo, seconds


@dataclass
class Point:
    run_id: str
    model: str
    power_limit_w: float
    start: str
    end: str
    seconds: float
    gpus: int
    tokens: float
    joules: float

    @property
    def gpu_seconds(self) -> float:
        return self.seconds * self.gpus


@dataclass
class Level:
    power_limit_w: float
    runs: list[str]
    points: int
    seconds: float
    gpu_seconds: float
    tokens: float
    joules: float
    tokens_per_joule: float
    tokens_per_s_per_gpu: float
    power_w_per_gpu: float
    enough: bool


@dataclass
class ModelAdvice:
    model: str
    enough_data: bool
    reasons: list[str] = field(default_factory=list)
    recommendation: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    levels: list[dict[str, Any]] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    excluded_minutes: dict[str, int] = field(default_factory=dict)


#: What a run with fewer than two progress reports leaves out.
_TOO_FEW = {"fewer than two progress reports": 1}


def _progress_of(conn: psycopg.Connection, run_ids: list[str]) -> dict[str, list[tuple[float, Any]]]:
    """Each run's progress reports with tokens, in time order, in one query."""
    out: dict[str, list[tuple[float, Any]]] = {rid: [] for rid in run_ids}
    for rid, t, tokens in conn.execute(PROGRESS_SQL, (run_ids,)):
        out[rid].append((t, tokens))
    return out


#: Why a minute is left out, in the order the reasons are tried.
OUTSIDE = "outside the progress reports or in warm-up"
NOT_ALL = "not every GPU of the run reported"
DIFFERENT = "GPUs of the run at different limits"
CHANGED = "the limit changed in this minute or the next"
UNCOVERED = "energy of the minute not fully covered"
SHORT = "stretch at one limit shorter than min_segment_s"


def points_of(
    run_id: str,
    model: str,
    start: float,
    end: float | None,
    gpus: int,
    cfg: AdvisorSettings,
    now: float,
    progress: list[tuple[float, Any]],
    rows: np.ndarray,
) -> tuple[list[Point], dict[str, int]]:
    """The stretches of one run at one limit, and the minutes left out by reason, from its progress
    reports (two at least) and its minutes from its start to its end (or ``now``, rows of
    :data:`~gpufleet.advisor.kept_minutes.COLUMNS` in bucket order), a column at a time: a fleet's
    running runs are a few hundred thousand minutes a request."""
    pt = np.array([p[0] for p in progress])
    pk = np.array([float(p[1]) for p in progress])
    hi = min(end if end is not None else now, float(pt[-1]))
    lo = max(start + cfg.warmup_s, float(pt[0]))
    b, cmin, cmax, n, joules, covered = rows.reshape(-1, 6).T
    with np.errstate(invalid="ignore"):  # a missing limit is NaN: unequal, never within 0.5 W
        one_limit = (n == gpus) & (cmax - cmin <= 0.5)
        level = np.where(one_limit, np.round(cmin / cfg.level_step_w) * cfg.level_step_w, np.nan)
    before, after = _neighbour(b, level, -60.0), _neighbour(b, level, 60.0)
    outside = (b < lo) | (b + 60.0 > hi)
    not_all = ~outside & (np.isnan(cmin) | (n != gpus))
    different = ~outside & ~not_all & ~one_limit
    changed = ~outside & one_limit & ((before != level) | (after != level))
    uncovered = ~outside & one_limit & ~changed & (covered < cfg.min_coverage * 60.0 * gpus)
    good = ~outside & one_limit & ~changed & ~uncovered
    excluded = {
        why: int(k)
        for why, k in (
            (OUTSIDE, outside.sum()),
            (NOT_ALL, not_all.sum()),
            (DIFFERENT, different.sum()),
            (CHANGED, changed.sum()),
            (UNCOVERED, uncovered.sum()),
        )
        if k
    }
    gb, gl, gj = b[good], level[good], joules[good]
    # stretches: runs of good minutes one after another at one level
    cuts = np.flatnonzero((gl[1:] != gl[:-1]) | (gb[1:] != gb[:-1] + 60.0)) + 1
    points: list[Point] = []
    short = 0
    for k, j in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(gb)].tolist(), strict=True):
        if k == j:
            continue
        t0, t1 = float(gb[k]), float(gb[j - 1]) + 60.0
        seconds = t1 - t0
        if seconds >= cfg.min_segment_s:
            tokens = float(np.interp(t1, pt, pk) - np.interp(t0, pt, pk))
            points.append(
                Point(
                    run_id,
                    model,
                    float(gl[k]),
                    iso_at(t0),
                    iso_at(t1),
                    seconds,
                    gpus,
                    tokens,
                    sum(gj[k:j].tolist()),
                )
            )
        else:
            short += j - k
    if short:
        excluded[SHORT] = short
    return points, excluded


def _neighbour(b: np.ndarray, level: np.ndarray, offset: float) -> np.ndarray:
    """The level of the minute ``offset`` seconds from each (NaN where there is none)."""
    at = np.searchsorted(b, b + offset)
    inside = at < len(b)
    found = np.zeros(len(b), dtype=bool)
    found[inside] = b[at[inside]] == b[inside] + offset
    out = np.full(len(b), np.nan)
    out[found] = level[at[found]]
    return out


def _levels(points: Iterable[Point], cfg: AdvisorSettings) -> list[Level]:
    by: dict[float, list[Point]] = defaultdict(list)
    for p in points:
        by[p.power_limit_w].append(p)
    out = []
    for limit, ps in sorted(by.items()):
        seconds = sum(p.seconds for p in ps)
        gs = sum(p.gpu_seconds for p in ps)
        tokens = sum(p.tokens for p in ps)
        joules = sum(p.joules for p in ps)
        out.append(
            Level(
                power_limit_w=limit,
                runs=sorted({p.run_id for p in ps}),
                points=len(ps),
                seconds=seconds,
                gpu_seconds=gs,
                tokens=tokens,
                joules=joules,
                tokens_per_joule=tokens / joules if joules > 0 else math.nan,
                tokens_per_s_per_gpu=tokens / gs if gs > 0 else math.nan,
                power_w_per_gpu=joules / gs if gs > 0 else math.nan,
                enough=seconds >= cfg.min_level_s and joules > 0 and tokens > 0,
            )
        )
    return out


def _round(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in d.items()}


def advise_model(
    model: str, points: list[Point], excluded: dict[str, int], max_loss: float, cfg: AdvisorSettings
) -> ModelAdvice:
    levels = _levels(points, cfg)
    adv = ModelAdvice(
        model=model,
        enough_data=False,
        excluded_minutes=dict(sorted(excluded.items())),
        levels=[_round(asdict(lv)) for lv in levels],
        points=[
            _round(
                {
                    **asdict(p),
                    "tokens_per_joule": p.tokens / p.joules if p.joules else None,
                    "tokens_per_s_per_gpu": p.tokens / p.gpu_seconds if p.gpu_seconds else None,
                }
            )
            for p in points
        ],
    )
    usable = [lv for lv in levels if lv.enough]
    if not points:
        adv.reasons.append(
            "no stretch of at least min_segment_s at one power limit with progress and full energy "
            "coverage" + (f" (minutes left out: {dict(sorted(excluded.items()))})" if excluded else "")
        )
        return adv
    thin = [lv.power_limit_w for lv in levels if not lv.enough]
    if thin:
        adv.reasons.append(
            f"limits {', '.join(f'{x:g} W' for x in thin)} have less than {cfg.min_level_s:g} s of "
            "counted time and are not compared"
        )
    if len(usable) < 2:
        only = f" ({usable[0].power_limit_w:g} W)" if usable else ""
        adv.reasons.append(
            f"data at one power limit only{only}: nothing to compare; run a job of this model at "
            "another limit (nvidia-smi -pl) or change the limit of one mid-run"
        )
        return adv
    ref = max(usable, key=lambda lv: lv.tokens_per_s_per_gpu)
    ok = [lv for lv in usable if lv.tokens_per_s_per_gpu >= (1.0 - max_loss) * ref.tokens_per_s_per_gpu]
    best = max(ok, key=lambda lv: lv.tokens_per_joule)
    adv.enough_data = True
    adv.reference = _round(
        {
            "power_limit_w": ref.power_limit_w,
            "tokens_per_joule": ref.tokens_per_joule,
            "tokens_per_s_per_gpu": ref.tokens_per_s_per_gpu,
        }
    )
    adv.recommendation = _round(
        {
            "power_limit_w": best.power_limit_w,
            "tokens_per_joule": best.tokens_per_joule,
            "tokens_per_s_per_gpu": best.tokens_per_s_per_gpu,
            "throughput_loss": 1.0 - best.tokens_per_s_per_gpu / ref.tokens_per_s_per_gpu,
            "energy_per_token_saving": 1.0 - ref.tokens_per_joule / best.tokens_per_joule,
            "runs": best.runs,
        }
    )
    return adv


def _model_of(name: str | None, label: str | None, run_id: str) -> str:
    return label or name or run_id


#: Runs read (and their points kept) per transaction of storing.
_BATCH = 64

#: A run the advisor looks at: id, model, start, end (None: running), its GPUs' nodes, declared shared.
_Chosen = tuple[str, str, float, float | None, list[str], bool]


def _points(
    conn: psycopg.Connection,
    chosen: list[_Chosen],
    cfg: AdvisorSettings,
    t_now: float,
) -> dict[str, tuple[list[Point], dict[str, int]]]:
    """Each chosen run's points and minutes left out: an ended run's as kept while its marks hold, else
    read (and an ended run's kept), one batch at least and no new batch past ``cfg.budget_s``."""
    out: dict[str, tuple[list[Point], dict[str, int]]] = {}
    ended: dict[str, kept_points.Run] = {}
    for run_id, _m, start, end, nodes, shared in chosen:
        if shared:
            out[run_id] = ([], {SHARED: 1})
        elif end is not None:
            ended[run_id] = kept_points.Run(run_id, start, end, tuple(nodes))
    keys = {rid: kept_points.key(rid, r.start, r.end, len(r.nodes), cfg) for rid, r in ended.items()}
    model_of = {c[0]: c[1] for c in chosen}
    for rid, k in kept_points.lookup(conn, keys).items():
        out[rid] = ([Point(model=model_of[rid], **p) for p in k.points], k.excluded)  # type: ignore[arg-type]
    todo = [c for c in chosen if c[0] not in out]
    started = time.perf_counter()
    for i in range(0, len(todo), _BATCH):
        if i and cfg.budget_s is not None and time.perf_counter() - started > cfg.budget_s:
            raise AdviceUnfinished(i, len(todo), time.perf_counter() - started)
        batch = todo[i : i + _BATCH]
        marks = kept_points.marks(conn, [ended[c[0]] for c in batch if c[0] in ended])
        progress = _progress_of(conn, [c[0] for c in batch])
        read = [c for c in batch if len(progress[c[0]]) >= 2]
        # a running run's closed hours as kept, the rest read; the ended runs' whole windows: each in one query
        rows_of = kept_minutes.minutes(
            conn, [kept_minutes.Running(c[0], c[2]) for c in read if c[3] is None], t_now
        )
        ended_read = [(c[0], c[2], c[3]) for c in read if c[3] is not None]
        rows_of.update(
            zip((r[0] for r in ended_read), kept_minutes.read_ranges(conn, ended_read), strict=True)
        )
        fills = []
        for run_id, m, start, end, nodes, _shared in batch:
            pts: list[Point]
            if run_id not in rows_of:
                pts, excl = [], dict(_TOO_FEW)
            else:
                pts, excl = points_of(
                    run_id, m, start, end, len(nodes), cfg, t_now, progress[run_id], rows_of[run_id]
                )
            out[run_id] = (pts, excl)
            if run_id in ended:
                fills.append(kept_points.Fill(ended[run_id], keys[run_id], marks[run_id], pts, excl))
        kept_points.keep(conn, fills)
    return out


def keep_points(conn: psycopg.Connection, run_ids: list[str], settings: AdvisorSettings | None = None) -> int:
    """Read and keep the points of those of ``run_ids`` that ended and report progress, unless kept
    already: what the collector's leader does as runs end, so the advisor's first reader finds them.
    Returns how many runs were looked at."""
    cfg = settings or AdvisorSettings()
    chosen = [
        (run_id, _model_of(name, label, run_id), start, end, list(nodes), bool(shared))
        for run_id, name, label, start, end, nodes, _gpus, shared in conn.execute(RUNS_OF_SQL, (run_ids,))
        if end is not None
    ]
    _points(conn, chosen, cfg, time.time())
    return len(chosen)


#: Running runs the advisor reads minutes of (two progress reports at least, no shared GPU): each
#: one's start and GPU count.
_RUNNING_SQL = """
SELECT r.run_id, extract(epoch FROM r.start)::float8, count(*)
FROM runs r JOIN run_allocations a ON a.run_id = r.run_id
WHERE r."end" IS NULL AND r.start < %s
  AND EXISTS (SELECT 1 FROM run_progress p WHERE p.run_id = r.run_id AND p.tokens IS NOT NULL OFFSET 1)
GROUP BY r.run_id HAVING NOT coalesce(bool_or(a.sharing <> 'exclusive'), false)
ORDER BY r.run_id
"""


def keep_running_hours(conn: psycopg.Connection, now: datetime, deadline: float) -> int:
    """Keep the closed hours of every running run the advisor reads, not kept yet or no longer holding,
    until ``deadline`` (``time.monotonic()``; one statement at least): what the collector's leader does
    each pass, so the advisor's first reader finds them.  Returns how many run-hours were kept."""
    rows = conn.execute(_RUNNING_SQL, (now,)).fetchall()
    runs = [kept_minutes.Running(rid, start) for rid, start, _n in rows]
    return kept_minutes.keep_closed(conn, runs, {rid: n for rid, _s, n in rows}, now.timestamp(), deadline)


def _choose(
    rows: list[tuple[Any, ...]], names: dict[str, dict[int, str]], gpu_model: str, model: str | None
) -> tuple[list[_Chosen], set[str]]:
    """Of ``rows`` (:data:`RUNS_SQL`'s), the runs on ``gpu_model`` GPUs only (of ``model``), and the GPU
    models all of them ran on."""
    # a node whose GPUs all have one name (most): a run's kinds from its nodes, not GPU by GPU
    uniform = {n: v[-1] for n, v in names.items() if -1 in v and set(v.values()) == {v[-1]}}
    want = gpu_model.strip().lower()
    seen_models: set[str] = set()
    chosen: list[_Chosen] = []
    for run_id, name, label, start, end, nodes, gpus, shared in rows:
        held = set(nodes)
        if held <= uniform.keys():
            kinds = {uniform[n] for n in held}
        else:
            kinds = {
                (names.get(n, {}).get(int(g)) or names.get(n, {}).get(-1) or "")
                for n, g in zip(nodes, gpus, strict=True)
            }
        seen_models.update(k for k in kinds if k)
        if {k.lower() for k in kinds} != {want}:
            continue
        m = _model_of(name, label, run_id)
        if model is not None and m != model:
            continue
        chosen.append((run_id, m, start, end, list(nodes), bool(shared)))
    return chosen, seen_models


def power_cap_advice(
    conn: psycopg.Connection,
    gpu_model: str,
    max_throughput_loss: float = 0.05,
    model: str | None = None,
    now: datetime | None = None,
    settings: AdvisorSettings | None = None,
) -> dict[str, Any]:
    """The advice for every model trained on ``gpu_model`` GPUs (or only ``model``)."""
    if not 0.0 <= max_throughput_loss < 1.0:
        raise ValueError("max_throughput_loss must be in [0, 1)")
    cfg = settings or AdvisorSettings()
    t_now = (now or datetime.now(UTC)).timestamp()
    since = datetime.fromtimestamp(t_now, UTC) - cfg.lookback
    facts = {n: f for n, f in conn.execute("SELECT node, facts FROM nodes").fetchall()}
    names = {n: gpu_model_names(f) for n, f in facts.items()}
    window = (since, datetime.fromtimestamp(t_now, UTC))
    # only the model's runs are read where one is asked for; the GPU models the others ran on are
    # named only where the answer is empty
    chosen, seen_models = _choose(
        conn.execute(RUNS_SQL, window).fetchall()
        if model is None
        else conn.execute(RUNS_OF_MODEL_SQL, (*window, model)).fetchall(),
        names,
        gpu_model,
        model,
    )
    if not chosen and model is not None:
        seen_models = _choose(conn.execute(RUNS_SQL, window).fetchall(), names, gpu_model, model)[1]
    got = _points(conn, chosen, cfg, t_now)
    per_model: dict[str, tuple[list[Point], dict[str, int], list[str]]] = {}
    for run_id, m, *_rest in chosen:
        pts, excl = got[run_id]
        bucket = per_model.setdefault(m, ([], defaultdict(int), []))
        bucket[0].extend(pts)
        for k, v in excl.items():
            bucket[1][k] += v
        bucket[2].append(run_id)
    advice = [
        advise_model(m, pts, dict(excl), max_throughput_loss, cfg)
        for m, (pts, excl, _) in sorted(per_model.items())
    ]
    out: dict[str, Any] = {
        "gpu_model": gpu_model,
        "max_throughput_loss": max_throughput_loss,
        "model": model,
        "since": iso_at(since.timestamp()),
        "until": iso_at(t_now),
        "models": [asdict(a) for a in advice],
    }
    if not advice:
        why = (
            f"no run on {gpu_model!r} GPUs reported progress (POST /v1/runs/{{id}}/progress) since "
            f"{iso_at(since.timestamp())}"
        )
        if model is not None:
            why += f" for model {model!r}"
        out["reasons"] = [
            why
            + (f"; GPU models with runs that did: {', '.join(sorted(seen_models))}" if seen_models else "")
        ]
    return out
