# %% [markdown]
# # Lesson 3: assemble a GPT
#
# A GPT is a stack of identical blocks between an embedding and an output head. You will write
# its parts and put them together:
#
# 1. **LayerNorm** and **GELU**, and the **feed-forward** sublayer;
# 2. the **pre-LN Transformer block** with its two residual connections;
# 3. the **GPT model**, its parameter count (and GPT-2 small's, without allocating it), its
#    loss before training, and **greedy generation**.
#
# Attention is given: it is `lamina.attention.MultiHeadAttention`, the module you wrote in
# lesson 2 (it returns `(output, weights)`). Nothing is trained here: the point is that the
# machinery is right. Cells tagged `todo` raise `NotImplementedError` until you write them.

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn

from lamina import GPTConfig, checks
from lamina.attention import MultiHeadAttention
from lamina.errors import CheckFailed

torch.manual_seed(0)
cfg = GPTConfig.preset("tiny")  # vocab 100, block 32, d_model 32, 4 heads, 2 layers
cfg

# %% [markdown]
# ## 1. Layer normalisation
#
# Deep stacks train well only if the vectors entering each sublayer have a steady scale.
# LayerNorm normalises each vector over its **last** dimension, then applies a learned scale
# and shift (ones and zeros at first):
#
# `y = scale * (x - mean) / sqrt(var + eps) + shift`, with `eps = 1e-5`
#
# The variance is the **biased** one (divide by `d`, not `d - 1`: `unbiased=False`), as in
# `torch.nn.LayerNorm` and GPT-2.
#
# **TODO:** write `LayerNorm.forward`.


# %%
class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(d_model))
        self.shift = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        # BEGIN SOLUTION: LayerNorm.forward
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift
        # END SOLUTION


LayerNorm(4)(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))

# %% [markdown]
# ### Self-check 1

# %%
checks.report("LayerNorm", checks.check_layer_norm, LayerNorm(8), 8)

# %% [markdown]
# ## 2. GELU and the feed-forward sublayer
#
# GELU is a smooth ReLU: `x * Phi(x)`, with `Phi` the normal distribution's CDF. GPT-2 uses
# its tanh approximation, and so must we to match its numbers:
#
# `gelu(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))`
#
# The feed-forward sublayer acts on every position separately: `Linear(d, 4d)`, GELU,
# `Linear(4d, d)`. Attention moves information between positions; the feed-forward layers
# hold most of the parameters and do the per-position computing.
#
# **TODO:** write `GELU.forward` (the tanh formula, not `F.gelu`) and `FeedForward`.


# %%
class GELU(nn.Module):
    def forward(self, x):
        # BEGIN SOLUTION: GELU.forward
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        # END SOLUTION


class FeedForward(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        # BEGIN SOLUTION: FeedForward.__init__
        self.net = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), GELU(), nn.Linear(4 * d_model, d_model)
        )
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION: FeedForward.forward
        return self.net(x)
        # END SOLUTION


GELU()(torch.tensor([-1.0, 0.0, 1.0])), FeedForward(8)(torch.randn(2, 3, 8)).shape

# %% [markdown]
# ### Self-check 2

# %%
checks.report("GELU (tanh approximation)", checks.check_gelu, GELU())
checks.report("feed-forward", checks.check_feed_forward, FeedForward(16), 16)

# %% [markdown]
# ## 3. The Transformer block (pre-LN)
#
# Each sublayer is wrapped in a **residual connection**: the block adds the sublayer's output
# to its input instead of replacing it. GPT-2 normalises *before* each sublayer ("pre-LN"):
#
# ```
# x = x + dropout(attention(norm1(x)))
# x = x + dropout(feed_forward(norm2(x)))
# ```
#
# So a block whose sublayers output zero returns its input exactly: the residual stream is a
# clean path from the embedding to the head, along which gradients flow through any depth.
# (The 2017 Transformer normalised *after* the sum, "post-LN": `x = norm1(x + attention(x))`;
# it needs a careful warm-up to train deep.) The attention is causal.
#
# **TODO:** write `TransformerBlock.forward`. Remember that `self.attn(...)` returns a pair.


# %%
class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.norm1, self.norm2 = LayerNorm(d), LayerNorm(d)
        self.attn = MultiHeadAttention(
            d, cfg.n_heads, dropout=cfg.dropout, causal=True, qkv_bias=cfg.qkv_bias
        )
        self.ff = FeedForward(d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        # BEGIN SOLUTION: TransformerBlock.forward
        x = x + self.drop(self.attn(self.norm1(x))[0])
        x = x + self.drop(self.ff(self.norm2(x)))
        return x
        # END SOLUTION


TransformerBlock(cfg)(torch.randn(2, 5, cfg.d_model)).shape

# %% [markdown]
# ### Self-check 3
#
# Two invariants: changing the last input position must not change any earlier output
# (causality), and with both sublayers forced to output zero the block must return its input
# (the residual path).

# %%
checks.report(
    "block: shape and causality", checks.check_block_causality, TransformerBlock(cfg), cfg.d_model
)
checks.report(
    "block: residual identity", checks.check_residual_identity, TransformerBlock(cfg), cfg.d_model
)

# %% [markdown]
# The residual check is what tells pre-LN from post-LN:


# %%
class PostLNBlock(TransformerBlock):
    def forward(self, x):
        x = self.norm1(x + self.drop(self.attn(x)[0]))
        return self.norm2(x + self.drop(self.ff(x)))


try:
    checks.check_residual_identity(PostLNBlock(cfg), cfg.d_model)
except CheckFailed as exc:
    print("the check says:", exc)

# %% [markdown]
# ## 4. The GPT model
#
# ```
# ids (B, T) -> token table + position table -> dropout -> n_layers blocks
#            -> final LayerNorm -> head Linear(d, vocab, bias=False) -> logits (B, T, vocab)
# ```
#
# The final LayerNorm is needed because in a pre-LN stack nothing normalises the residual
# stream after the last block. With `cfg.tie_weights` the head shares the token table (lesson
# 1). Weights start as in GPT-2: normal with standard deviation 0.02, biases zero (given).
#
# **TODO:** build the modules in `__init__` and write `forward`. Use the attribute names
# `token_table`, `position_table` and `head` (the checks below look for them).


# %%
def init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPTModel(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        # BEGIN SOLUTION: GPTModel.__init__
        self.token_table = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_table = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.norm_f = LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.token_table.weight
        # END SOLUTION
        self.apply(init_weights)

    def forward(self, ids):
        # BEGIN SOLUTION: GPTModel.forward
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)
        x = self.drop(self.token_table(ids) + self.position_table(positions))
        return self.head(self.norm_f(self.blocks(x)))
        # END SOLUTION


model = GPTModel(cfg).eval()
model(torch.randint(0, cfg.vocab_size, (2, 7))).shape

# %% [markdown]
# ### Self-check 4

# %%
checks.report("logits shape", checks.check_logits_shape, model, cfg.vocab_size)
checks.report(
    "head tied to the token table", checks.check_tied, model.token_table.weight, model.head.weight
)
checks.report("parameter count = formula", checks.check_param_formula, model, cfg)

# %% [markdown]
# ## 5. Counting parameters, up to GPT-2 small
#
# The count follows from the shapes. With width `d`, vocabulary `V`, context `n`, `L` layers:
#
# | part | parameters |
# | --- | --- |
# | token and position tables | `V d + n d` |
# | attention, per layer | `3 d^2 + 3 d` (q, k, v and their bias) `+ d^2 + d` (output) |
# | feed-forward, per layer | `d 4d + 4d + 4d d + d` |
# | LayerNorms | `(2 L + 1) 2 d` |
# | head | `V d`, or 0 when tied |
#
# GPT-2 small (`d = 768`, `L = 12`, `V = 50257`, `n = 1024`) would take half a gigabyte in
# float32. PyTorch's **meta device** records shapes without allocating any memory, so we can
# build it and count anyway.

# %%
from lamina.models.params import gpt_param_table

gpt2 = GPTConfig.preset("gpt2-small")
for name, c, expected in [
    ("tied, qkv bias (Hugging Face's GPT-2)", gpt2, 124_439_808),
    ("tied, no qkv bias", gpt2.replace(qkv_bias=False), 124_412_160),
    ("separate head, no qkv bias", gpt2.replace(qkv_bias=False, tie_weights=False), 163_009_536),
]:
    with torch.device("meta"):
        big = GPTModel(c)
    n = sum(p.numel() for p in big.parameters())  # a shared tensor is yielded once
    print(f"{name:40s} {n:>12,}   on device {big.head.weight.device}")
    checks.report(f"GPT-2 small, {name}", checks.check_param_formula, big, c)
    assert n == expected, f"expected {expected:,}"

print()
for part, n in gpt_param_table(gpt2).items():
    print(f"{part:20s} {n:>12,}")

# %% [markdown]
# The three totals are 124,439,808 (the "124M" model), 124,412,160 and 163,009,536. Most of
# the parameters sit in the blocks' feed-forward layers and in the token table; a separate head
# would add another 38.6 million.
#
# ## 6. The loss of a model that knows nothing
#
# Before training, a model should be unsure: its predicted distribution over the next token
# should be nearly uniform, and the cross-entropy of a uniform guess over `V` tokens is
# `ln(V)`. An initial loss far above that means the logits start too large (a bad init), and
# training will waste its first steps undoing it. A cheap, telling check for any new model.

# %%
ids = torch.randint(0, cfg.vocab_size, (4, 16))
targets = torch.randint(0, cfg.vocab_size, (4, 16))
with torch.no_grad():
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
print(f"initial loss {loss.item():.3f}, ln(vocab) = {math.log(cfg.vocab_size):.3f}")
checks.report("initial loss ~ ln(vocab)", checks.check_initial_loss, model, cfg.vocab_size)

# %% [markdown]
# ## 7. Greedy generation
#
# A GPT predicts a distribution for the token after every position. To generate, repeat:
# feed the sequence (cropped to its last `block_size` tokens, the longest context the position
# table covers), take the logits at the **last** position, pick the most likely token
# (`argmax`: greedy decoding) and append it.
#
# **TODO:** write `generate_greedy`.


# %%
@torch.no_grad()
def generate_greedy(model, ids, max_new_tokens: int, block_size: int):
    # BEGIN SOLUTION: generate_greedy
    for _ in range(max_new_tokens):
        logits = model(ids[:, -block_size:])  # (B, T, vocab)
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, next_id], dim=1)
    return ids
    # END SOLUTION


out = generate_greedy(model, torch.tensor([[1, 2, 3]]), 10, cfg.block_size)
out

# %% [markdown]
# ### Self-check 5
#
# The check generates past `block_size` (so cropping must work), and checks that the prompt is
# kept, that the output is deterministic and that every id is in the vocabulary.

# %%
checks.report(
    "greedy generation",
    checks.check_greedy,
    lambda prompt, n: generate_greedy(model, prompt, n, cfg.block_size),
    cfg.vocab_size,
    cfg.block_size,
)
print(
    "untrained, so meaningless:",
    generate_greedy(model, torch.tensor([[1, 2, 3]]), 20, 32)[0].tolist(),
)

# %% [markdown]
# ## Summary
#
# * LayerNorm (biased variance, eps inside the root), tanh-GELU, and a `d -> 4d -> d`
#   feed-forward.
# * A pre-LN block adds each sublayer's output to a residual stream that it never normalises.
# * A GPT is embeddings, blocks, a final norm and a head; count its parameters from its shapes,
#   even GPT-2's, on the meta device.
# * Untrained: loss about `ln(vocab)`, and generation produces noise.
#
# lamina's versions live in `lamina.block` and `lamina.models.gpt` (`lamina.GPT`);
# `lamina count gpt2-small` prints the table above. Next, lesson 4: train one.
