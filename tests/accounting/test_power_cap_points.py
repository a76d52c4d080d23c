"""A run's power-cap points, read a column at a time, are the points of the minute-by-minute rule.

:func:`gpufleet.advisor.power_cap.points_of` classifies a run's minutes with array operations (a
fleet's running runs are a few hundred thousand minutes a request).  ``one_by_one`` below is the rule
as it was written first, a minute at a time; on random runs with gaps, missing limits, GPUs at
different limits, a GPU lagging a change, minutes not every GPU reported, thin energy coverage and
progress that starts late or ends early, both must give the same points and the same minutes left
out, to the last bit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from gpufleet.advisor.power_cap import AdvisorSettings, Point, points_of
from gpufleet.timeparse import iso_at

Row = tuple[float, float | None, float | None, int, float, float]


def one_by_one(
    run_id: str,
    model: str,
    start: float,
    end: float | None,
    gpus: int,
    cfg: AdvisorSettings,
    now: float,
    progress: list[tuple[float, Any]],
    rows: list[Row],
) -> tuple[list[Point], dict[str, int]]:
    excluded: dict[str, int] = defaultdict(int)
    pt = np.array([p[0] for p in progress])
    pk = np.array([float(p[1]) for p in progress])
    hi = min(end if end is not None else now, float(pt[-1]))
    lo = max(start + cfg.warmup_s, float(pt[0]))
    minutes: list[tuple[float, float, float]] = []
    levels = {}
    for b, cmin, cmax, n, _j, _c in rows:
        if cmin is not None and cmax is not None and n == gpus and cmax - cmin <= 0.5:
            levels[b] = round(cmin / cfg.level_step_w) * cfg.level_step_w
    for b, cmin, cmax, n, joules, covered in rows:
        if b < lo or b + 60.0 > hi:
            excluded["outside the progress reports or in warm-up"] += 1
            continue
        if cmin is None or cmax is None or n != gpus:
            excluded["not every GPU of the run reported"] += 1
            continue
        if cmax - cmin > 0.5:
            excluded["GPUs of the run at different limits"] += 1
            continue
        lvl = levels[b]
        if levels.get(b - 60.0) != lvl or levels.get(b + 60.0) != lvl:
            excluded["the limit changed in this minute or the next"] += 1
            continue
        if covered < cfg.min_coverage * 60.0 * gpus:
            excluded["energy of the minute not fully covered"] += 1
            continue
        minutes.append((b, lvl, joules))
    points: list[Point] = []
    k = 0
    while k < len(minutes):
        j = k
        while (
            j + 1 < len(minutes)
            and minutes[j + 1][1] == minutes[k][1]
            and minutes[j + 1][0] == minutes[j][0] + 60
        ):
            j += 1
        t0, t1 = minutes[k][0], minutes[j][0] + 60.0
        seconds = t1 - t0
        if seconds >= cfg.min_segment_s:
            tokens = float(np.interp(t1, pt, pk) - np.interp(t0, pt, pk))
            joules = sum(m[2] for m in minutes[k : j + 1])
            points.append(
                Point(run_id, model, minutes[k][1], iso_at(t0), iso_at(t1), seconds, gpus, tokens, joules)
            )
        else:
            excluded["stretch at one limit shorter than min_segment_s"] += j - k + 1
        k = j + 1
    return points, dict(excluded)


def _run(rng: random.Random) -> tuple[float, float | None, int, float, list[tuple[float, float]], list[Row]]:
    gpus = rng.choice((1, 2, 4, 8))
    start = 1_798_000_000.0 + rng.randrange(0, 3600) + rng.choice((0.0, 0.5))
    b = float(int(start // 60) * 60)
    limit = rng.choice((300.0, 350.0, 402.4, 450.0, 700.0))
    rows: list[Row] = []
    for _ in range(rng.randrange(0, 400)):
        b += 60.0 * (1 if rng.random() > 0.03 else rng.randrange(2, 9))  # now and then a gap
        if rng.random() < 0.02:
            limit = rng.choice((300.0, 350.0, 402.4, 402.6, 450.0, 700.0))
        n = gpus if rng.random() > 0.03 else rng.randrange(0, gpus + 2)
        kind = rng.random()
        if kind < 0.03:
            lo_w = hi_w = None
        elif kind < 0.06:
            lo_w, hi_w = limit, limit + rng.choice((0.25, 0.5, 0.75, 50.0))
        else:
            lo_w = hi_w = limit
        covered = 60.0 * gpus * (1.0 if rng.random() > 0.05 else rng.uniform(0.5, 1.0))
        rows.append((b, lo_w, hi_w, n, rng.uniform(0, 500.0) * 60 * gpus, covered))
    t = start + rng.uniform(-600, 1800)
    progress, tokens = [], 0.0
    for _ in range(rng.randrange(2, 40)):
        progress.append((t, tokens))
        t += rng.uniform(30, 1200)
        tokens += rng.uniform(0, 1e7)
    end = None if rng.random() < 0.5 else b + rng.choice((0.0, 30.0, 60.0, 600.0))
    return start, end, gpus, b + 90.0, progress, rows


@pytest.mark.parametrize("seed", range(40))
def test_points_read_a_column_at_a_time_are_the_minute_by_minute_rule(seed: int) -> None:
    rng = random.Random(seed)
    cfg = AdvisorSettings(
        warmup_s=rng.choice((0.0, 120.0, 600.0)),
        min_segment_s=rng.choice((60.0, 120.0, 300.0)),
        level_step_w=rng.choice((1.0, 5.0, 25.0)),
        min_coverage=rng.choice((0.9, 0.95, 1.0)),
    )
    for case in range(25):
        start, end, gpus, now, progress, rows = _run(rng)
        want = one_by_one("r", "m", start, end, gpus, cfg, now, progress, rows)
        got = points_of("r", "m", start, end, gpus, cfg, now, progress, np.array(rows, dtype=np.float64))
        assert [asdict(p) for p in got[0]] == [asdict(p) for p in want[0]], (seed, case)
        assert got[1] == want[1], (seed, case)


def test_the_random_runs_reach_every_reason() -> None:
    reasons: set[str] = set()
    points = 0
    for seed in range(40):
        rng = random.Random(seed)
        cfg = AdvisorSettings(warmup_s=120.0, min_segment_s=300.0)
        for _ in range(25):
            start, end, gpus, now, progress, rows = _run(rng)
            got = one_by_one("r", "m", start, end, gpus, cfg, now, progress, rows)
            reasons |= set(got[1])
            points += len(got[0])
    assert len(reasons) == 6 and points > 100
