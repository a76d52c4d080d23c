"""The runs' GPU models read set-wise give what the per-allocation rule gives, on awkward facts.

Bodies of many runs read their allocations' models in one query that expands each node's facts once
(``gpufleet.accounting.run._MODELS_SQL``); the accounting's own text applies
``GPU_MODEL_EXPR`` per allocation.  Both must name the same model for every allocation, or a run's
``gpu_models`` and the GPU-hour price it is charged at would disagree.
"""

from __future__ import annotations

import json
import random

import psycopg

from gpufleet.accounting import run as run_mod
from gpufleet.db.accounting_sql import GPU_MODEL_EXPR
from tests.accounting.builders import at, node, run

#: The per-allocation rule, as the accounting applies it: the oracle.
ONE_BY_ONE = f"""
SELECT a.run_id, a.sharing, {GPU_MODEL_EXPR} AS model, count(*) AS gpus, sum(a.share) AS shares
FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
CROSS JOIN LATERAL (SELECT gpufleet_node_facts_at(a.node, r.start) AS facts) nd WHERE a.run_id = ANY(%s)
GROUP BY 1, 2, 3 ORDER BY 1, 3 NULLS LAST, 2"""


def _facts(rng: random.Random, gpus: int) -> dict:
    """Facts as agents, imports and hand edits leave them: entries keyed by ``gpu`` or ``index``,
    repeated, unnamed, misnamed, or not objects at all; a node-wide model or none."""
    entries: list = []
    for _ in range(rng.randrange(0, 2 * gpus + 1)):
        kind = rng.randrange(8)
        g = rng.randrange(gpus + 1)  # one past the end: names a GPU no run holds
        name = rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", "", None, 7])
        if kind == 0:
            entries.append("not an object")
        elif kind == 1:
            entries.append({"index": g, "name": name})
        elif kind == 2:
            entries.append({"gpu": str(g), "name": name})
        elif kind == 3:
            entries.append({"gpu": g, "index": (g + 1) % gpus, "name": name})
        elif kind == 4:
            entries.append({"name": name})
        else:
            entries.append({"gpu": g, "name": name})
    if rng.random() < 0.5:  # a GPU named twice, differently: the last entry names it
        g = rng.randrange(gpus)
        entries += [{"gpu": g, "name": "NVIDIA L4"}, {"index": g, "name": "NVIDIA L40S"}]
    out: dict = {"gpu_count": gpus}
    shape = rng.randrange(4)
    if shape < 2:
        out["gpus"] = entries
    elif shape == 1:
        out["gpus"] = {"0": "not a list"}
    if rng.random() < 0.6:
        out["gpu_model"] = rng.choice(["NVIDIA H200", "", 3, None])
    return out


def test_models_read_set_wise_match_the_rule_per_allocation(conn: psycopg.Connection) -> None:
    rng = random.Random(20261207)
    gpus = 4
    for n in range(12):
        node(conn, f"n{n}", gpus, facts=_facts(rng, gpus))
        for k in range(rng.randrange(3)):  # facts that changed, some before and some after runs start
            conn.execute(
                "INSERT INTO node_facts_history (node, valid_from, facts) VALUES (%s, %s, %s)",
                (f"n{n}", at(1000 * (k + 1) + rng.randrange(500)), json.dumps(_facts(rng, gpus))),
            )
    ids = []
    for i in range(40):
        held = {
            f"n{n}": sorted(rng.sample(range(gpus), rng.randrange(1, gpus + 1)))
            for n in rng.sample(range(12), 3)
        }
        start = 100 * i + rng.randrange(90)  # runs one after another: a GPU is held once at a time
        run(conn, f"r{i}", start, start + 10, held)
        ids.append(f"r{i}")
        if rng.random() < 0.3:  # a shared GPU: another sharing and share on the same model
            n, gs = next(iter(held.items()))
            conn.execute(
                "UPDATE run_allocations SET sharing = 'time_slice', share = 0.5 WHERE run_id = %s AND node = %s AND gpu = %s",
                (f"r{i}", n, gs[0]),
            )
    want = conn.execute(ONE_BY_ONE, (ids,)).fetchall()
    got = conn.execute(run_mod._MODELS_SQL, (ids,)).fetchall()
    assert got == want
    named = {m for _, _, m, _, _ in want}
    # the fixture reaches every branch of the rule: a name from gpus[], the node's model, and none
    assert None in named and "NVIDIA H200" in named and "NVIDIA L40S" in named
    assert named & {"NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA A100-SXM4-80GB"}
