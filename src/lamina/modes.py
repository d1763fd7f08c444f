"""Model-wide helpers every layer may import (torch only).

``eval_mode(module)``: eval mode for a ``with`` block, the module's own mode restored after. It
replaces the save-mode / ``eval()`` / ``try`` / ``train(was)`` pattern wherever a model is
probed, evaluated or asked to generate. Anything that is not an ``nn.Module`` (a plain function
under test) passes through untouched.

``non_finite(module) -> name | None``: the first parameter or buffer holding NaN or infinity
(read by its min and max, which propagate NaN: no tensor-sized temporary, where ``isfinite``
made one of ~1.7x the tensor's bytes, e.g. ~190 MiB for a 135M model's fp32 token table).
``check_finite(module, where)``: a ``LaminaError`` in one line naming ``where`` and that tensor
(``lamina eval`` / ``lamina sample`` refuse such a model; training never saves one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from lamina.errors import LaminaError

__all__ = ["check_finite", "eval_mode", "non_finite"]


@contextlib.contextmanager
def eval_mode(module: object) -> Iterator[None]:
    """Put ``module`` (and its children) in eval mode; restore each one's mode on exit."""
    if not isinstance(module, nn.Module):
        yield
        return
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, was_training in modes:
            m.training = was_training


def non_finite(module: nn.Module) -> str | None:
    """The name of the first floating parameter or buffer with a NaN or infinite value."""
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t.is_floating_point() and t.device.type != "meta":
                local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor shard
                if local.numel() and not _finite(local):
                    return name
    return None


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of a non-empty floating tensor is finite: its min and max are (NaN
    propagates through both, an infinity is one of them)."""
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


DIVERGED = "it was saved after training diverged: retrain with a lower --lr"


def check_finite(module: nn.Module, where: str, advice: str = DIVERGED) -> None:
    """Refuse a model whose weights hold NaN or infinity, naming `where` and the tensor;
    `advice` is the likely cause and what the user can do (the default suits a run that
    diverged; a downloaded file is damaged or was written from a diverged model)."""
    name = non_finite(module)
    if name is not None:
        raise LaminaError(
            f"{where}: the model's weights are not finite (NaN or infinity in {name}), so it "
            f"cannot be used; {advice}"
        )
