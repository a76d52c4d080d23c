"""What several benchmark scripts share, kept in one place so their progress reads alike."""

from __future__ import annotations


def say(msg: str) -> None:
    """A progress line, flushed at once: a long fill shows where it is even when the output is piped."""
    print(msg, flush=True)
