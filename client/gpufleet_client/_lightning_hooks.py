"""The Lightning callback's hooks, apart from Lightning's base class (which needs torch to import)."""

from __future__ import annotations

from typing import Any

from gpufleet_client._progress import StepReporter, TokenCounter
from gpufleet_client.reporter import ProgressReporter


class LightningHooks:
    """The hooks, independent of Lightning's base class."""

    def __init__(
        self,
        run_id: str | None = None,
        *,
        tokens_per_step: float | None = None,
        count_tokens: TokenCounter | None = None,
        reporter: ProgressReporter | None = None,
    ) -> None:
        super().__init__()
        self._progress = StepReporter(run_id, reporter, tokens_per_step, count_tokens)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._progress.batch(batch, int(getattr(trainer, "world_size", 1) or 1))
        self._progress.step(int(trainer.global_step), bool(trainer.is_global_zero))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._progress.end(bool(trainer.is_global_zero))
