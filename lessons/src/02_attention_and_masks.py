# %% [markdown]
# # Lesson 2: attention and masks
#
# Attention is how the vectors of a sequence exchange information. In this lesson you write:
#
# 1. the **causal mask**, which stops a token from looking at the future;
# 2. **scaled dot-product attention** with a mask;
# 3. **multi-head self-attention** with causal and padding masks, returning its weights;
#
# then you look at attention weights as a picture, and watch a small encoder learn a task that
# only attention can solve. Cells tagged `todo` raise `NotImplementedError` until you write them;
# the self-check after each runs a `lamina.checks` check on your code.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from lamina import checks
from lamina.errors import CheckFailed

torch.manual_seed(0)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: smaller runs

# %% [markdown]
# ## 1. Scaled dot-product attention
#
# Each position `i` emits a query `q_i`; each position `j` emits a key `k_j` and a value `v_j`
# (all three are linear maps of the position's vector). Position `i` scores every key by
# `q_i . k_j / sqrt(d_k)`, turns the scores into probabilities with a softmax over `j` (the
# **attention weights**, each row sums to 1), and outputs the weighted average of the values:
#
# `attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V`
#
# Dividing by `sqrt(d_k)` keeps the scores' spread near 1 whatever the width, so the softmax
# does not saturate into a one-hot choice at initialisation.
#
# ## 2. Masks
#
# A mask says which keys a query may attend to. Here, as in `F.scaled_dot_product_attention`,
# a **bool mask is True where attention is allowed**. A forbidden score is set to `-inf`
# before the softmax, so its weight is exactly 0.
#
# * **Causal**: a language model predicts token `t + 1` from tokens `0 .. t`, so query `i` may
#   only see keys `j <= i`: a lower-triangular mask.
# * **Padding**: sequences of different lengths share a batch by padding the short ones. A
#   `padding_mask` of shape `(B, T)` is True at pads; no query may attend to a pad key.
#
# **TODO:** `causal_mask(T)` returns the `(T, T)` bool mask, True where key `j <= ` query `i`.


# %%
def causal_mask(T: int) -> torch.Tensor:
    # BEGIN SOLUTION: causal_mask
    return torch.tril(torch.ones(T, T, dtype=torch.bool))
    # END SOLUTION


causal_mask(4)

# %% [markdown]
# ### Self-check 1

# %%
checks.report("causal mask", checks.check_causal_mask, causal_mask)

# %% [markdown]
# **TODO:** `attend(q, k, v, allowed)` computes masked attention for tensors shaped
# `(B, H, T, d_k)`; `allowed` broadcasts to `(B, H, T, T)` (or is None). Return the output
# `(B, H, T, d_k)` and the weights `(B, H, T, T)`.


# %%
def attend(q, k, v, allowed=None):
    # BEGIN SOLUTION: attend
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
    # END SOLUTION


q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)  # B=1, H=2, T=5, d_k=4
out, w = attend(q, k, v, causal_mask(5))
out.shape, w.shape

# %% [markdown]
# ### Self-check 2: the same numbers as PyTorch's fused kernel

# %%
expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(5))
print(
    "PASS" if torch.allclose(out, expected, atol=1e-6) else "FAIL",
    "- matches F.scaled_dot_product_attention",
)

# %% [markdown]
# ## 3. Multi-head self-attention
#
# Several heads attend in parallel, each in its own `d_k = d_model / n_heads` slice, so one
# head can track the previous token while another tracks something far away. One linear layer
# makes `q`, `k` and `v` for all heads at once (`3 * d_model` outputs); split them, reshape
# to `(B, H, T, d_k)`, attend, put the heads side by side again `(B, T, d_model)`, and mix them
# with an output projection.
#
# **TODO:** write `forward`. Combine the masks into one `allowed`: the causal mask when
# `self.causal`, and `~padding_mask` on the key axis, `padding_mask[:, None, None, :]`, when a
# padding mask is given. (A query with *no* allowed key would get a row of NaNs; lamina's own
# attention outputs zeros there. It cannot happen in this lesson.)


# %%
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, causal: bool = False):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads, self.d_k, self.causal = n_heads, d_model // n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, padding_mask=None, need_weights=False):
        B, T, d = x.shape
        # BEGIN SOLUTION: MultiHeadAttention.forward (set out (B, T, d) and weights)
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.d_k)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, d_k)
        allowed = causal_mask(T).to(x.device) if self.causal else torch.ones(T, T, dtype=torch.bool)
        allowed = allowed[None, None]  # (1, 1, T, T)
        if padding_mask is not None:
            allowed = allowed & ~padding_mask[:, None, None, :]  # (B, 1, T, T)
        out, weights = attend(q, k, v, allowed)
        out = out.transpose(1, 2).reshape(B, T, d)  # heads side by side again
        # END SOLUTION
        return self.proj(out), (weights if need_weights else None)


MultiHeadAttention(16, 4)(torch.randn(2, 6, 16))[0].shape

# %% [markdown]
# ### Self-check 3
#
# The check feeds a batch whose second sequence ends in two pads and verifies that every row
# of weights sums to 1, that pads get exactly zero weight, and (when causal) that the future
# does too.

# %%
checks.report(
    "padding mask",
    checks.check_attention_weights,
    MultiHeadAttention(16, 4),
    16,
    causal=False,
)
checks.report(
    "causal + padding masks",
    checks.check_attention_weights,
    MultiHeadAttention(16, 4, causal=True),
    16,
    causal=True,
)

# %% [markdown]
# A check is only useful if it catches the mistake. Attention built without its causal mask
# (`causal=False`) but used in a language model:

# %%
try:
    checks.check_attention_weights(MultiHeadAttention(16, 4), 16, causal=True)
except CheckFailed as exc:
    print("the check says:", exc)

# %% [markdown]
# ## 4. Attention weights as a picture
#
# Row `i` of a weight matrix is query `i`'s distribution over the keys. With a causal mask the
# upper triangle is zero; with padding, the pad columns are zero too.

# %%
attn = MultiHeadAttention(16, 2, causal=True).eval()
x = torch.randn(2, 8, 16)
pad = torch.zeros(2, 8, dtype=torch.bool)
pad[1, 5:] = True  # the second sequence has 5 tokens and 3 pads
with torch.no_grad():
    _, w = attn(x, pad, need_weights=True)  # (2, 2, 8, 8)

fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
for b, title in enumerate(("causal", "causal, last 3 keys are pads")):
    ax = axes[b]
    ax.imshow(w[b, 0], vmin=0, vmax=1, cmap="Blues")
    ax.set(title=title, xlabel="key position", ylabel="query position")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. An encoder that needs attention: first-last match
#
# The task: given a random sequence of 12 tokens, is the last token equal to the first? No
# single position can tell; the model must bring the first and last token together. An
# **encoder** (no causal mask: every position sees every other) with sinusoidal positions reads
# the sequence, and a linear classifier reads the first position's output vector.
#
# lamina's `SequenceClassifier` is such an encoder. The loop below trains it on freshly drawn
# batches (`lamina task first-last` on the command line does the same, through lamina's training
# loop: `lamina.training.loop.run_training`). Accuracy sits near chance for a
# while, then jumps once attention learns to compare the two ends. A full run (300 steps) takes
# seconds to a minute on a laptop CPU.

# %%
from lamina import EncoderConfig, SequenceClassifier
from lamina.data import first_last_batch

torch.manual_seed(7)
steps = 40 if FAST else 300
clf = SequenceClassifier(EncoderConfig(vocab_size=64, max_len=12, dropout=0.0), pooling="first")
opt = torch.optim.AdamW(clf.parameters(), lr=2e-3, weight_decay=0.01)
warmup = max(1, steps // 10)  # learning rate: linear warm-up, then linear decay
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: min((s + 1) / warmup, max(0.05, (steps - s) / (steps - warmup + 1)))
)
gen = torch.Generator().manual_seed(7)
for step in range(1, steps + 1):
    ids, labels = first_last_batch(64, 12, 64, generator=gen)  # (64, 12), (64,)
    loss = F.cross_entropy(clf(ids), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 50 == 0 or step == steps:
        print(f"step {step:3d}  loss {loss.item():.3f}")

clf.eval()
ids, labels = first_last_batch(1024, 12, 64, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    acc = (clf(ids).argmax(-1) == labels).float().mean().item()
print(f"held-out accuracy {acc:.1%} (chance is 50%)")

# %% [markdown]
# Where does the first position look? Below, each row is one layer, each column one head; the
# top row of each picture is query 0, the position the classifier reads. After training, some
# head in the last layer puts most of query 0's weight on the last key, where the answer is.

# %%
example = ids[labels == 1][:1]  # one sequence whose first and last tokens match
with torch.no_grad():
    _, maps = clf.encoder(example, return_weights=True)  # per layer: (1, H, 12, 12)
fig, axes = plt.subplots(len(maps), maps[0].shape[1], figsize=(10, 5), squeeze=False)
for layer, w in enumerate(maps):
    for head in range(w.shape[1]):
        ax = axes[layer, head]
        ax.imshow(w[0, head], vmin=0, vmax=1, cmap="Blues")
        ax.set_title(f"layer {layer}, head {head}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
plt.tight_layout()
plt.show()
print(
    "weight of query 0 on the last key, per head of the last layer:",
    maps[-1][0, :, 0, -1].numpy().round(2),
)

# %% [markdown]
# ## Summary
#
# * Attention: `softmax(Q K^T / sqrt(d_k)) V`; each row of weights is a distribution over keys.
# * Masks are applied as `-inf` before the softmax: causal (no future) and padding (no pads).
# * Heads work in parallel slices of the width and are mixed by an output projection.
# * `lamina.attention.MultiHeadAttention` is the same module, plus a fast path
#   (`F.scaled_dot_product_attention`), a KV cache (lesson 5) and safe fully-padded rows.
#
# Next, lesson 3: wrap attention into a Transformer block and assemble a GPT.
