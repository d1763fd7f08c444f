"""Native (C, AVX2) kernels for decoding at batch 1; see step.py and decode.c.

    native_step(model, caches) -> NativeStep | None     the whole decode step in one call
    available() -> bool; reason() -> why not             built and loadable here
    with disabled(): ...                                 PyTorch runs every step inside

Deliberately optional: where it cannot be built (no compiler, no AVX2, `LAMINA_NATIVE=0`)
everything runs in PyTorch as before.
"""

from __future__ import annotations

from lamina.native.build import library, reason
from lamina.native.step import NativeStep, disabled, native_step, unsupported, usable


def available() -> bool:
    """Whether the native library is built and loaded on this machine."""
    return library() is not None


__all__ = ["NativeStep", "available", "disabled", "native_step", "reason", "unsupported", "usable"]
