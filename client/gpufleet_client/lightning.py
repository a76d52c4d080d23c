"""A PyTorch Lightning callback that reports steps and tokens to gpufleet.

    from gpufleet_client.lightning import GpufleetCallback
    trainer = Trainer(callbacks=[GpufleetCallback(tokens_per_step=global_batch * seq_len)])

It subclasses Lightning's ``Callback`` (``lightning.pytorch``, else the older
``pytorch_lightning``); importing this module without either installed raises
ImportError saying so.  Hooks used, with Lightning's signatures:
``on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)`` counts
the batch and reports ``trainer.global_step`` from global rank 0
(``trainer.is_global_zero``); ``on_train_end(trainer, pl_module)`` sends what
is pending.
"""

from __future__ import annotations

from gpufleet_client._lightning_hooks import LightningHooks


def _lightning_callback() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback
        except ImportError:
            raise ImportError(
                "gpufleet_client.lightning needs PyTorch Lightning: pip install lightning "
                "(or pytorch-lightning)"
            ) from None
    return Callback  # type: ignore[no-any-return]


GpufleetCallback = type(
    "GpufleetCallback",
    (LightningHooks, _lightning_callback()),
    {
        "__doc__": "Reports steps and tokens to gpufleet from a Lightning Trainer (see the module docstring).",
        "__module__": __name__,
    },
)
