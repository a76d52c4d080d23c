"""Board power of GPU models, for telemetry that reports no power limit.

An ``nvidia-smi --query-gpu=power.draw,utilization.gpu`` loop, and many
Prometheus exports of it, carry no enforced power limit.  Without one, power
cannot say whether a GPU at 100 % GPU-Util computes or merely spins in a
collective, so the detectors take the limit from the model's default board
power here (vendor datasheets, default TGP/TDP of the board), keyed on the
product name NVML reports (``nvmlDeviceGetName``: "NVIDIA H100 80GB HBM3",
"NVIDIA A100-SXM4-80GB", "Tesla T4").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: (words that must all appear in the lower-cased name, default board power W).
#: First match wins, so a more specific form comes before a general one.
BOARD_POWER_W: tuple[tuple[tuple[str, ...], float], ...] = (
    (("gb200",), 1200.0),
    (("b200",), 1000.0),
    (("gh200",), 900.0),
    (("h200", "nvl"), 600.0),
    (("h200",), 700.0),
    (("h100", "nvl"), 400.0),
    (("h100", "pcie"), 350.0),
    (("h100",), 700.0),  # SXM5: "NVIDIA H100 80GB HBM3"
    (("h800", "pcie"), 350.0),
    (("h800",), 700.0),
    (("a100", "pcie", "40gb"), 250.0),
    (("a100", "pcie"), 300.0),
    (("a100",), 400.0),  # SXM4
    (("a800",), 400.0),
    (("l40s",), 350.0),
    (("l40",), 300.0),
    (("l4",), 72.0),
    (("a40",), 300.0),
    (("a30",), 165.0),
    (("a10g",), 300.0),
    (("a10",), 150.0),
    (("v100", "pcie"), 250.0),
    (("v100",), 300.0),
    (("t4",), 70.0),
    # Workstation and consumer boards that small jobs train on (vendor default board power).
    (("rtx", "a6000"), 300.0),
    (("rtx", "a5000"), 230.0),
    (("rtx", "a4000"), 140.0),
    (("4090",), 450.0),
    (("3090", "ti"), 450.0),
    (("3090",), 350.0),
    (("3080", "ti"), 350.0),
    (("3080",), 320.0),
    (("3070", "ti"), 290.0),
    (("3070",), 220.0),
)


def board_power_w(name: str | None) -> float | None:
    """Default board power of a GPU model name, or None when unknown."""
    if not isinstance(name, str) or not name:
        return None
    low = name.lower()
    for words, watts in BOARD_POWER_W:
        if all(has_model_word(low, w) for w in words):
            return watts
    return None


def has_model_word(name: str, word: str) -> bool:
    """``word`` appears in ``name`` not followed by more of a model number
    ("l4" is not "l40s", "a10" is not "a100")."""
    start = 0
    while (i := name.find(word, start)) >= 0:
        j = i + len(word)
        if j >= len(name) or not name[j].isalnum() or (name[j].isalpha() and word[-1].isalpha()):
            return True
        start = i + 1
    return False


def gpu_model_names(facts: Mapping[str, Any] | None) -> dict[int, str]:
    """Product name of each GPU index a node's facts name (``gpus[].name``),
    with the node-wide ``gpu_model`` for the rest.  Malformed facts give
    nothing rather than an error: they are one node's, and must not stop a
    sweep of the fleet."""
    out: dict[int, str] = {}
    if not isinstance(facts, Mapping):
        return out
    gpus = facts.get("gpus")
    if isinstance(gpus, list):
        for entry in gpus:
            if not isinstance(entry, Mapping):
                continue
            idx, name = entry.get("gpu", entry.get("index")), entry.get("name")
            if isinstance(idx, int) and not isinstance(idx, bool) and isinstance(name, str) and name:
                out[idx] = name
    model = facts.get("gpu_model")
    if isinstance(model, str) and model:
        out.setdefault(-1, model)
    return out
