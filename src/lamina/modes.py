"""``eval_mode(module)``: eval mode for a ``with`` block, the module's own mode restored after.

A leaf every layer may import (torch only). It replaces the save-mode / ``eval()`` / ``try`` /
``train(was)`` pattern wherever a model is probed, evaluated or asked to generate. Anything that
is not an ``nn.Module`` (a plain function under test) passes through untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["eval_mode"]


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
