"""Checks of the pieces a learner writes to make decoding fast (lesson 8).

    check_q4_0_quantize(fn)    fn(w float32 (N, K)) -> uint8 (N, K // 32 * 18): GGML's Q4_0
        blocks, byte for byte those of gguf.quants.quantize(w, Q4_0), which lamina's own
        dequantizer (quant.ggml.dequantize_rows) reads back to within one step |d| of w
    check_q4_0_matvec(fn)      fn(rows uint8 (N, K // 32 * 18), x float32 (K,)) -> y (N,): the
        Q4_0 rows times x, within 1e-4 (of max |y|) of dequantize-then-matmul (gguf.quants'
        values) and within 2e-3 of lamina's own kernel on the same blocks (an Int4Linear, run
        by lamina.native where it is built: it also quantizes x, to int16 per block)
    check_cache_step(fn)       fn(k_cache, v_cache, pos, q, k, v) -> (B, H, 1, hd): one decode
        step of grouped-query attention over preallocated caches; stepped through a sequence it
        equals lamina's MultiHeadAttention over the whole sequence (causal) and over its
        KVCache, and leaves the caches holding what lamina's KVCache holds

A Q4_0 block is 32 weights in 18 bytes: d as float16 (2 bytes, little-endian), then 16 bytes
whose low nibbles are the codes of weights 0..15 and whose high nibbles those of 16..31;
w = (q - 8) d, with d = m / -8 for m the block's weight of largest magnitude (its sign kept).
Like learners.py, each check raises CheckFailed with what is wrong and a guess at the mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

import lamina.cpu as cpu
from lamina.attention import KVCache, MultiHeadAttention
from lamina.checks.base import expect_shape
from lamina.errors import CheckFailed
from lamina.quant.ggml import blocks_to_int4, dequantize_rows
from lamina.quant.linear import Int4Linear

GROUP, BLOCK_BYTES = 32, 18  # Q4_0: weights per block, bytes per block
MATVEC_TOL = 1e-4  # of max |y|: against dequantize-then-matmul (summation order only)
KERNEL_TOL = 2e-3  # of max |y|: against lamina's kernel (which quantizes x to int16 per block)


def _gguf_q4_0(w: np.ndarray) -> np.ndarray:
    import gguf  # lamina's dependency, imported where used (as lamina.quant.kquant does)

    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)


def _gguf_dequantize(rows: np.ndarray) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType.Q4_0)


def _weights(n: int, k: int, seed: int) -> Tensor:
    """(n, k) float32 whose blocks of 32 have very different sizes, block 1 of row 0 all zero."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randn(n, k // GROUP, GROUP, generator=g)
    blocks *= 10 ** (torch.rand(n, k // GROUP, 1, generator=g) * 3 - 2)  # 0.01 .. 10
    blocks[0, 1] = 0
    return blocks.reshape(n, k)


def _tensor(x: Any, what: str, dtype: torch.dtype) -> Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, Tensor):
        raise CheckFailed(f"{what} must be a tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise CheckFailed(f"{what} must be {str(dtype).replace('torch.', '')}, got {x.dtype}")
    return x.detach()


def _unpack(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_0 rows (N, nb * 18) -> d float32 (N, nb), the packed bytes (N, nb, 16), and the codes
    uint8 (N, nb, 32) in weight order (GGML's: low nibbles first, then the high ones)."""
    b = rows.reshape(rows.shape[0], -1, BLOCK_BYTES)
    d = b[..., :2].contiguous().view(torch.float16).float()[..., 0]
    qs = b[..., 2:]
    return d, qs, torch.cat([qs & 15, qs >> 4], -1)


def _pack_neighbours(codes: Tensor) -> Tensor:
    """Codes packed as lamina's own int4 does: weights 2i and 2i + 1 in byte i."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


# -- part 1: the quantizer --------------------------------------------------------------------


def _scale_problem(got: Tensor, want: Tensor, blocks: Tensor) -> str | None:
    bad = ~((got == want) | (got.isnan() & want.isnan()))
    if not bool(bad.any()):
        return None
    r, b = (int(i) for i in bad.nonzero()[0])
    g, e = float(got[r, b]), float(want[r, b])
    where = f"row {r}, block {b}: d = {g:.6g}, GGML's is {e:.6g}"
    amax = float(blocks[r, b].abs().max())
    if e != 0 and math.isclose(g, -e, rel_tol=1e-3):
        return (
            f"{where}: the sign is wrong. d = m / -8, m the weight of largest magnitude with its "
            "sign, so that m gets the code 0 (m = (0 - 8) d)"
        )
    for div in (7.0, 7.5, 8.0, 15.0):
        if amax and math.isclose(abs(g), amax / div, rel_tol=1e-3):
            return (
                f"{where}: d is max|w| / {div:g}; GGML's Q4_0 takes d = m / -8 (m the weight of "
                "largest magnitude, sign kept): m gets the code 0 and the 16 codes cover -8 d .. 7 d"
            )
    if g != g:
        return f"{where}: d is NaN. Is this block all zeros? Then d = 0"
    return (
        f"{where}. d = m / -8 (m the weight of largest magnitude, sign kept), stored as float16 "
        "in the block's first 2 bytes: d.half().view(torch.uint8)"
    )


def _code_problem(
    got_qs: Tensor, got: Tensor, want_qs: Tensor, want: Tensor, blocks: Tensor, d: Tensor
) -> str | None:
    if torch.equal(got, want):
        return None
    if torch.equal(got_qs, (want_qs >> 4) | (want_qs << 4)):
        return (
            "the nibbles are swapped: byte i holds weight i in its low 4 bits and weight i + 16 "
            "in its high 4 bits"
        )
    if torch.equal(got_qs, _pack_neighbours(want)):
        return (
            "you packed neighbours (weights 2i and 2i + 1) into byte i, as lamina's own int4 "
            "does; GGML's Q4_0 puts weight i in the low nibble of byte i and weight i + 16 in "
            "its high nibble"
        )
    wrong = (got != want).any(-1)  # (N, nb) blocks with a wrong code
    if bool((wrong <= (d == 0)).all()):  # only all-zero blocks are wrong
        r, b = (int(i) for i in wrong.nonzero()[0])
        return (
            f"row {r}, block {b} is all zeros, so d = 0: take 1 / d as 0 there (every code 8), "
            f"not inf or NaN; yours are {got[r, b, :4].tolist()}..."
        )
    mean = float(got.float().mean())
    if abs(mean - 8) > 2:
        return (
            f"the codes average {mean:.1f} but should centre on 8: q = w / d + 8, so that "
            "w = (q - 8) d. Did you leave out the + 8?"
        )
    diff = got.to(torch.int16) - want.to(torch.int16)
    off = diff[diff != 0]
    n = int(off.numel())
    if bool((off == -1).all()):
        return (
            f"{n} codes are one less than GGML's: round to the nearest code, "
            "trunc(w * (1 / d) + 8.5); trunc(w / d + 8) rounds down"
        )
    if bool((off == 1).all()):
        exact = blocks.double() / d.double()[..., None] + 8.5
        near = (exact - exact.round()).abs() < 1e-4
        if bool(near[diff != 0].all()):
            return (
                f"{n} codes sit at a rounding tie and come out one more than GGML's: compute "
                "w * (1 / d) + 8.5 in float32 and truncate, in that order, as GGML does"
            )
        return f"{n} codes are one more than GGML's: round with trunc(w * (1 / d) + 8.5)"
    r, b, i = (int(j) for j in (diff != 0).nonzero()[0])
    return (
        f"row {r}, block {b}, weight {i}: code {int(got[r, b, i])}, GGML's is "
        f"{int(want[r, b, i])} ({n} codes differ). q = trunc(w * (1 / d) + 8.5), at most 15"
    )


def check_q4_0_quantize(fn: Callable[[Tensor], Any], n: int = 4, k: int = 256) -> None:
    """fn(w (N, K) float32) -> the Q4_0 bytes (N, K // 32 * 18) uint8 of gguf.quants, which
    lamina's dequantizer reads back to within |d| of w in every block."""
    w = _weights(n, k, seed=0)
    want = torch.from_numpy(_gguf_q4_0(w.numpy()))
    got = _tensor(fn(w.clone()), "the quantized rows", torch.uint8)
    if tuple(got.shape) != tuple(want.shape):
        raise CheckFailed(
            f"{n} rows of {k} weights should give uint8 ({n}, {k // GROUP * BLOCK_BYTES}): "
            f"{k // GROUP} blocks of 18 bytes per row (2 bytes of float16 d, then 16 bytes of "
            f"codes, two per byte), got {tuple(got.shape)}"
        )
    d_got, qs_got, q_got = _unpack(got)
    d_want, qs_want, q_want = _unpack(want)
    blocks = w.reshape(n, -1, GROUP)
    problem = _scale_problem(d_got, d_want, blocks) or _code_problem(
        qs_got, q_got, qs_want, q_want, blocks, d_want
    )
    if problem:
        raise CheckFailed(problem)
    if not torch.equal(got, want):  # the same values, other bytes (a float16 zero's sign)
        at = int((got != want).flatten().nonzero()[0])
        raise CheckFailed(
            f"byte {at % got.shape[1]} of row {at // got.shape[1]} is {int(got.flatten()[at])}, "
            f"gguf's is {int(want.flatten()[at])}"
        )
    back = dequantize_rows(got, "Q4_0", k)  # lamina's reading, equal to GGML's own
    if not torch.equal(back, torch.from_numpy(_gguf_dequantize(want.numpy()))):
        raise CheckFailed("lamina's Q4_0 dequantizer disagrees with gguf.quants (a lamina bug)")
    err = (back - w).reshape(n, -1, GROUP).abs().amax(-1)
    if bool((err > d_want.abs() * 1.001 + 1e-7).any()):
        raise CheckFailed("a block reads back further than one step |d| from its weights")


# -- part 2: the block dot product ------------------------------------------------------------


def _lamina_matvec(rows: Tensor, x: Tensor, k: int) -> tuple[Tensor, str]:
    """lamina's own kernel on these blocks: the Int4Linear a Q4_0 file's rows become."""
    n = rows.shape[0]
    layer = Int4Linear(k, n, False, GROUP)
    layer.qweight, layer.scales_and_zeros = blocks_to_int4(rows.numpy(), "Q4_0", (n, k))
    kernel = "native" if cpu.native_missing() is None else "dequantize"
    with cpu.using(kernel), torch.no_grad():
        return layer.prepare()(x[None])[0], kernel


def _matvec_hint(got: Tensor, rows: Tensor, x: Tensor, scale: float) -> str:
    d, qs, codes = _unpack(rows)
    xb = x.reshape(-1, GROUP)

    def y(c: Tensor, dd: Tensor | None, offset: float = 8.0) -> Tensor:
        per = ((c.float() - offset) * xb).sum(-1)  # (N, nb)
        return (per if dd is None else per * dd).sum(-1)

    swapped, paired = torch.cat([qs >> 4, qs & 15], -1), torch.stack([qs & 15, qs >> 4], -1)
    for variant, words in (
        (y(codes, None), "you left out the block scales: each block's sum of (q - 8) x is "
         "multiplied by that block's own d"),
        (y(codes, d[:, :1]), "every block used the first block's d: each block of 32 has its "
         "own d, in its own first 2 bytes"),
        (y(codes, d, 0.0), "the codes are stored with + 8: multiply (q - 8), not q, by x"),
        (y(swapped, d), "the nibbles are swapped: the low 4 bits of byte i are weight i, the "
         "high 4 bits weight i + 16"),
        (y(paired.flatten(-2), d), "byte i holds weights i (low nibble) and i + 16 (high "
         "nibble), not the neighbours 2i and 2i + 1"),
    ):  # fmt: skip
        if float((got - variant).abs().max()) <= MATVEC_TOL * max(scale, 1e-30):
            return words
    return (
        "y[r] = sum over blocks b of d[r, b] * sum over i of (q[r, b, i] - 8) * x[32 b + i], "
        "with q[r, b, i] the low nibble of byte i (i < 16) or the high nibble of byte i - 16"
    )


def check_q4_0_matvec(fn: Callable[[Tensor, Tensor], Any], n: int = 8, k: int = 256) -> None:
    """fn(rows (N, K // 32 * 18) uint8, x (K,) float32) -> y (N,) float32: the rows' Q4_0
    weights times x, as dequantize-then-matmul and lamina's kernel compute it."""
    w = _weights(n, k, seed=1)
    rows = torch.from_numpy(_gguf_q4_0(w.numpy()))
    x = torch.randn(k, generator=torch.Generator().manual_seed(2))
    dense = torch.from_numpy(_gguf_dequantize(rows.numpy()))
    want = (dense.double() @ x.double()).float()
    scale = float(want.abs().max())
    ours, kernel = _lamina_matvec(rows, x, k)
    if float((ours - want).abs().max()) > KERNEL_TOL * scale:
        raise CheckFailed(f"lamina's {kernel} kernel disagrees with gguf.quants (a lamina bug)")
    got = _tensor(fn(rows.clone(), x.clone()), "y", torch.float32)
    expect_shape("y (one value per row)", got, (n,))
    err = float((got - want).abs().max())
    if not err <= MATVEC_TOL * scale:  # NaN fails too
        raise CheckFailed(
            f"y differs from the dequantized rows times x by up to {err:.3g} "
            f"({err / scale:.2g} of max |y|, allowed {MATVEC_TOL:g}): "
            f"{_matvec_hint(got, rows, x, scale)}"
        )
    err = float((got - ours).abs().max())
    if err > KERNEL_TOL * scale:
        raise CheckFailed(
            f"y differs from lamina's {kernel} kernel by {err / scale:.2g} of max |y| "
            f"(allowed {KERNEL_TOL:g})"
        )


# -- part 3: a decode step over a KV cache ----------------------------------------------------


def _attend(q: Tensor, keys: Tensor, values: Tensor, heads: Tensor, scale: float) -> Tensor:
    k, v = keys[:, heads], values[:, heads]  # (B, H, S, hd): each query head's k/v head
    return torch.softmax((q @ k.transpose(-2, -1)) * scale, -1) @ v


def _step_hint(out: Tensor, q: Tensor, kc: Tensor, vc: Tensor, pos: int, n_kv: int) -> str:
    h, hd = q.shape[1], q.shape[-1]
    right, tiled = torch.arange(h) // (h // n_kv), torch.arange(h) % n_kv
    scale = 1 / math.sqrt(hd)
    for variant, words in (
        (_attend(q, kc, vc, right, scale), "you attend to every slot of the cache, also those "
         "not written yet: the query sees slots 0..pos only, k_cache[:, :, : pos + 1]"),
        (_attend(q, kc[:, :, :pos], vc[:, :, :pos], right, scale), "you attend to slots "
         "0..pos-1: the new token sees its own key too, k_cache[:, :, : pos + 1]"),
        (_attend(q, kc[:, :, : pos + 1], vc[:, :, : pos + 1], tiled, scale), "query head h "
         f"reads key/value head h // {h // n_kv} (repeat_interleave), not h % {n_kv} (repeat)"),
        (_attend(q, kc[:, :, : pos + 1], vc[:, :, : pos + 1], right, 1.0), "scale the scores "
         "by 1 / sqrt(head_dim) before the softmax"),
    ):  # fmt: skip
        if out.shape == variant.shape and torch.allclose(out, variant, atol=1e-5, equal_nan=True):
            return words
    return (
        "out = softmax(q @ K.T / sqrt(head_dim)) @ V over slots 0..pos, each query head h with "
        f"key/value head h // {h // n_kv}"
    )


def _written(cache: Tensor, before: Tensor, new: Tensor, pos: int, what: str) -> None:
    """The step wrote `new` (B, H_kv, 1, hd) at slot pos and changed nothing else."""
    if torch.equal(cache[:, :, pos], new[:, :, 0]):
        changed = (cache != before).any(-1).any(1).any(0)  # (max_len,) slots written
        changed[pos] = False
        if bool(changed.any()):
            raise CheckFailed(
                f"step pos={pos} also changed {what}_cache slot {int(changed.nonzero()[0])}: "
                "a step writes slot pos only"
            )
        return
    for s in range(cache.shape[2]):
        if torch.equal(cache[:, :, s], new[:, :, 0]):
            raise CheckFailed(
                f"step pos={pos} wrote the new {what} at slot {s}: slots 0..pos-1 hold the "
                f"earlier tokens, the new one goes to slot pos ({what}_cache[:, :, pos])"
            )
    raise CheckFailed(
        f"step pos={pos} did not write the new {what} into the cache: "
        f"{what}_cache[:, :, pos] = {what}[:, :, 0] (write into the tensor passed in)"
    )


def check_cache_step(
    fn: Callable[..., Any], d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2
) -> None:
    """fn(k_cache, v_cache, pos, q, k, v): caches (B, H_kv, max_len, hd) with slots 0..pos-1
    filled, q (B, H, 1, hd), k and v (B, H_kv, 1, hd); writes k and v at slot pos and returns
    (B, H, 1, hd), q's attention over slots 0..pos (query head h reads k/v head
    h // (H / H_kv)). Stepped over a sequence it equals lamina's attention on the whole."""
    b, t, hd = 2, 6, d_model // n_heads
    max_len = t + 3
    with torch.random.fork_rng():
        torch.manual_seed(0)
        attn = MultiHeadAttention(
            d_model, n_heads, n_kv_heads=n_kv_heads, causal=True, qkv_bias=False, bias=False
        ).eval()
        x = torch.randn(b, t, d_model)
        k_cache = torch.randn(b, n_kv_heads, max_len, hd) * 3  # unwritten slots hold junk
        v_cache = torch.randn(b, n_kv_heads, max_len, hd) * 3
    with torch.no_grad():
        full = attn(x)[0]
        cache = KVCache(b, n_kv_heads, max_len, hd)
        stepped = torch.cat([attn(x[:, i : i + 1], cache=cache)[0] for i in range(t)], 1)
        if not torch.allclose(stepped, full, atol=1e-5):
            raise CheckFailed("lamina's attention with its KVCache disagrees with the full pass")
        for pos in range(t):
            qkv = attn.qkv(x[:, pos : pos + 1])
            q, k, v = qkv.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd], -1)
            q = q.view(b, 1, n_heads, hd).transpose(1, 2)
            k = k.view(b, 1, n_kv_heads, hd).transpose(1, 2)
            v = v.view(b, 1, n_kv_heads, hd).transpose(1, 2)
            k_before, v_before = k_cache.clone(), v_cache.clone()
            out = _tensor(fn(k_cache, v_cache, pos, q, k, v), "the step's output", torch.float32)
            expect_shape(f"the output of step pos={pos} (B, H, 1, head_dim)", out, q.shape)
            _written(k_cache, k_before, k, pos, "k")
            _written(v_cache, v_before, v, pos, "v")
            y = attn.proj(out.transpose(1, 2).reshape(b, 1, n_heads * hd))[:, 0]
            err = float((y - full[:, pos]).abs().max())
            if not err <= 1e-5 + 1e-4 * float(full[:, pos].abs().max()):
                hint = _step_hint(out, q, k_cache, v_cache, pos, n_kv_heads)
                raise CheckFailed(
                    f"step pos={pos}: after the output projection, your step differs from "
                    f"lamina's attention over the whole sequence by up to {err:.3g}: {hint}"
                )
        for mine, theirs, what in ((k_cache, cache.k, "keys"), (v_cache, cache.v, "values")):
            if not torch.equal(mine[:, :, :t], theirs[:, :, :t]):
                raise CheckFailed(
                    f"after {t} steps the cache's {what} differ from lamina's KVCache"
                )
