"""Helpers shared by the test suite and the benchmarks (real databases, no mocks).

They live beside ``tests/`` and ``bench/``, outside the installed package: a
production install never carries crashable clusters, fault proxies or a
certificate authority, nor the development packages they import.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root, where ``testsupport`` is importable from.
ROOT = Path(__file__).resolve().parents[1]


def with_root_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child run as ``python -m testsupport.<module>``, from whatever folder it starts in."""
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
