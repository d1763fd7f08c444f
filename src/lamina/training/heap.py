"""The train command's hold on the C heap: glibc hands freed pages back during a step.

    lean_heap(model, every=TRIM_EVERY, libc=None) -> context manager (yields whether it
        applies)   while inside, malloc_trim(0) runs after every `every`-th block forward of
        `model` made with gradients on (a training forward, not an evaluation); the hooks are
        removed on exit. Where the C library is not glibc (macOS, musl, Windows) it does
        nothing. `lamina train` wraps its loop in it on a CPU, unless --no-heap-trim.
    (glibc() is lamina.libc's: the process's C library when it is glibc, else None)

Why (BENCHMARKS.md, "QLoRA's memory, the heap"): torch's CPU tensors come from malloc. Inside
one training step of an int4 base (1 x 256, --activation-checkpointing) the live tensors made
by the step peak at ~56 MiB, but the heap grows by ~250 MiB, and at the peak ~236 MiB of it is
free chunks between live ones (fragmentation), still resident: no threshold returns the middle of
a heap, only malloc_trim does. Trimming at a few points of the forward keeps those pages out of
the peak. Nothing here runs at import or touches the environment; it sets no malloc option, so
a caller's process (`main([...])`) is left as it was once the command returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lamina.libc import glibc

TRIM_EVERY = 5  # blocks between trims (SmolLM2's 30 blocks: 6 per step)


@contextlib.contextmanager
def lean_heap(model: nn.Module, every: int = TRIM_EVERY, libc: Any = None) -> Iterator[bool]:
    """malloc_trim(0) after every `every`-th training forward of a block of `model` while
    inside (see the module docstring); yields False, doing nothing, off glibc."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    libc = libc if libc is not None else glibc()
    blocks = list(getattr(model, "blocks", ()))
    if libc is None or not blocks:
        yield False
        return
    count = 0

    def after_block(module: nn.Module, args: Any, out: Any) -> None:
        nonlocal count
        if torch.is_grad_enabled():
            count += 1
            if count % every == 0:
                libc.malloc_trim(0)

    handles = [b.register_forward_hook(after_block) for b in blocks]
    try:
        yield True
    finally:
        for h in handles:
            h.remove()
