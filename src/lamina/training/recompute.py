"""--activation-checkpointing: each block's activations recomputed in the backward, not kept.

    checkpoint_blocks(model) -> model   every block of `model.blocks` runs under
        torch.utils.checkpoint while gradients are on (non-reentrant, the RNG state preserved,
        so dropout draws the same masks again and the gradients are the ones without it); in
        eval or under no_grad a block runs as before. The model's modules and state keys are
        unchanged (the block's own forward is wrapped in place), so checkpoints, LoRA adapters
        and resumes do not see it.

What it buys and costs (bench/finetune.py, "checkpointing"): a block keeps only its input for
the backward, so activation memory grows with one block's, not the depth's; each step runs
each block's forward twice.

Deliberately unaware of optimizers, objectives and the loop.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _wrap(block: nn.Module) -> None:
    plain = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and block.training:
            return checkpoint(plain, *args, use_reentrant=False, **kwargs)
        return plain(*args, **kwargs)

    block.forward = forward


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Recompute each block's activations in the backward (see the module docstring)."""
    for block in getattr(model, "blocks", ()):
        if not getattr(block, "_recomputes", False):
            _wrap(block)
            block._recomputes = True
    return model
