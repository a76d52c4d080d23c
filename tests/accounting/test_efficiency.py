"""Tokens per energy, MFU from the GPU model in node facts, goodput from incidents."""

from __future__ import annotations

import json

import psycopg
import pytest

from gpufleet.accounting import run_accounting
from gpufleet.accounting.efficiency import peak_flops
from gpufleet.accounting.peak_flops import peak_of
from tests.accounting.builders import KWH, approx, at, constant_power, gpu_samples, node, run

H100 = {"gpus": [{"gpu": g, "name": "NVIDIA H100 80GB HBM3"} for g in range(8)]}


@pytest.mark.parametrize(
    "name,peak,dtype",
    [
        ("NVIDIA H100 80GB HBM3", 989.5e12, "bf16"),
        ("NVIDIA H100 PCIe", 756.5e12, "bf16"),
        ("NVIDIA H100 NVL", 835.5e12, "bf16"),
        ("NVIDIA H200", 989.5e12, "bf16"),
        ("NVIDIA H200 NVL", 835.5e12, "bf16"),
        ("NVIDIA B200", 2.25e15, "bf16"),
        ("NVIDIA GB200", 2.5e15, "bf16"),
        ("NVIDIA GH200 480GB", 989.5e12, "bf16"),
        ("NVIDIA A100-SXM4-80GB", 312e12, "bf16"),
        ("NVIDIA A100-SXM4-40GB", 312e12, "bf16"),
        ("NVIDIA A100-PCIE-40GB", 312e12, "bf16"),
        ("NVIDIA A100 80GB PCIe", 312e12, "bf16"),
        ("NVIDIA L40S", 362.05e12, "bf16"),
        ("NVIDIA L4", 121e12, "bf16"),
        ("NVIDIA A10", 125e12, "bf16"),
        ("Tesla V100-SXM2-32GB", 125e12, "fp16"),
        ("Tesla V100-PCIE-16GB", 112e12, "fp16"),
        ("AMD Instinct MI300X", 1307.4e12, "bf16"),
        ("Tesla T4", None, None),
        ("NVIDIA A10G", None, None),
        (None, None, None),
    ],
)
def test_peak_table(name: str | None, peak: float | None, dtype: str | None) -> None:
    """Every GPU fleets run today, each with its precision and datasheet; "l4" is not "l40s", "a10" not "a100"."""
    assert peak_flops(name) == peak
    entry = peak_of(name)
    assert (entry.dtype if entry else None) == dtype
    assert (
        entry is None
        or "datasheet" in entry.source
        or "specifications" in entry.source
        or "data sheet" in entry.source
    )


def incident(
    conn: psycopg.Connection,
    kind: str,
    start_s: float,
    end_s: float | None,
    evidence: dict,
    node_name: str | None = None,
    gpu: int | None = None,
    run_id: str = "r",
) -> None:
    conn.execute(
        'INSERT INTO incidents (kind, scope_key, run_id, node, gpu, state, start, "end", last_seen, evidence) '
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            kind,
            f"{kind}:{run_id}:{node_name}:{gpu}:{start_s}",
            run_id,
            node_name,
            gpu,
            "open" if end_s is None else "resolved",
            at(start_s),
            None if end_s is None else at(end_s),
            at(end_s or start_s),
            json.dumps(evidence),
        ),
    )


def progress(conn: psycopg.Connection, s: float, tokens: float | None, samples: float | None = None) -> None:
    conn.execute(
        "INSERT INTO run_progress (run_id, time, tokens, samples) VALUES ('r', %s, %s, %s)",
        (at(s), tokens, samples),
    )


def test_tokens_mfu_and_goodput(conn: psycopg.Connection) -> None:
    node(conn, "n1", 8, facts=H100)
    run(conn, "r", 0, 3600, {"n1": range(8)}, params=7_000_000_000)
    gpu_samples(conn, constant_power("n1", range(8), 700.0, 0, 3600))
    progress(conn, 1800, 1e8, 5e4)
    progress(conn, 3600, 2e8, 1e5)
    incident(conn, "starvation", 600, 1200, {"gpu_time_lost_share": 0.5, "duty_cycle": 0.1})
    incident(conn, "checkpoint_stall", 3000, None, {"run_time_lost_share": 0.25})  # open: to the end
    incident(conn, "starvation", 100, 200, {}, node_name="n1", gpu=3)  # no evidence: all of it, one GPU
    incident(conn, "throttling", 0, 3600, {}, node_name="n1", gpu=0)  # not lost time
    e = run_accounting(conn, "r", now=at(9999), source="raw")["efficiency"]
    kwh = 8 * 700 * 3600 / KWH
    assert e["tokens"] == 2e8 and e["samples"] == 1e5 and approx(e["tokens_per_s"], 2e8 / 3600)
    assert approx(e["tokens_per_kwh"], 2e8 / kwh) and approx(e["tokens_per_joule"], 2e8 / (kwh * KWH))
    assert approx(e["samples_per_kwh"], 1e5 / kwh)
    assert e["gpu_model"] == "NVIDIA H100 80GB HBM3" and e["peak_flops"] == 8 * 989.5e12
    assert e["peak_dtype"] == "bf16" and "H100" in e["peak_sources"][0]
    assert approx(e["mfu"], 6 * 7e9 * (2e8 / 3600) / (8 * 989.5e12)) and e["mfu_problem"] is None
    lost = 600 * 0.5 * 8 + 600 * 0.25 * 8 + 100
    assert approx(e["lost_gpu_hours"], lost / 3600) and approx(e["goodput"], 1 - lost / (8 * 3600))


def test_clipped_progress_and_fallbacks(conn: psycopg.Connection) -> None:
    node(conn, "n1", 2, facts={"gpu_model": "NVIDIA A100-SXM4-80GB"})
    run(conn, "r", 0, 3600, {"n1": [0, 1]}, params=1_000_000)
    progress(conn, 1800, 1e8)
    progress(conn, 3600, 3e8)
    incident(conn, "starvation", 0, 3600, {"duty_cycle": 0.75})  # lost = 1 - duty
    a = run_accounting(conn, "r", now=at(9999), since=at(1800), source="raw")
    e = a["efficiency"]
    assert e["tokens"] == 2e8 and approx(e["tokens_per_s"], 2e8 / 1800)
    assert approx(e["mfu"], 6 * 1e6 * (2e8 / 1800) / (2 * 312e12))
    assert approx(e["goodput"], 0.75) and e["tokens_per_kwh"] is None  # no energy measured


def test_unknown_model_or_override(conn: psycopg.Connection) -> None:
    node(conn, "n1", 1, facts={"gpus": [{"gpu": 0, "name": "Tesla T4"}]})
    node(conn, "n2", 1, facts={"gpus": [{"gpu": 0, "name": "Tesla T4"}], "bf16_dense_peak_flops": 65e12})
    run(conn, "r", 0, 3600, {"n1": [0]}, params=1000)
    progress(conn, 3600, 3.6e6)
    e = run_accounting(conn, "r", now=at(9999), source="raw")["efficiency"]
    assert e["gpu_model"] == "Tesla T4" and e["mfu"] is None
    conn.execute("UPDATE run_allocations SET node = 'n2'")
    e = run_accounting(conn, "r", now=at(9999), source="raw")["efficiency"]
    assert approx(e["mfu"], 6 * 1000 * 1000 / 65e12)


def test_final_report_after_the_end_counts(conn: psycopg.Connection) -> None:
    run(conn, "r", 0, 3600, {"n1": [0]})
    progress(conn, 3590, 1e6)
    progress(conn, 3610, 2e6)  # the job's last report lands after the scheduler's end
    assert run_accounting(conn, "r", now=at(9999), source="raw")["efficiency"]["tokens"] == 2e6
    assert (
        run_accounting(conn, "r", now=at(9999), source="raw", until=at(3600))["efficiency"]["tokens"] == 1e6
    )


def test_an_mfu_above_one_is_not_reported_as_mfu_but_said_why(conn: psycopg.Connection) -> None:
    """The issue's MFU of 13.41: a run whose params or token count are wrong (tokens counted per rank, say)
    gets no MFU, and the reason names what to check."""
    node(conn, "n1", 8, facts=H100)
    run(conn, "r", 0, 3600, {"n1": range(8)}, params=70_000_000_000)
    progress(conn, 3600, 2.5e10)  # 6.9 M tokens/s on 8 H100s: 13 times what they can compute
    e = run_accounting(conn, "r", now=at(9999), source="raw")["efficiency"]
    assert e["mfu"] is None and e["mfu_unchecked"] > 1
    assert approx(e["mfu_unchecked"], 6 * 7e10 * (2.5e10 / 3600) / (8 * 989.5e12))
    problem = e["mfu_problem"]
    assert f"MFU {e['mfu_unchecked']:.2f} is above 1" in problem
    for what in ("params (70,000,000,000)", "tokens", "NVIDIA H100 80GB HBM3: 989.5 TFLOP/s bf16"):
        assert what in problem, (what, problem)
