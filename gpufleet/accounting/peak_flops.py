"""Peak dense tensor FLOP/s of the GPUs fleets run, with the precision and the datasheet each figure is from.

MFU divides the model FLOPs a run did (6 × params × tokens per second) by the
peak of its GPUs, so the peak must be the one the run could use: dense (without
the 2:4 sparsity vendors quote first), in the training precision, BF16, where
the GPU has it.  V100 has no BF16 tensor cores: its FP16 peak stands in, and the
entry says so.  A node fact ``bf16_dense_peak_flops`` overrides the table (a
board clocked or capped differently, a model not listed).

Names are matched as NVML and ROCm report them ("NVIDIA H100 80GB HBM3",
"NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-16GB", "AMD Instinct MI300X"):
every word of an entry must appear, not followed by more of a model number
("a10" is not "a100", "l4" is not "l40s"); the first matching entry wins, so
the specific forms (NVL, PCIe, the Grace superchips) come before the general.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpufleet.gpu_models import has_model_word


@dataclass(frozen=True)
class Peak:
    """One GPU model's peak: the words that name it, FLOP/s, the precision, and where the figure is from."""

    words: tuple[str, ...]
    flops: float
    dtype: str
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (BF16 Tensor Core, without sparsity)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (BF16 Tensor Core, without sparsity)"
_BLACKWELL = "NVIDIA DGX B200 / GB200 NVL72 specifications, per GPU (FP16/BF16 Tensor Core, without sparsity)"

#: First match wins: specific forms before general ones.
PEAKS: tuple[Peak, ...] = (
    Peak(("gb200",), 2.5e15, "bf16", _BLACKWELL),
    Peak(("b200",), 2.25e15, "bf16", _BLACKWELL),
    Peak(
        ("gh200",), 989.5e12, "bf16", "NVIDIA GH200 Grace Hopper Superchip datasheet (BF16, without sparsity)"
    ),
    Peak(("h200", "nvl"), 835.5e12, "bf16", _H200 + ", NVL"),
    Peak(("h200",), 989.5e12, "bf16", _H200 + ", SXM"),
    Peak(("h100", "nvl"), 835.5e12, "bf16", _H100 + ", H100 NVL"),
    Peak(("h100", "pcie"), 756.5e12, "bf16", _H100 + ", H100 PCIe"),
    Peak(("h100",), 989.5e12, "bf16", _H100 + ", H100 SXM5"),
    Peak(("h800", "pcie"), 756.5e12, "bf16", "NVIDIA H800 PCIe datasheet (BF16, without sparsity)"),
    Peak(("h800",), 989.5e12, "bf16", "NVIDIA H800 SXM5 datasheet (BF16, without sparsity)"),
    Peak(
        ("a100",),
        312e12,
        "bf16",
        "NVIDIA A100 Tensor Core GPU datasheet: 40 GB and 80 GB, SXM4 and PCIe alike "
        "(BF16 Tensor Core, without sparsity)",
    ),
    Peak(("a800",), 312e12, "bf16", "NVIDIA A800 datasheet (BF16 Tensor Core, without sparsity)"),
    Peak(("l40s",), 362.05e12, "bf16", "NVIDIA L40S datasheet (BF16 Tensor Core, without sparsity)"),
    Peak(("l40",), 181.05e12, "bf16", "NVIDIA L40 datasheet (BF16 Tensor Core, without sparsity)"),
    Peak(
        ("l4",),
        121e12,
        "bf16",
        "NVIDIA L4 datasheet (BF16 Tensor Core 242 TFLOPS with sparsity: half without)",
    ),
    Peak(("a30",), 165e12, "bf16", "NVIDIA A30 datasheet (BF16 Tensor Core, without sparsity)"),
    Peak(("a10",), 125e12, "bf16", "NVIDIA A10 datasheet (BF16 Tensor Core, without sparsity)"),
    Peak(("v100", "pcie"), 112e12, "fp16", "NVIDIA V100 datasheet, PCIe (no BF16: FP16 Tensor Core)"),
    Peak(("v100",), 125e12, "fp16", "NVIDIA V100 datasheet, SXM2 (no BF16: FP16 Tensor Core)"),
    Peak(("mi300x",), 1307.4e12, "bf16", "AMD Instinct MI300X data sheet (peak BF16, without sparsity)"),
)


@cache
def peak_of(model: str | None) -> Peak | None:
    """The table's entry for a GPU model name, or None when it is not in it (cached: a page of 100 runs
    asks for each of their 2,500 GPUs, of a handful of models)."""
    if not model:
        return None
    name = model.lower()
    for p in PEAKS:
        if all(has_model_word(name, w) for w in p.words):
            return p
    return None
