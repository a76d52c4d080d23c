"""The collector and API processes settle Python's garbage collector once built."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.collector import cyclegc

PROBE = """
import gc, json, sys
import gpufleet.cli  # tens of thousands of objects for settle to freeze, as a built app has
from gpufleet.collector import cyclegc
before = gc.get_threshold()
gc.collect()
tracked = len(gc.get_objects())
cyclegc.settle(int(sys.argv[1]))
left = len(gc.get_objects())
class Cycle:
    pass
a, b = Cycle(), Cycle()
a.b, b.a = b, a
del a, b
found = gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "tracked": tracked, "left": left,
                  "frozen": gc.get_freeze_count(), "found_later_cycle": found}))
"""


def probe(threshold: int) -> dict[str, Any]:
    # A process of its own: settling changes the whole interpreter, which a test run must not.
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(threshold)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_settle_freezes_start_up_and_raises_the_young_threshold() -> None:
    got = probe(10_000)
    assert got["after"] == [10_000, got["before"][1], got["before"][2]]
    # Everything imported and built so far is out of later collections...
    assert got["tracked"] > 10_000 and got["frozen"] >= got["tracked"] - 100
    assert got["left"] < 100
    # ...while what is made afterwards is still collected.
    assert got["found_later_cycle"] >= 2


def test_zero_leaves_python_as_it_was() -> None:
    got = probe(0)
    assert got["after"] == got["before"] and got["frozen"] == 0 and got["left"] >= got["tracked"] - 100


@pytest.mark.parametrize("command", ["collector", "api"])
def test_the_server_commands_settle_with_the_setting_before_they_serve(
    command: str, monkeypatch: pytest.MonkeyPatch, db: str
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(cyclegc, "settle", lambda n: calls.append(("settle", n)))
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append(("serve", None)))
    monkeypatch.setenv("GPUFLEET_GC_YOUNG_THRESHOLD", "1234")
    r = CliRunner().invoke(app, [command, "--db", db, "--port", "0"])
    assert r.exit_code == 0, r.output
    assert [c[0] for c in calls] == ["settle", "serve"]
    assert calls[0] == ("settle", 1234)


def test_a_negative_threshold_is_refused_by_name(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("served with a bad setting"))
    monkeypatch.setenv("GPUFLEET_GC_YOUNG_THRESHOLD", "-1")
    r = CliRunner().invoke(app, ["collector", "--db", db, "--port", "0"])
    assert r.exit_code != 0
    assert "gc_young_threshold" in r.output
