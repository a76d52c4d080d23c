"""What both callbacks share: counting tokens and reporting them with the step, from rank 0 only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet_client.reporter import ProgressReporter, default_reporter

#: Counts the tokens of one training batch on this process.
TokenCounter = Callable[[Any], float | None]


def count_tokens(batch: Any) -> float | None:
    """Tokens in a language-model batch: ``attention_mask`` ones where there is a mask, else the
    elements of ``input_ids``; None when the batch has neither (then nothing is counted)."""
    if isinstance(batch, dict):
        mask = batch.get("attention_mask")
        if mask is not None and hasattr(mask, "sum"):
            return float(mask.sum())
        ids = batch.get("input_ids")
        if ids is not None:
            numel = getattr(ids, "numel", None)
            if callable(numel):
                return float(numel())
            size = getattr(ids, "size", None)
            if isinstance(size, int):
                return float(size)
    return None


class StepReporter:
    """Cumulative tokens and steps of one run, reported through a :class:`ProgressReporter`.

    ``tokens_per_step``: tokens one optimizer step consumes over all data-parallel
    ranks (a fixed global batch of fixed-length sequences); else ``count_tokens``
    counts each batch on this process, times the world size (data-parallel
    ranks see equal shares).
    """

    def __init__(
        self,
        run_id: str | None,
        reporter: ProgressReporter | None,
        tokens_per_step: float | None,
        count: TokenCounter | None,
    ) -> None:
        self.run_id = run_id
        self.reporter = reporter
        self.tokens_per_step = tokens_per_step
        self.count = count if count is not None else count_tokens
        self.tokens = 0.0
        self.counted = False

    @property
    def out(self) -> ProgressReporter:
        return self.reporter if self.reporter is not None else default_reporter()

    def batch(self, batch: Any, world_size: int) -> None:
        if self.tokens_per_step is not None:
            return
        n = self.count(batch)
        if n is not None:
            self.tokens += n * max(world_size, 1)
            self.counted = True

    def step(self, global_step: int, is_zero: bool, tokens_seen: float | None = None) -> None:
        if not is_zero or global_step <= 0:
            return
        if tokens_seen:
            tokens: float | None = tokens_seen
        elif self.tokens_per_step is not None:
            tokens = self.tokens_per_step * global_step
        else:
            tokens = self.tokens if self.counted else None
        self.out.report(self.run_id, tokens=tokens, steps=float(global_step))

    def end(self, is_zero: bool) -> None:
        if is_zero:
            self.out.flush()
