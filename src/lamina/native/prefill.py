"""A prompt's causal attention in lamina.native (decode.c lm_prefill_attention), for a prefill.

    causal_attention(q, k, v, scale) -> (B, T, H hd), or None where it does not run

lamina.attention calls it in place of torch's SDPA for the inference case only: float32 CPU
tensors recording no gradient, a causal mask and nothing else (no padding, no window that hides
a key, no dropout), queries the last T of the Tk positions (a prompt, or a prompt's next part
after a cache's first). Everything else, and every shape the kernel does not take (heads not a
multiple of 8 wide or wider than 256, a group of more than 48 query heads per key/value head),
returns None and runs SDPA, as does a machine where native does not run or whose kernel policy
is a PyTorch one (`LAMINA_KERNEL=torch`: lamina.cpu.native_step), and a graph that
torch.compile traces (a call through ctypes would break it).

The kernel blocks over keys with the softmax online, each key/value head's keys read once for
its group of query heads (GQA), on torch's threads; its result is SDPA's to float rounding
(tests/test_native_prefill.py). It writes the layer's (B, T, H hd) rows directly, which saves
the transpose SDPA's (B, H, T, hd) output needs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lamina.cpu import native_step
from lamina.native.build import library


def _takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel may run on these tensors: float32 CPU, no gradient to record, rows of
    hd contiguous floats, the shapes it takes (the rest decode.c checks again)."""
    if any(
        t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(-1) != 1 for t in (q, k, v)
    ):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return False
    B, H, T, hd = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    return (
        tuple(v.shape) == tuple(k.shape)
        and k.shape[0] == B
        and k.shape[3] == hd
        and hd % 8 == 0
        and hd <= 256
        and H % Hkv == 0
        and H // Hkv <= 48
        and 1 <= T <= Tk
    )


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor | None:
    """softmax(scale q k^T, causal) v for q (B, H, T, hd) and k, v (B, H_kv, Tk, hd), query i
    seeing keys 0 .. i + Tk - T, as (B, T, H hd); None where the native kernel does not run
    (see the module docstring), so that the caller runs SDPA."""
    if torch.compiler.is_compiling() or not _takes(q, k, v) or not native_step():
        return None
    lib = library()
    if lib is None:
        return None
    B, H, T, hd = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.empty(B, T, H * hd, dtype=torch.float32)
    strides = torch.tensor([*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]], dtype=torch.int64)
    ok = lib.lm_prefill_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        B, H, Hkv, T, Tk, hd, float(scale), strides.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out if ok else None
