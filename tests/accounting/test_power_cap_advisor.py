"""The power-cap advisor on simulated runs with known physics, through the real pipeline.

``tests/fixtures/scenarios/power_cap_sweep.yaml`` trains one model with one fixed workload at
five power limits (700 W default, 500, 450, 400, 350 W) and once with the limit changed from
700 to 450 W mid-run; another model runs at the default limit only.  The samples go through the
collector's writer and the rollups into PostgreSQL, progress is reported as a training loop
would, and the advisor reads the database.  Its numbers are checked against the simulator's own
ground truth (tokens it counted and energy its counters integrated over the same stretches, in a
second, independent run of the simulation), and its choice against the choice that truth makes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from gpufleet.advisor.power_cap import SHARED, AdvisorSettings, power_cap_advice
from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import serve
from gpufleet.sim import Fleet
from tests.surfaces.fleetdb import FilledFleet, fill

SCENARIO = str(Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "power_cap_sweep.yaml")
H100 = "NVIDIA H100 80GB HBM3"
START = 1_798_000_200.0  # a whole minute
CFG = AdvisorSettings(warmup_s=300.0, min_segment_s=300.0, min_level_s=900.0)


@pytest.fixture(scope="module")
def sweep_db(pg_server: str, settings: Settings) -> Iterator[FilledFleet]:
    with scratch_database(pg_server, "gpufleet_powercap") as url:
        migrate.upgrade(url, settings)
        yield fill(url, settings, SCENARIO, 1800.0, sweep_every_s=30.0, progress_every_s=30.0, start_time=START,
                   send_facts=True)


def _advice(fleet: FilledFleet, loss: float, **kw: Any) -> dict[str, Any]:
    with psycopg.connect(fleet.url) as conn:
        return power_cap_advice(conn, H100, loss, now=fleet.end, settings=CFG, **kw)


def _truth(points: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(tokens, joules) of each point's run over the point's stretch, from a fresh simulation."""
    fleet = Fleet.from_scenario(SCENARIO, start_time=START)
    gpus = {r.run_id: r.gpu_idx for r in fleet.plan.runs}
    times = sorted({_epoch(p[k]) for p in points for k in ("start", "end")})
    snaps: dict[float, tuple[dict[str, float], np.ndarray]] = {}
    for t in times:
        fleet.advance_to(t)
        assert fleet.t == pytest.approx(t)
        snaps[t] = ({k: v["tokens"] for k, v in fleet.run_progress().items()}, fleet.engine.energy_mj.copy())
    out = {}
    for p in points:
        (k0, e0), (k1, e1) = snaps[_epoch(p["start"])], snaps[_epoch(p["end"])]
        idx = gpus[p["run_id"]]
        out[(p["run_id"], p["start"])] = (k1[p["run_id"]] - k0[p["run_id"]], float((e1[idx] - e0[idx]).sum()) / 1e3)
    return out


def _epoch(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def test_points_are_the_stretches_at_one_limit_and_match_the_simulation(sweep_db: FilledFleet) -> None:
    adv = _advice(sweep_db, 0.05, model="llama-13b-pretrain")
    (m,) = adv["models"]
    points = m["points"]
    by_run: dict[str, list[float]] = {}
    for p in points:
        by_run.setdefault(p["run_id"], []).append(p["power_limit_w"])
    assert by_run == {"cap-700": [700.0], "cap-500": [500.0], "cap-450": [450.0], "cap-400": [400.0],
                      "cap-350": [350.0], "cap-switch": [700.0, 450.0]}
    # The switch's minutes at and right after the change are left out, and said to be.
    assert m["excluded_minutes"]["the limit changed in this minute or the next"] >= 2
    switch = [p for p in points if p["run_id"] == "cap-switch"]
    assert _epoch(switch[0]["end"]) <= START + 900 <= _epoch(switch[1]["start"])
    truth = _truth(points)
    for p in points:
        tokens, joules = truth[(p["run_id"], p["start"])]
        assert p["tokens"] == pytest.approx(tokens, rel=0.01), p
        assert p["joules"] == pytest.approx(joules, rel=0.005), p
        assert p["gpus"] == 4


def test_known_physics_lower_limits_trade_throughput_for_tokens_per_joule(sweep_db: FilledFleet) -> None:
    (m,) = _advice(sweep_db, 0.05, model="llama-13b-pretrain")["models"]
    levels = {lv["power_limit_w"]: lv for lv in m["levels"]}
    assert sorted(levels) == [350.0, 400.0, 450.0, 500.0, 700.0] and all(lv["enough"] for lv in levels.values())
    tps = [levels[c]["tokens_per_s_per_gpu"] for c in (350.0, 400.0, 450.0, 500.0, 700.0)]
    tpj = [levels[c]["tokens_per_joule"] for c in (350.0, 400.0, 450.0, 500.0, 700.0)]
    assert tps == sorted(tps) and tpj == sorted(tpj, reverse=True)
    # The two runs at 450 W (one all along, one after its change) pool into one level.
    assert levels[450.0]["runs"] == ["cap-450", "cap-switch"] and levels[700.0]["runs"] == ["cap-700", "cap-switch"]
    # A GPU at a 400 W limit draws at most that; the default limit is above what the job draws.
    assert levels[400.0]["power_w_per_gpu"] <= 400.0 and levels[700.0]["power_w_per_gpu"] < 650.0


@pytest.mark.parametrize("loss", [0.0, 0.03, 0.07, 0.11, 0.25])
def test_the_advice_is_the_choice_the_simulations_truth_makes(sweep_db: FilledFleet, loss: float) -> None:
    adv = _advice(sweep_db, loss, model="llama-13b-pretrain")
    (m,) = adv["models"]
    assert m["enough_data"] is True and m["reasons"] == []
    truth = _truth(m["points"])
    # Pool the truth per limit exactly as the advisor pools its points.
    pooled: dict[float, list[float]] = {}
    for p in m["points"]:
        tok, j = truth[(p["run_id"], p["start"])]
        acc = pooled.setdefault(p["power_limit_w"], [0.0, 0.0, 0.0])
        acc[0] += tok
        acc[1] += j
        acc[2] += p["seconds"] * p["gpus"]
    tps = {c: v[0] / v[2] for c, v in pooled.items()}
    tpj = {c: v[0] / v[1] for c, v in pooled.items()}
    ref = max(tps, key=lambda c: tps[c])
    # The losses of the levels stay clear of the budgets tested, so measurement noise cannot flip the choice.
    assert all(abs((1 - tps[c] / tps[ref]) - loss) > 0.01 for c in tps if c != ref)
    ok = [c for c in tps if tps[c] >= (1 - loss) * tps[ref]]
    want = max(ok, key=lambda c: tpj[c])
    rec = m["recommendation"]
    assert (m["reference"]["power_limit_w"], rec["power_limit_w"]) == (ref, want)
    assert rec["throughput_loss"] == pytest.approx(1 - tps[want] / tps[ref], abs=0.005)
    assert rec["tokens_per_joule"] == pytest.approx(tpj[want], rel=0.01)
    assert rec["throughput_loss"] <= loss


def test_too_little_data_says_so_and_why(sweep_db: FilledFleet) -> None:
    adv = _advice(sweep_db, 0.05)
    other = next(m for m in adv["models"] if m["model"] == "mistral-7b-sft")
    assert other["enough_data"] is False and other["recommendation"] is None
    assert any("one power limit only (700 W)" in r for r in other["reasons"])
    assert len(other["points"]) == 1
    thin = _advice(sweep_db, 0.05, model="llama-13b-pretrain")
    with psycopg.connect(sweep_db.url) as conn:
        strict = power_cap_advice(conn, H100, 0.05, model="llama-13b-pretrain", now=sweep_db.end,
                                  settings=AdvisorSettings(warmup_s=300.0, min_level_s=3000.0))
    (m,) = strict["models"]
    assert m["enough_data"] is False and any("less than 3000 s" in r for r in m["reasons"])
    assert thin["models"][0]["enough_data"] is True
    with psycopg.connect(sweep_db.url) as conn:
        none = power_cap_advice(conn, "NVIDIA A100-SXM4-80GB", 0.05, now=sweep_db.end, settings=CFG)
    assert none["models"] == [] and "no run on 'NVIDIA A100-SXM4-80GB' GPUs reported progress" in none["reasons"][0]
    assert H100 in none["reasons"][0]  # it names the GPU models that do have data


def test_a_run_on_a_shared_gpu_is_left_out(sweep_db: FilledFleet) -> None:
    # Declared sharing: the GPU's limit and energy are its tenants' together, the tokens one run's.
    with psycopg.connect(sweep_db.url) as conn:
        conn.execute("UPDATE run_allocations SET sharing = 'time_slice', share = 0.5 WHERE run_id = 'cap-400'")
        try:
            (m,) = power_cap_advice(conn, H100, 0.05, model="llama-13b-pretrain", now=sweep_db.end,
                                    settings=CFG)["models"]
        finally:
            conn.rollback()
    levels = {lv["power_limit_w"]: lv for lv in m["levels"]}
    assert 400.0 not in levels and sorted(levels) == [350.0, 450.0, 500.0, 700.0]
    assert all(p["run_id"] != "cap-400" for p in m["points"])
    assert m["excluded_minutes"][SHARED] == 1
    (again,) = _advice(sweep_db, 0.05, model="llama-13b-pretrain")["models"]
    assert 400.0 in {lv["power_limit_w"] for lv in again["levels"]} and SHARED not in again["excluded_minutes"]


def test_the_endpoint_serves_the_advice(sweep_db: FilledFleet, settings: Settings) -> None:
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        sre = create_token(conn, "advisor-sre", "sre")
        finance = create_token(conn, "advisor-fin", "finance")
    with serve(create_app(sweep_db.url, settings)) as srv:
        c = httpx.Client(base_url=srv.url, timeout=60)
        to = sweep_db.end.isoformat()
        r = c.get("/v1/advisor/power-cap", params={"gpu_model": H100, "max_throughput_loss": 0.25, "to": to},
                  headers={"Authorization": f"Bearer {sre}"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert {m["model"] for m in body["models"]} == {"llama-13b-pretrain", "mistral-7b-sft"}
        llama = next(m for m in body["models"] if m["model"] == "llama-13b-pretrain")
        assert llama["enough_data"] and llama["recommendation"]["power_limit_w"] < 700
        assert llama["points"] and all("tokens_per_joule" in p for p in llama["points"])
        # A window that ends before the runs: too thin, and it says why.
        early = c.get("/v1/advisor/power-cap", params={"gpu_model": H100, "to": sweep_db.start.isoformat()},
                      headers={"Authorization": f"Bearer {sre}"}).json()
        assert early["models"] == [] and early["reasons"]
        bad = c.get("/v1/advisor/power-cap", params={"gpu_model": H100, "max_throughput_loss": 1.5},
                    headers={"Authorization": f"Bearer {sre}"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "max_throughput_loss"]
        missing = c.get("/v1/advisor/power-cap", headers={"Authorization": f"Bearer {sre}"})
        assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["query", "gpu_model"]
        assert c.get("/v1/advisor/power-cap", params={"gpu_model": H100},
                     headers={"Authorization": f"Bearer {finance}"}).status_code == 403
        assert c.get("/v1/advisor/power-cap", params={"gpu_model": H100}).status_code == 401
