"""``gpufleet agent`` in a process of its own, with side files a kill -9 test reads back.

Run as ``python -m testsupport.agentproc PRODUCED ACKED <gpufleet arguments>``
(:class:`testsupport.procs.AgentProc` does).  The agent is the production
one, built and run by the ``gpufleet agent`` command; only its spool is
watched, from outside the agent's code:

* PRODUCED gets one JSON line per tick record, ``{"t": time, "n": samples}``,
  written just *before* the record is appended to the spool.  What the agent
  produced is then known exactly, whatever the kill cut: a record listed here
  but absent from the database is what a kill cost (at most the one being
  written), not a tick the loop skipped or never reached.
* ACKED gets the oracle's line for every batch the collector acknowledged
  (:meth:`testsupport.oracle.Oracle.watch`), read back with
  :meth:`~testsupport.oracle.Oracle.load`.

Both are single ``O_APPEND`` writes, so a killed process leaves whole lines
or a cut last one, which the readers skip.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gpufleet.agent.main as agent_main
from gpufleet import cli
from gpufleet.agent.batch import record_samples
from gpufleet.agent.runtime import Agent
from gpufleet.config import Settings
from testsupport.oracle import Oracle, append_line


def watch(a: Agent, produced: Path, acked: Path) -> None:
    """Log every record ``a`` spools to ``produced`` and every acknowledged batch to ``acked``."""
    Oracle().watch(a.spool, acked)
    append = a.spool.append

    def logged_append(record: dict[str, Any]) -> bool:
        append_line(produced, {"t": record["t"], "n": record_samples(record)})
        return append(record)

    a.spool.append = logged_append  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    produced, acked, rest = Path(argv[0]), Path(argv[1]), argv[2:]
    build = agent_main.build_agent

    def build_watched(settings: Settings, **kw: Any) -> Agent:
        a = build(settings, **kw)
        watch(a, produced, acked)
        return a

    agent_main.build_agent = build_watched
    sys.argv = ["gpufleet", *rest]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
