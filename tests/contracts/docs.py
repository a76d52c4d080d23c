"""docs/contracts.md read as data: its sections, tables and backquoted lists, so the tests pin what it says.

A test that compares the code with a list it keeps itself only proves the two lists agree; reading the
published text makes a change to either the code or the document that breaks an outside reader fail.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


@cache
def text() -> str:
    return CONTRACTS.read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The text under a ``## ``/``### `` heading that starts with ``heading``, up to the next heading of its level
    or above."""
    lines = text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#{2,4}) (.*)", line)
        if m and m.group(2).startswith(heading):
            level = len(m.group(1))
            out = []
            for nxt in lines[i + 1 :]:
                n = re.match(r"(#{2,4}) ", nxt)
                if n and len(n.group(1)) <= level:
                    break
                out.append(nxt)
            return "\n".join(out)
    raise AssertionError(f"docs/contracts.md has no section {heading!r}")


def table(body: str, after: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the first Markdown table after the line that
    contains ``after``."""
    lines = body.splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    rows: list[list[str]] = []
    started = False
    for ln in lines[start + 1 :]:
        if ln.startswith("|"):
            started = True
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif started:
            break
    return rows[1:]


def names(cell: str) -> list[str]:
    """Names in a cell: ``a, b, c``, backquoted or not (``time, node, gpu``; ``cpu_user_pct, ...``)."""
    return [n.strip(" `") for n in re.split(r",\s*", cell.split("(")[0]) if n.strip(" `")]


def backquoted_list(body: str, after: str) -> list[str]:
    """The comma-separated names of the first backquoted span (which may wrap lines) after ``after``."""
    flat = " ".join(body.split())
    i = flat.index(" ".join(after.split())) + len(" ".join(after.split()))
    m = re.search(r"`([^`]+)`", flat[i:])
    assert m, after
    return [n.strip() for n in re.split(r",\s*", " ".join(m.group(1).split())) if n.strip()]
