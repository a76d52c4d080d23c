"""A Hugging Face ``Trainer`` callback that reports steps and tokens to gpufleet.

    from gpufleet_client.huggingface import GpufleetTrainerCallback
    trainer = Trainer(..., callbacks=[GpufleetTrainerCallback()])

Tokens come from the Trainer's own count when it keeps one
(``TrainingArguments(include_num_input_tokens_seen=True)``:
``state.num_input_tokens_seen``, over all processes), else
``tokens_per_step`` × ``state.global_step``; steps are ``state.global_step``.
Only the main process (``state.is_world_process_zero``) reports, on
``on_step_end``; ``on_train_end`` sends what is pending.  It subclasses
``transformers.TrainerCallback``; importing this module without
``transformers`` raises ImportError saying so.
"""

from __future__ import annotations

from typing import Any

from gpufleet_client._progress import StepReporter
from gpufleet_client.reporter import ProgressReporter

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "gpufleet_client.huggingface needs Hugging Face transformers: pip install transformers"
    ) from None


class GpufleetTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(
        self,
        run_id: str | None = None,
        *,
        tokens_per_step: float | None = None,
        reporter: ProgressReporter | None = None,
    ) -> None:
        self._progress = StepReporter(run_id, reporter, tokens_per_step, lambda _b: None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        self._progress.step(int(state.global_step), bool(state.is_world_process_zero), float(seen) or None)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._progress.end(bool(state.is_world_process_zero))
        return control
