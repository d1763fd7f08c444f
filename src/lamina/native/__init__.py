"""Native (C, AVX2) kernels for decoding at batch 1; see step.py (the calls), coverage.py
(which models), structs.py (the C structs) and decode.c; prefill.py is a prompt's causal
attention (lamina.attention calls it in place of SDPA where it runs). runtime.py decodes a
plain Llama GGUF file with decode.c alone, no torch imported (gguf_model.py lays the file's
blocks out in the structs; gguf_read.py and ggml_blocks.py are the torch-free GGUF reading and
Q4_x/Q8_0 conversions both paths use).

    native_step(model, caches) -> NativeStep | None     the whole decode step in one call
    available() -> bool; reason() -> why not             built and loadable here
    unsupported(model) -> why this model is not covered; usable(model) -> may it run now

Deliberately optional: where it cannot be built (no compiler, no AVX2) or lamina.cpu's policy
says otherwise (`LAMINA_KERNEL=torch`, `with lamina.cpu.using("torch"):`), everything runs in
PyTorch as before. The engine's names load on first use, so that lamina.cpu can ask
lamina.native.build (a leaf) without importing the models.
"""

from __future__ import annotations

from typing import Any

import lamina.native.build as build

_STEP = ("NativeStep", "native_step")
_COVERAGE = ("unsupported", "usable")


def available() -> bool:
    """Whether the native library is built and loaded on this machine (lamina.cpu's
    `native_missing` says why not)."""
    from lamina.cpu import native_missing

    return native_missing() is None


def reason() -> str | None:
    """Why the native library does not run here (None when it does)."""
    from lamina.cpu import native_missing

    return native_missing()


def __getattr__(name: str) -> Any:
    if name in _STEP:
        from lamina.native import step

        return getattr(step, name)
    if name in _COVERAGE:
        from lamina.native import coverage

        return getattr(coverage, name)
    raise AttributeError(f"module 'lamina.native' has no attribute {name!r}")


__all__ = ["NativeStep", "available", "build", "native_step", "reason", "unsupported", "usable"]
