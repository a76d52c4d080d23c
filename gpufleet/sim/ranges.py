"""Parameter ranges and the seeded random streams that resolve them.

Faults and workloads are described by ranges (``[low, high]``) rather than
constants, so that each seed yields a different but reproducible fleet and
detectors cannot fit one hard-wired number.  Every consumer draws from its
own named stream, so adding a draw in one place never shifts the values
drawn anywhere else.
"""

from __future__ import annotations

import zlib
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BeforeValidator


def _to_pair(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError("expected a number or a [low, high] pair, got a boolean")
    if isinstance(v, int | float):
        return (float(v), float(v))
    if isinstance(v, list | tuple):
        if len(v) != 2:
            raise ValueError(f"expected a number or a [low, high] pair, got {len(v)} items")
        return tuple(v)
    raise ValueError(f"expected a number or a [low, high] pair, got {type(v).__name__}")


def _ordered(v: tuple[float, float]) -> tuple[float, float]:
    if v[0] > v[1]:
        raise ValueError(f"range low {v[0]} is above high {v[1]}")
    return v


#: A scalar parameter given either as one number or as ``[low, high]``.
Range = Annotated[tuple[float, float], BeforeValidator(_to_pair), AfterValidator(_ordered)]


def stream(seed: int, *names: object) -> np.random.Generator:
    """An independent generator for ``names`` under ``seed``.

    Names are hashed with CRC32 (stable across processes, unlike ``hash``).
    """
    keys = [int(seed) & 0xFFFFFFFF] + [zlib.crc32(str(n).encode()) for n in names]
    return np.random.default_rng(np.random.SeedSequence(keys))


def draw(rng: np.random.Generator, r: tuple[float, float]) -> float:
    """A uniform value in the closed range ``r``."""
    lo, hi = r
    return lo if lo == hi else float(rng.uniform(lo, hi))


def draw_int(rng: np.random.Generator, r: tuple[float, float]) -> int:
    """A uniform integer in ``[round(low), round(high)]``."""
    lo, hi = round(r[0]), round(r[1])
    return lo if lo >= hi else int(rng.integers(lo, hi + 1))
