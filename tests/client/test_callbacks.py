"""The training-framework callbacks: Hugging Face's real TrainerCallback machinery (transformers runs
its callbacks without torch), and Lightning's hooks by their documented signatures (Lightning needs
torch, whose wheels with their CUDA dependencies are too large to install here)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest
from gpufleet_client import ProgressReporter


class Recorder(ProgressReporter):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "t", start=False)
        self.calls: list[tuple[str | None, dict[str, Any]]] = []
        self.flushed = 0

    def report(self, run_id: str | None = None, **counts: Any) -> None:
        self.calls.append((run_id, counts))

    def flush(self) -> bool:
        self.flushed += 1
        return True


def test_hugging_face_trainer_callback_through_the_real_callback_handler() -> None:
    from gpufleet_client.huggingface import GpufleetTrainerCallback
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    rec = Recorder()
    cb = GpufleetTrainerCallback("llm-7b", tokens_per_step=4096, reporter=rec)
    handler = CallbackHandler([DefaultFlowCallback, cb], None, None, None, None)
    args = TrainingArguments(output_dir="/nonexistent", report_to=[])
    state, control = TrainerState(), TrainerControl()
    for step in (1, 2, 3):
        state.global_step = step
        handler.on_step_end(args, state, control)
    # The Trainer's own token count wins where it keeps one.
    state.global_step, state.num_input_tokens_seen = 4, 20_000
    handler.on_step_end(args, state, control)
    handler.on_train_end(args, state, control)
    assert rec.calls == [
        ("llm-7b", {"tokens": 4096.0, "steps": 1.0}),
        ("llm-7b", {"tokens": 8192.0, "steps": 2.0}),
        ("llm-7b", {"tokens": 12288.0, "steps": 3.0}),
        ("llm-7b", {"tokens": 20000.0, "steps": 4.0}),
    ]
    assert rec.flushed == 1
    # Other processes of a distributed run stay quiet.
    state.is_world_process_zero = False
    handler.on_step_end(args, state, control)
    assert len(rec.calls) == 4


class Trainer:
    """What the hooks read of ``lightning.pytorch.Trainer`` (2.x): ``global_step``, ``is_global_zero``,
    ``world_size``."""

    def __init__(self, world_size: int = 1, rank: int = 0) -> None:
        self.global_step = 0
        self.world_size = world_size
        self.is_global_zero = rank == 0


def test_lightning_hooks_with_lightnings_signatures() -> None:
    from gpufleet_client._lightning_hooks import LightningHooks

    class Mask:
        def __init__(self, n: int) -> None:
            self.n = n

        def sum(self) -> int:
            return self.n

    rec = Recorder()
    hooks = LightningHooks("run-9", reporter=rec)
    trainer = Trainer(world_size=4)
    for step in (1, 2):
        trainer.global_step = step
        # on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        hooks.on_train_batch_end(trainer, None, {"loss": 0.1}, {"attention_mask": Mask(1000)}, step - 1)
    hooks.on_train_end(trainer, None)
    assert rec.calls == [
        ("run-9", {"tokens": 4000.0, "steps": 1.0}),
        ("run-9", {"tokens": 8000.0, "steps": 2.0}),
    ]
    assert rec.flushed == 1
    # A fixed global batch; and rank 1 never reports.
    fixed = LightningHooks(reporter=rec, tokens_per_step=512)
    t1 = Trainer(world_size=2, rank=1)
    t1.global_step = 5
    fixed.on_train_batch_end(t1, None, None, object(), 0)
    assert len(rec.calls) == 2
    t0 = Trainer(world_size=2)
    t0.global_step = 5
    fixed.on_train_batch_end(t0, None, None, object(), 0)
    assert rec.calls[-1] == (None, {"tokens": 2560.0, "steps": 5.0})


def test_the_lightning_callback_subclasses_lightnings_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.modules.pop("gpufleet_client.lightning", None)
    for name in (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.callbacks",
        "pytorch_lightning",
        "pytorch_lightning.callbacks",
    ):
        monkeypatch.setitem(sys.modules, name, None)  # neither installed
    with pytest.raises(ImportError, match="pip install lightning"):
        importlib.import_module("gpufleet_client.lightning")
    # Where Lightning is installed, the class is a Lightning Callback (the Trainer checks that).
    base = type("Callback", (), {})
    mod = types.ModuleType("lightning.pytorch.callbacks")
    mod.Callback = base  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", mod)
    sys.modules.pop("gpufleet_client.lightning", None)
    lmod = importlib.import_module("gpufleet_client.lightning")
    assert issubclass(lmod.GpufleetCallback, base)
    assert isinstance(lmod.GpufleetCallback(tokens_per_step=1), base)
    sys.modules.pop("gpufleet_client.lightning", None)
