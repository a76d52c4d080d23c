"""Board power by model name, for telemetry without a power limit."""

from __future__ import annotations

import pytest

from gpufleet.gpu_models import board_power_w, gpu_model_names


@pytest.mark.parametrize(
    ("name", "watts"),
    [
        ("NVIDIA H100 80GB HBM3", 700.0),
        ("NVIDIA H100 PCIe", 350.0),
        ("NVIDIA H100 NVL", 400.0),
        ("NVIDIA H200", 700.0),
        ("NVIDIA A100-SXM4-80GB", 400.0),
        ("NVIDIA A100 80GB PCIe", 300.0),
        ("NVIDIA A100-PCIE-40GB", 250.0),
        ("NVIDIA L40S", 350.0),
        ("NVIDIA L4", 72.0),
        ("NVIDIA A10G", 300.0),
        ("Tesla T4", 70.0),
        ("NVIDIA B200", 1000.0),
        ("NVIDIA RTX 4000 SFF Ada Generation", None),
        ("", None),
        ("NVIDIA GeForce RTX 3090", 350.0),
        ("NVIDIA GeForce RTX 3090 Ti", 450.0),
        ("NVIDIA GeForce RTX 3070", 220.0),
        ("NVIDIA RTX A6000", 300.0),
        ("Tesla V100-SXM2-32GB", 300.0),
        ("NVIDIA A10", 150.0),
    ],
)
def test_board_power(name: str, watts: float | None) -> None:
    assert board_power_w(name) == watts


def test_model_names_from_facts_tolerate_malformed_facts() -> None:
    assert gpu_model_names(
        {"gpus": [{"gpu": 0, "name": "NVIDIA H200"}, "x", {"gpu": "1"}], "gpu_model": "NVIDIA H100 80GB HBM3"}
    ) == {0: "NVIDIA H200", -1: "NVIDIA H100 80GB HBM3"}
    assert gpu_model_names({"gpus": 1}) == {}
    assert gpu_model_names(None) == {}
