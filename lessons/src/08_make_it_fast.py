# %% [markdown]
# # Lesson 8: make it fast
#
# To write one token, a model reads every one of its weights once, and does only two
# floating-point operations (a multiply and an add) per weight read. A CPU can do far more
# arithmetic than that in the time its memory delivers the bytes: decoding is limited by
# **memory bandwidth**, so the way to make it fast is to read fewer bytes. You will:
#
# 1. write a **Q4_0 block quantizer**: 32 weights in 18 bytes, 4.5 bits a weight instead of 32,
#    in exactly the layout GGUF files (llama.cpp's format) hold;
# 2. write its **dot product**, which multiplies the quantized rows by a vector block by block,
#    without ever making the float weights;
# 3. write a **KV cache step**: one new token's attention over preallocated caches, with
#    grouped-query attention.
#
# Each is checked against lamina's own kernels and against `gguf.quants`, the reference
# implementation that ships with llama.cpp.

# %%
import math
import os
import time

import gguf
import torch

import lamina.cpu as cpu
from lamina import checks
from lamina.quant import Int4Linear
from lamina.quant.ggml import blocks_to_int4, dequantize_rows

torch.manual_seed(0)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: small sizes

# %% [markdown]
# ## 1. Bytes per token
#
# SmolLM2-135M, the model of lesson 7, has about 135 million weights. Per token, a decoder
# reads all of them (the token table only for one row, but a tied head reads it whole):

# %%
n_weights = 134.5e6
for name, bits in (("float32", 32), ("bfloat16", 16), ("Q8_0", 8.5), ("Q4_0", 4.5)):
    mb = n_weights * bits / 8 / 1e6
    print(f"{name:9} {bits:5.1f} bits a weight: {mb:6.0f} MB per token, "
          f"{20e3 / mb:5.0f} tokens/s at 20 GB/s")  # fmt: skip

# %% [markdown]
# At a laptop's 20 GB/s, float32 caps decoding at 37 tokens a second and Q4_0 at 260.
#
# ## 2. A Q4_0 block quantizer
#
# Q4_0 cuts each weight row into **blocks of 32**. A block stores one scale `d` and 32 codes
# `q` of 4 bits (0 to 15), and means the weights `w = (q - 8) * d`: the codes stand for the
# integers -8 .. 7 times `d`. GGML picks `d` so that the weight of largest magnitude, `m`
# (with its sign), gets the code 0:
#
# `d = m / -8`,   `q = min(15, trunc(w * (1 / d) + 8.5))`
#
# `trunc(... + 8.5)` rounds `w / d + 8` to the nearest code; a code of 16 (a weight of the
# opposite sign to `m` and nearly as large) is kept at 15. An all-zero block has `d = 0`, and
# GGML takes `1 / d` as 0 there, so every code is 8. To match GGML bit for bit, compute in
# float32 and in this order: `inv = 1 / d`, then `w * inv + 8.5`.
#
# The bytes of a block, 18 in all:
#
# * bytes 0-1: `d` as a float16 (`d.half().view(torch.uint8)` gives its two bytes);
# * bytes 2-17: the codes, two per byte: byte `2 + i` holds weight `i`'s code in its **low**
#   4 bits and weight `i + 16`'s in its **high** 4 bits (`q[i] | q[i + 16] << 4`).
#
# A row of `K` weights becomes `K / 32` blocks side by side, `K / 32 * 18` bytes.
#
# **TODO:** write `quantize_q4_0(w)`: float32 `(N, K)` in, uint8 `(N, K // 32 * 18)` out.


# %%
def quantize_q4_0(w):
    # BEGIN SOLUTION: quantize_q4_0
    n, k = w.shape
    blocks = w.float().reshape(n, k // 32, 32)
    at = blocks.abs().argmax(-1, keepdim=True)
    m = blocks.gather(-1, at)  # (n, k / 32, 1): the weight of largest magnitude, sign kept
    d = m / -8
    inv = torch.where(d == 0, 0.0, 1 / d)
    q = (blocks * inv + 8.5).trunc().clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # (n, k / 32, 16)
    scale = d.half().view(torch.uint8)  # (n, k / 32, 2)
    return torch.cat([scale, packed], -1).reshape(n, -1)
    # END SOLUTION


w = torch.randn(2, 64)
print(quantize_q4_0(w).shape)

# %% [markdown]
# ### Self-check 1
#
# The check quantizes a few rows whose blocks have very different sizes (and one all-zero
# block) with yours and with `gguf.quants.quantize(w, GGMLQuantizationType.Q4_0)`, and compares
# the bytes; then it reads your blocks back with lamina's own dequantizer.

# %%
checks.report("Q4_0 quantizer", checks.check_q4_0_quantize, quantize_q4_0)

# %% [markdown]
# Look at one block, and read it back through lamina's dequantizer (`dequantize_rows`, the
# one a GGUF file's Q4_0 tensors go through), and through gguf's:

# %%
w = torch.randn(1, 32)
rows = quantize_q4_0(w)
block = rows[0, :18]
d = block[:2].view(torch.float16).item()
codes = torch.cat([block[2:] & 15, block[2:] >> 4]).tolist()
print(f"d = {d:.4f}, codes = {codes}")
back = dequantize_rows(rows, "Q4_0", 32)
theirs = gguf.quants.dequantize(rows.numpy(), gguf.GGMLQuantizationType.Q4_0)
print("lamina reads what gguf reads:", torch.equal(back, torch.from_numpy(theirs)))
print(f"largest error {float((back - w).abs().max()):.4f} (at most |d| = {abs(d):.4f})")

# %% [markdown]
# ## 3. The dot product, block by block
#
# A linear layer at decode time is `y = W x` for one vector `x`. With `W` in Q4_0 blocks,
# row `r`'s value is
#
# `y[r] = sum over blocks b of  d[r, b] * sum over i < 32 of (q[r, b, i] - 8) * x[32 b + i]`
#
# The scale comes **out** of the inner sum: one multiply per 32 weights, and the inner sum is
# over small integers. That is what lets a kernel run the inner sum in integer arithmetic:
# lamina's kernel (`lamina.native`) quantizes `x` to int16 per block of 32 too, multiplies
# codes and inputs with AVX2's integer multiply-add (16 pairs at a time), and applies both
# scales once per block; llama.cpp does the same with int8. It never makes the float `W`.
#
# **TODO:** write `q4_0_matvec(rows, x)`: the uint8 rows `(N, K // 32 * 18)` of section 2 and
# a float32 `x` `(K,)` in, float32 `y` `(N,)` out, block by block as above (plain PyTorch:
# unpack the codes and scales, don't dequantize a float `W` first).


# %%
def q4_0_matvec(rows, x):
    # BEGIN SOLUTION: q4_0_matvec
    n = rows.shape[0]
    blocks = rows.reshape(n, -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16).float()[..., 0]  # (n, k / 32)
    qs = blocks[..., 2:]
    q = torch.cat([qs & 15, qs >> 4], -1).float() - 8  # (n, k / 32, 32), in weight order
    per_block = (q * x.reshape(-1, 32)).sum(-1)  # (n, k / 32): the integer part, times x
    return (per_block * d).sum(-1)
    # END SOLUTION


rows, x = quantize_q4_0(torch.randn(3, 64)), torch.randn(64)
print(q4_0_matvec(rows, x))

# %% [markdown]
# ### Self-check 2
#
# The check multiplies Q4_0 rows made by `gguf.quants` by a vector with yours, and compares
# with the dequantized rows times the vector (within 1e-4 of the largest `|y|`), and with
# lamina's own kernel on the same blocks: the `Int4Linear` that a GGUF file's Q4_0 rows become
# when lamina opens it, run by `lamina.native` where it is built (within 2e-3, since it also
# quantizes `x`).

# %%
checks.report("Q4_0 dot product", checks.check_q4_0_matvec, q4_0_matvec)

# %% [markdown]
# ### Measured
#
# One 4096 x 4096 matrix, the size of a 1B-class model's attention projection (FAST:
# smaller), three ways: float32 `W @ x`, your `q4_0_matvec` (PyTorch, unpacking every call),
# and lamina's kernel on the same blocks (`lamina.native` where it runs here). The bytes each
# one reads are printed beside it: the float32 matrix (67 MB) is far larger than the CPU's
# caches, so every call streams it from memory.

# %%
n, k = (256, 256) if FAST else (4096, 4096)
W = torch.randn(n, k) * 0.02
rows = quantize_q4_0(W)
layer = Int4Linear(k, n, False, 32)
layer.qweight, layer.scales_and_zeros = blocks_to_int4(rows.numpy(), "Q4_0", (n, k))
kernel = "native" if cpu.native_missing() is None else "auto"
x = torch.randn(k)


def best_of(fn, repeats):
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


with torch.no_grad(), cpu.using(kernel):
    layer.prepare()
    for name, nbytes, fn, repeats in (
        ("float32 W @ x", W.numel() * 4, lambda: W @ x, 20),
        ("your q4_0_matvec", rows.numel(), lambda: q4_0_matvec(rows, x), 3),
        (f"lamina ({kernel})", rows.numel(), lambda: layer(x[None]), 20),
    ):
        print(f"{name:17} {nbytes / 1e6:6.2f} MB  {best_of(fn, repeats) * 1e3:8.2f} ms")
    print("lamina's kernel vs yours, largest difference:",
          f"{float((layer(x[None])[0] - q4_0_matvec(rows, x)).abs().max()):.2g}")  # fmt: skip

# %% [markdown]
# Yours reads the same 4.5 bits a weight but writes float copies of every block as it goes
# (the unpacked codes, their products with `x`), so it is far slower than float32; the kernel
# keeps the codes in registers and beats float32, though by less than the ratio of the bytes
# (7x): unpacking nibbles and quantizing `x` cost instructions too, and a core or two cannot
# always keep memory busy. Reading fewer bytes pays only when nothing bigger is made from them.
#
# ## 4. A KV cache step
#
# Lesson 5 generated with lamina's caches. Here is the step inside: each attention layer keeps
# two preallocated buffers, `k_cache` and `v_cache`, of shape `(B, H_kv, max_len, head_dim)`.
# At step `pos`, slots `0 .. pos - 1` hold the earlier tokens' keys and values (already
# rotated by their positions, in a Llama), and the rest hold whatever was there before. One
# step:
#
# 1. writes the new token's key and value into slot `pos`;
# 2. attends: `softmax(q @ K.T / sqrt(head_dim)) @ V` over slots `0 .. pos` only. A single new
#    query may see every key written so far, itself included: slicing the cache to `pos + 1`
#    slots **is** the causal mask;
# 3. with **grouped-query attention** (lesson 6), `H` query heads share `H_kv` key/value heads:
#    query head `h` reads key/value head `h // (H / H_kv)` (`repeat_interleave` on the head
#    dimension).
#
# Nothing is appended or reallocated: the buffers are written in place, so a step costs the
# same at every position, apart from attention's reading of `pos + 1` cached keys.
#
# **TODO:** write `cache_step(k_cache, v_cache, pos, q, k, v)`: `q` `(B, H, 1, head_dim)`, `k`
# and `v` `(B, H_kv, 1, head_dim)`; write `k` and `v` into the caches at slot `pos` and return
# the attention output `(B, H, 1, head_dim)`.


# %%
def cache_step(k_cache, v_cache, pos, q, k, v):
    # BEGIN SOLUTION: cache_step
    k_cache[:, :, pos] = k[:, :, 0]
    v_cache[:, :, pos] = v[:, :, 0]
    keys, values = k_cache[:, :, : pos + 1], v_cache[:, :, : pos + 1]  # (B, H_kv, pos + 1, hd)
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)  # (B, H, pos + 1, hd)
    values = values.repeat_interleave(group, dim=1)
    scores = (q @ keys.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, 1, pos + 1)
    return torch.softmax(scores, dim=-1) @ values
    # END SOLUTION


k_cache, v_cache = torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 16)
q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
print(cache_step(k_cache, v_cache, 0, q, k, v).shape)

# %% [markdown]
# ### Self-check 3
#
# The check takes one of lamina's attention layers (4 query heads, 2 key/value heads), runs a
# sequence through it whole (with the causal mask) and token by token with lamina's `KVCache`,
# then token by token with your step on caches whose unwritten slots hold junk. Your outputs,
# through the layer's output projection, must equal the whole-sequence ones, and your caches
# must end up holding what lamina's holds.

# %%
checks.report("KV cache step", checks.check_cache_step, cache_step)

# %% [markdown]
# Grouped-query attention is about this cache: its size per token is
# `2 x layers x H_kv x head_dim` numbers. For SmolLM2-135M (30 layers, 9 query heads, 3
# key/value heads of 64):

# %%
layers, heads, kv_heads, head_dim, tokens = 30, 9, 3, 64, 2048
for name, h in (("9 k/v heads (no GQA)", heads), ("3 k/v heads (GQA)", kv_heads)):
    per_token = 2 * layers * h * head_dim * 4  # float32
    print(f"{name:21} {per_token / 1e3:6.1f} KB per token, "
          f"{per_token * tokens / 1e6:5.0f} MB for {tokens} tokens")  # fmt: skip

# %% [markdown]
# A step reads the whole cache once, so at long contexts the cache, not the weights, is what
# costs: GQA reads a third of it here.
#
# ## What lamina does with these
#
# * `lamina.open(model.gguf)` keeps a file's quantized blocks as they are, on a CPU where a
#   quantized kernel runs (Q4_0 and Q4_1 as lamina's int4, the K-quants and Q8_0 as GGML's own
#   blocks), so a model costs about its file size in memory;
# * `lamina.native` runs a whole decode step in one C call: every layer's quantized dot
#   products as in section 3, and the cache step of section 4, for one or many sequences;
# * `lamina chat model.gguf` uses both by default; `bench/real_decode.py` compares it with
#   llama.cpp on the same file.
