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

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from gpufleet.accounting.ahead import PriceAhead
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
        yield fill(
            url,
            settings,
            SCENARIO,
            1800.0,
            sweep_every_s=30.0,
            progress_every_s=30.0,
            start_time=START,
            send_facts=True,
        )


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
        out[(p["run_id"], p["start"])] = (
            k1[p["run_id"]] - k0[p["run_id"]],
            float((e1[idx] - e0[idx]).sum()) / 1e3,
        )
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
    assert by_run == {
        "cap-700": [700.0],
        "cap-500": [500.0],
        "cap-450": [450.0],
        "cap-400": [400.0],
        "cap-350": [350.0],
        "cap-switch": [700.0, 450.0],
    }
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
    assert sorted(levels) == [350.0, 400.0, 450.0, 500.0, 700.0] and all(
        lv["enough"] for lv in levels.values()
    )
    tps = [levels[c]["tokens_per_s_per_gpu"] for c in (350.0, 400.0, 450.0, 500.0, 700.0)]
    tpj = [levels[c]["tokens_per_joule"] for c in (350.0, 400.0, 450.0, 500.0, 700.0)]
    assert tps == sorted(tps) and tpj == sorted(tpj, reverse=True)
    # The two runs at 450 W (one all along, one after its change) pool into one level.
    assert levels[450.0]["runs"] == ["cap-450", "cap-switch"] and levels[700.0]["runs"] == [
        "cap-700",
        "cap-switch",
    ]
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
        strict = power_cap_advice(
            conn,
            H100,
            0.05,
            model="llama-13b-pretrain",
            now=sweep_db.end,
            settings=AdvisorSettings(warmup_s=300.0, min_level_s=3000.0),
        )
    (m,) = strict["models"]
    assert m["enough_data"] is False and any("less than 3000 s" in r for r in m["reasons"])
    assert thin["models"][0]["enough_data"] is True
    with psycopg.connect(sweep_db.url) as conn:
        none = power_cap_advice(conn, "NVIDIA A100-SXM4-80GB", 0.05, now=sweep_db.end, settings=CFG)
    assert (
        none["models"] == []
        and "no run on 'NVIDIA A100-SXM4-80GB' GPUs reported progress" in none["reasons"][0]
    )
    assert H100 in none["reasons"][0]  # it names the GPU models that do have data
    # asked for one model, only its runs are read; an empty answer still names every GPU model with data
    with psycopg.connect(sweep_db.url) as conn:
        nobody = power_cap_advice(conn, H100, 0.05, model="no-such-model", now=sweep_db.end, settings=CFG)
        elsewhere = power_cap_advice(
            conn, "NVIDIA A100-SXM4-80GB", 0.05, model="llama-13b-pretrain", now=sweep_db.end, settings=CFG
        )
    assert nobody["models"] == [] and "for model 'no-such-model'" in nobody["reasons"][0]
    assert nobody["reasons"][0].endswith(f"GPU models with runs that did: {H100}")
    assert elsewhere["reasons"][0].endswith(f"GPU models with runs that did: {H100}")


def test_a_run_on_a_shared_gpu_is_left_out(sweep_db: FilledFleet) -> None:
    # Declared sharing: the GPU's limit and energy are its tenants' together, the tokens one run's.
    with psycopg.connect(sweep_db.url) as conn:
        conn.execute(
            "UPDATE run_allocations SET sharing = 'time_slice', share = 0.5 WHERE run_id = 'cap-400'"
        )
        try:
            (m,) = power_cap_advice(
                conn, H100, 0.05, model="llama-13b-pretrain", now=sweep_db.end, settings=CFG
            )["models"]
        finally:
            conn.rollback()
    levels = {lv["power_limit_w"]: lv for lv in m["levels"]}
    assert 400.0 not in levels and sorted(levels) == [350.0, 450.0, 500.0, 700.0]
    assert all(p["run_id"] != "cap-400" for p in m["points"])
    assert m["excluded_minutes"][SHARED] == 1
    (again,) = _advice(sweep_db, 0.05, model="llama-13b-pretrain")["models"]
    assert (
        400.0 in {lv["power_limit_w"] for lv in again["levels"]} and SHARED not in again["excluded_minutes"]
    )


def test_the_endpoint_serves_the_advice(sweep_db: FilledFleet, settings: Settings) -> None:
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        sre = create_token(conn, "advisor-sre", "sre")
        finance = create_token(conn, "advisor-fin", "finance")
    with serve(create_app(sweep_db.url, settings)) as srv:
        c = httpx.Client(base_url=srv.url, timeout=60)
        to = sweep_db.end.isoformat()
        r = c.get(
            "/v1/advisor/power-cap",
            params={"gpu_model": H100, "max_throughput_loss": 0.25, "to": to},
            headers={"Authorization": f"Bearer {sre}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert {m["model"] for m in body["models"]} == {"llama-13b-pretrain", "mistral-7b-sft"}
        llama = next(m for m in body["models"] if m["model"] == "llama-13b-pretrain")
        assert llama["enough_data"] and llama["recommendation"]["power_limit_w"] < 700
        assert llama["points"] and all("tokens_per_joule" in p for p in llama["points"])
        # A window that ends before the runs: too thin, and it says why.
        early = c.get(
            "/v1/advisor/power-cap",
            params={"gpu_model": H100, "to": sweep_db.start.isoformat()},
            headers={"Authorization": f"Bearer {sre}"},
        ).json()
        assert early["models"] == [] and early["reasons"]
        bad = c.get(
            "/v1/advisor/power-cap",
            params={"gpu_model": H100, "max_throughput_loss": 1.5},
            headers={"Authorization": f"Bearer {sre}"},
        )
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "max_throughput_loss"]
        missing = c.get("/v1/advisor/power-cap", headers={"Authorization": f"Bearer {sre}"})
        assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["query", "gpu_model"]
        assert (
            c.get(
                "/v1/advisor/power-cap",
                params={"gpu_model": H100},
                headers={"Authorization": f"Bearer {finance}"},
            ).status_code
            == 403
        )
        assert c.get("/v1/advisor/power-cap", params={"gpu_model": H100}).status_code == 401


def _proposal(fleet: FilledFleet, run_id: str, loss: float = 0.05) -> dict[str, Any]:
    from gpufleet.advisor.run_cap import RunCapSettings, propose_run_cap

    with psycopg.connect(fleet.url) as conn:
        return propose_run_cap(conn, run_id, loss, now=fleet.end, settings=RunCapSettings(advisor=CFG))


def test_one_cap_for_a_run_with_its_saving_in_kwh_and_money(sweep_db: FilledFleet) -> None:
    p = _proposal(sweep_db, "cap-700")
    fleet_advice = _advice(sweep_db, 0.05, model="llama-13b-pretrain")["models"][0]
    assert p["enough_data"] and p["action"] == "cap" and p["gpus"] == 4 and p["gpu_model"] == H100
    assert (
        p["current_limit_w"] == 700
        and p["proposed_limit_w"] == fleet_advice["recommendation"]["power_limit_w"]
    )
    levels = {lv["power_limit_w"]: lv for lv in fleet_advice["levels"]}
    share = 1 - levels[700.0]["tokens_per_joule"] / levels[p["proposed_limit_w"]]["tokens_per_joule"]
    assert p["energy_per_token_saving"] == pytest.approx(share, abs=1e-6) and 0 < share < 0.5
    assert p["throughput_loss_vs_now"] <= 0.05
    # The daily saving from the run's own measured power over its last hour, at the site's PUE and price.
    with psycopg.connect(sweep_db.url) as conn:
        row = conn.execute(
            "SELECT sum(e.energy_j), sum(e.covered_s) FROM gpu_energy_1m e JOIN run_allocations a "
            "ON a.node = e.node AND a.gpu = e.gpu WHERE a.run_id = 'cap-700' AND e.bucket >= %s "
            "AND e.bucket < %s",
            (sweep_db.end - timedelta(hours=1), sweep_db.end),
        ).fetchone()
    assert row is not None
    j, s = row
    kwh_day = j / s * 4 * 86400 / 3.6e6
    exp = p["expected_saving"]
    assert exp["gpu_kwh_per_day_now"] == pytest.approx(kwh_day, rel=1e-4)
    assert exp["gpu_kwh_per_day_saved"] == pytest.approx(kwh_day * share, rel=1e-4)
    assert exp["facility_kwh_per_day_saved"] == pytest.approx(kwh_day * share * 1.25, rel=1e-4)
    assert exp["cost_per_day_saved"] == pytest.approx(kwh_day * share * 1.25 * 0.14, rel=1e-4)
    assert exp["currency"] == "EUR"


def test_a_run_already_capped_keeps_its_limit_and_one_without_data_says_why(sweep_db: FilledFleet) -> None:
    low = _proposal(sweep_db, "cap-350")
    assert low["enough_data"] and low["action"] == "keep" and low["current_limit_w"] == 350
    other = _proposal(sweep_db, "other-model")
    assert not other["enough_data"] and other["action"] == "none"
    assert any("one power limit only" in r for r in other["reasons"])


def test_a_cap_set_through_the_api_reaches_the_nodes_agents_and_comes_off(
    sweep_db: FilledFleet, settings: Settings, tmp_path: Path
) -> None:
    from gpufleet.agent.sources.nvml_power_cap import PlanFollower, PowerCapper, api_fetcher
    from gpufleet.sim.nvml_fake import H100_SXM, FakeNvml

    now = datetime.now(UTC)
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        admin = create_token(conn, "caps-admin", "admin")
        sre = create_token(conn, "caps-sre", "sre")
        n1 = create_token(conn, "caps-n1", "node", "live-01")
        n2 = create_token(conn, "caps-n2", "node", "live-02")
    with serve(create_app(sweep_db.url, settings)) as srv:
        c = httpx.Client(base_url=srv.url, timeout=60)
        h = {"Authorization": f"Bearer {admin}"}
        body = {
            "run_id": "live-run",
            "name": "llama-13b-pretrain",
            "start": (now - timedelta(hours=1)).isoformat(),
            "end": (now + timedelta(days=1)).isoformat(),
            "allocations": [{"node": "live-01", "gpus": [0, 1]}, {"node": "live-02", "gpus": [0, 1]}],
        }
        assert c.post("/v1/runs", json=body, headers=h).status_code in (200, 201)
        got = c.get("/v1/runs/live-run/power-cap", headers={"Authorization": f"Bearer {sre}"})
        assert got.status_code == 200 and got.json()["plan"] is None
        assert got.json()["proposal"]["action"] == "none"  # no facts name its GPUs: no comparable levels
        # Without a proposal, a cap needs a limit; with one it is set.
        assert c.put("/v1/runs/live-run/power-cap", json={}, headers=h).status_code == 409
        assert (
            c.put(
                "/v1/runs/live-run/power-cap",
                json={"limit_w": 450},
                headers={"Authorization": f"Bearer {sre}"},
            ).status_code
            == 403
        )
        put = c.put(
            "/v1/runs/live-run/power-cap", json={"limit_w": 450, "reason": "tokens/J sweep"}, headers=h
        )
        assert put.status_code == 200, put.text
        assert put.json()["plan"]["revision"] == 1 and put.json()["plan"]["state"] == "active"
        assert c.put("/v1/runs/nope/power-cap", json={"limit_w": 450}, headers=h).status_code == 404
        assert c.put("/v1/runs/live-run/power-cap", json={"limit_w": -5}, headers=h).status_code == 422
        # Each node reads its own plans with its own token, and only its own.
        plans = c.get("/v1/nodes/live-01/power-caps", headers={"Authorization": f"Bearer {n1}"}).json()[
            "plans"
        ]
        assert plans == [{"run_id": "live-run", "limit_w": 450.0, "revision": 1, "gpus": [0, 1]}]
        assert (
            c.get("/v1/nodes/live-01/power-caps", headers={"Authorization": f"Bearer {n2}"}).status_code
            == 403
        )
        # The agents apply it, through NVML, to every GPU the run holds on their node.
        gpus = {n: FakeNvml([H100_SXM] * 4) for n in ("live-01", "live-02")}
        followers = {}
        for n, tok in (("live-01", n1), ("live-02", n2)):
            gpus[n].init()
            followers[n] = PlanFollower(
                PowerCapper(gpus[n], tmp_path / f"{n}.json"), api_fetcher(srv.url, n, tok)
            )
            followers[n].sync()
            assert [g.power_limit_w for g in gpus[n].gpus] == [450.0, 450.0, 700.0, 700.0]
        # One node cannot (no root there): it reports so in its facts, and the cap leaves every node.
        with psycopg.connect(sweep_db.url, autocommit=True) as conn:
            for n, f in followers.items():
                if n == "live-02":
                    f.reports["live-run"] = {"revision": 1, "state": "failed", "detail": "no permission"}
                conn.execute(
                    "INSERT INTO nodes (node, facts) VALUES (%s, %s) ON CONFLICT (node) DO UPDATE "
                    "SET facts = EXCLUDED.facts",
                    (n, json.dumps(f.facts())),
                )
        state = c.get("/v1/runs/live-run/power-cap", headers=h).json()["plan"]
        assert state["state"] == "failed" and state["failed_on"] == {"live-02": "no permission"}
        assert state["nodes"]["live-01"]["state"] == "applied"
        followers["live-01"].sync()
        assert [g.power_limit_w for g in gpus["live-01"].gpus] == [700.0] * 4
        # A new revision retries; withdrawing puts every limit back.
        assert (
            c.put("/v1/runs/live-run/power-cap", json={"limit_w": 400}, headers=h).json()["plan"]["revision"]
            == 2
        )
        followers["live-01"].sync()
        assert [g.power_limit_w for g in gpus["live-01"].gpus] == [400.0, 400.0, 700.0, 700.0]
        gone = c.delete("/v1/runs/live-run/power-cap", headers=h)
        assert gone.status_code == 200 and gone.json()["plan"]["state"] == "withdrawn"
        followers["live-01"].sync()
        assert [g.power_limit_w for g in gpus["live-01"].gpus] == [700.0] * 4
        assert (
            c.get("/v1/nodes/live-01/power-caps", headers={"Authorization": f"Bearer {n1}"}).json()["plans"]
            == []
        )
        # At the run's end it is no longer handed out: the agents restore.
        assert c.put("/v1/runs/live-run/power-cap", json={"limit_w": 400}, headers=h).status_code == 200
    from gpufleet.advisor.plans import plans_for_node

    with psycopg.connect(sweep_db.url) as conn:
        assert [p["revision"] for p in plans_for_node(conn, "live-01", now)] == [4]
        assert plans_for_node(conn, "live-01", now + timedelta(days=2)) == []


# --------------------------------------------------------------------------- kept points

LLAMA = ("cap-700", "cap-500", "cap-450", "cap-400", "cap-350", "cap-switch")


def _ended(conn: psycopg.Connection, fleet: FilledFleet) -> None:
    """End the sweep's runs at the fleet's end (in the caller's transaction, rolled back after)."""
    conn.execute('UPDATE runs SET "end" = %s WHERE "end" IS NULL', (fleet.end,))


def _unend(conn: psycopg.Connection) -> None:
    """Put the sweep's runs back as the fixture made them: running."""
    conn.execute('UPDATE runs SET "end" = NULL WHERE run_id = ANY(%s)', ([*LLAMA, "other-model"],))


def _llama(conn: psycopg.Connection, fleet: FilledFleet, cfg: AdvisorSettings = CFG) -> dict[str, Any]:
    (m,) = power_cap_advice(conn, H100, 0.05, model="llama-13b-pretrain", now=fleet.end, settings=cfg)[
        "models"
    ]
    return m


def _kept(conn: psycopg.Connection) -> dict[str, list[dict[str, Any]]]:
    return {rid: pts for rid, pts in conn.execute("SELECT run_id, points FROM kept_power_points")}


def test_an_ended_runs_points_are_kept_and_read_back_until_an_input_moves(sweep_db: FilledFleet) -> None:
    with psycopg.connect(sweep_db.url) as conn:
        try:
            live = _llama(conn, sweep_db)  # running: nothing kept
            assert _kept(conn) == {}
            _ended(conn, sweep_db)
            first = _llama(conn, sweep_db)
            assert first == live  # ended at the same time: the same answer
            kept = _kept(conn)
            assert sorted(kept) == sorted(LLAMA)
            assert [p["power_limit_w"] for p in kept["cap-switch"]] == [700.0, 450.0]
            # read back, not computed again: a kept value changed behind the marks' back shows
            conn.execute(
                "UPDATE kept_power_points SET points = jsonb_set(points, '{0,tokens}', '1.0') "
                "WHERE run_id = 'cap-500'"
            )
            assert (
                next(p for p in _llama(conn, sweep_db)["points"] if p["run_id"] == "cap-500")["tokens"] == 1.0
            )
            # each input's mark makes the run's points computed again (and kept again, right)
            moves = {
                "progress": "UPDATE run_progress SET tokens = tokens WHERE run_id = 'cap-500'",
                "allocations": "UPDATE run_allocations SET gpu = gpu WHERE run_id = 'cap-500'",
                "samples' day": "SELECT gpufleet_pricing_bump(ARRAY(SELECT 'e:' || node || ':' || "
                "to_char(start AT TIME ZONE 'UTC', 'YYYY-MM-DD') FROM runs r JOIN run_allocations a "
                "USING (run_id) WHERE run_id = 'cap-500'))",
            }
            for what, change in moves.items():
                conn.execute(
                    "UPDATE kept_power_points SET points = jsonb_set(points, '{0,tokens}', '1.0') "
                    "WHERE run_id = 'cap-500'"
                )
                conn.commit()  # a new transaction id: the mark moves to a version the line did not record
                _ended(conn, sweep_db)
                conn.execute(change)
                assert _llama(conn, sweep_db) == first, what
                assert _kept(conn)["cap-500"] == kept["cap-500"], what
            # a run's model is read from the run on every request, not kept with its points
            conn.execute("UPDATE runs SET labels = '{\"model\": \"renamed\"}' WHERE run_id = 'cap-700'")
            assert "cap-700" not in {p["run_id"] for p in _llama(conn, sweep_db)["points"]}
        finally:
            conn.rollback()
            _unend(conn)
            conn.execute("DELETE FROM kept_power_points")
            conn.commit()


def test_a_request_past_its_budget_keeps_what_it_read_and_the_next_goes_on(
    sweep_db: FilledFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpufleet.advisor.power_cap as pc

    monkeypatch.setattr(pc, "_BATCH", 2)
    budgeted = AdvisorSettings(warmup_s=300.0, min_segment_s=300.0, min_level_s=900.0, budget_s=0.0)
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        try:
            _ended(conn, sweep_db)
            whole = _llama(conn, sweep_db)  # the unbudgeted answer, kept
            conn.execute("DELETE FROM kept_power_points")
            tries = []
            for _ in range(len(LLAMA)):
                try:
                    got = _llama(conn, sweep_db, budgeted)
                    break
                except pc.AdviceUnfinished as e:
                    tries.append((e.done, e.todo))
            else:
                raise AssertionError(f"never finished: {tries}")
            # one batch a request, each request's batch kept: 6, then 4, then 2 runs left to read
            assert tries == [(2, 6), (2, 4)]
            assert got == whole
        finally:
            _unend(conn)
            conn.execute("DELETE FROM kept_power_points")


def test_the_endpoint_answers_503_with_what_an_unfinished_advice_read(
    sweep_db: FilledFleet, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpufleet.api.routes.advisor as route
    from gpufleet.advisor.power_cap import AdviceUnfinished

    seen: list[float | None] = []

    def unfinished(*_a: Any, settings: AdvisorSettings, **_kw: Any) -> dict[str, Any]:
        seen.append(settings.budget_s)
        raise AdviceUnfinished(64, 300, 30.2)

    monkeypatch.setattr(route, "power_cap_advice", unfinished)
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        sre = create_token(conn, "advisor-budget", "sre")
    with serve(create_app(sweep_db.url, settings)) as srv:
        r = httpx.get(
            f"{srv.url}/v1/advisor/power-cap",
            params={"gpu_model": H100},
            headers={"Authorization": f"Bearer {sre}"},
            timeout=30,
        )
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "300 runs" in r.json()["detail"] and "64 were read and kept" in r.json()["detail"]
    assert seen == [settings.api.statement_timeout_s]


def test_the_leader_keeps_an_ended_runs_points_as_it_prices_the_run(sweep_db: FilledFleet) -> None:
    from gpufleet.advisor.run_cap import propose_run_cap

    def stored() -> list[tuple[str, int]]:
        return conn.execute("SELECT run_id, count(*) FROM kept_power_points GROUP BY 1 ORDER BY 1").fetchall()

    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        try:
            _ended(conn, sweep_db)
            whole = _llama(conn, sweep_db)
            proposal = propose_run_cap(conn, "cap-500", now=sweep_db.end + timedelta(seconds=1))
            conn.execute("DELETE FROM kept_power_points")
            PriceAhead(max_gap_s=60.0, budget_s=600.0).run(conn, sweep_db.end + timedelta(seconds=1))
            assert sorted(_kept(conn)) == sorted([*LLAMA, "other-model"])
            # as both readers read them: the fleet's advice and one run's proposal (shorter stretches)
            assert stored() == [(r, 2) for r in sorted([*LLAMA, "other-model"])]
            assert propose_run_cap(conn, "cap-500", now=sweep_db.end + timedelta(seconds=1)) == proposal
            assert stored() == [(r, 2) for r in sorted([*LLAMA, "other-model"])]  # nothing read again
            assert _llama(conn, sweep_db) == whole  # (this test's own settings: a third key of each run)
        finally:
            _unend(conn)
            conn.execute("DELETE FROM kept_power_points")


def test_a_running_runs_closed_hours_are_kept_and_give_the_same_advice(
    sweep_db: FilledFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's runs are running: an hour after its end, the hour they ran in has closed and is
    kept (``kept_power_minutes``); the advice read through it is the one read live, in one range."""
    from gpufleet.advisor import kept_minutes

    later = sweep_db.end + timedelta(hours=1)
    with psycopg.connect(sweep_db.url, autocommit=True) as conn:
        try:
            conn.execute("DELETE FROM kept_power_minutes")
            with monkeypatch.context() as mp:
                mp.setattr(
                    kept_minutes,
                    "minutes",
                    lambda c, runs, now: {
                        r.run_id: kept_minutes.read_ranges(c, [(r.run_id, r.start, now)])[0] for r in runs
                    },
                )
                live = power_cap_advice(conn, H100, 0.05, now=later, settings=CFG)
            assert conn.execute("SELECT count(*) FROM kept_power_minutes").fetchone() == (0,)
            power_cap_advice(conn, H100, 0.05, now=sweep_db.end, settings=CFG)  # not settled: none kept
            assert conn.execute("SELECT count(*) FROM kept_power_minutes").fetchone() == (0,)
            first = power_cap_advice(conn, H100, 0.05, now=later, settings=CFG)
            kept = {r for (r,) in conn.execute("SELECT DISTINCT run_id FROM kept_power_minutes")}
            assert kept == {*LLAMA, "other-model"}
            assert first == live
            # the leader keeps them too, as a pass goes: the advice read through what it kept is the same
            conn.execute("DELETE FROM kept_power_minutes")
            PriceAhead(max_gap_s=60.0, budget_s=600.0).run(conn, later)
            assert {r for (r,) in conn.execute("SELECT DISTINCT run_id FROM kept_power_minutes")} == kept
            assert power_cap_advice(conn, H100, 0.05, now=later, settings=CFG) == first
            assert power_cap_advice(conn, H100, 0.05, now=later, settings=CFG) == first
            # read back, not read again: a kept hour changed behind its marks' back shows in the joules
            (blob,) = conn.execute(
                "SELECT minutes FROM kept_power_minutes WHERE run_id = 'cap-500'"
            ).fetchone() or (None,)
            rows = kept_minutes.decode(bytes(blob)).copy()
            rows[:, 4] *= 2
            conn.execute(
                "UPDATE kept_power_minutes SET minutes = %s WHERE run_id = 'cap-500'",
                (kept_minutes.encode(rows),),
            )
            (m,) = power_cap_advice(conn, H100, 0.05, model="llama-13b-pretrain", now=later, settings=CFG)[
                "models"
            ]
            (m0,) = [x for x in first["models"] if x["model"] == "llama-13b-pretrain"]
            doubled = [p for p in m["points"] if p["run_id"] == "cap-500"]
            assert doubled and [p["joules"] for p in doubled] == [
                pytest.approx(2 * p["joules"]) for p in m0["points"] if p["run_id"] == "cap-500"
            ]
        finally:
            conn.execute("DELETE FROM kept_power_minutes")
