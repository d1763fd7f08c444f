"""What every check shares: probing a module in eval mode with a fixed seed, and shape checks.

``probing(module, seed)`` puts a module in eval mode with gradients off and a forked, seeded RNG
for a ``with`` block and restores everything afterwards; ``first(out)`` takes the tensor of an
``(out, weights)`` pair; ``expect_shape`` raises ``CheckFailed`` naming both shapes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from lamina.errors import CheckFailed
from lamina.modes import eval_mode


@contextlib.contextmanager
def probing(module: nn.Module | Callable, seed: int = 0) -> Iterator[None]:
    """Eval mode, no gradients, a fixed seed; the module's mode is restored afterwards."""
    with eval_mode(module), torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def first(out: Tensor | tuple) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def expect_shape(name: str, got: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(got.shape) != tuple(expected):
        raise CheckFailed(f"{name}: expected shape {tuple(expected)}, got {tuple(got.shape)}")
