"""Every capability gpufleet.auth declares is asked for by some surface: a capability no
surface checks (as ``ingest`` once was) grants or refuses nothing, whatever the table says."""

from __future__ import annotations

import re
from pathlib import Path

from gpufleet.auth import CAPABILITIES

ROOT = Path(__file__).resolve().parents[1]
#: The ways a surface asks: Principal.require/may, the API's allowed/permit, the web's gate.
ASK = re.compile(r"\b(?:require|may|allowed|permit|gate)\((?:\w+, )?\"(\w+)\"\)")


def test_each_declared_capability_is_asked_somewhere() -> None:
    asked: set[str] = set()
    for folder in ("api", "collector", "gpufleet"):
        for path in (ROOT / folder).rglob("*.py"):
            if (ROOT / folder / path.relative_to(ROOT / folder).parts[0]).is_symlink():
                continue  # a component folder linked into gpufleet/ is read as itself
            asked.update(ASK.findall(path.read_text()))
    assert set(CAPABILITIES) <= asked, sorted(set(CAPABILITIES) - asked)
