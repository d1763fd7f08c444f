# %% [markdown]
# # Lesson 1: tokens and embeddings
#
# A language model never sees text. It sees integers (token ids), and its first layer turns
# each id into a vector. In this lesson you build that first stage:
#
# 1. a **character tokenizer**: text to ids and back;
# 2. an **embedding**: a token table plus a position table, and why the positions are needed;
# 3. **weight tying**: letting the output layer share the token table.
#
# Cells tagged `todo` raise `NotImplementedError` until you write the code (in the solution
# notebook they are filled in). Each is followed by a self-check that runs one of `lamina.checks`
# on *your* class and prints `PASS` or says what is wrong and by how much.
# Runs on a CPU in a few seconds.

# %%
import torch
from torch import nn

from lamina import checks
from lamina.errors import CheckFailed

torch.manual_seed(0)
text = (
    "Shall I compare thee to a summer's day?\n"
    "Thou art more lovely and more temperate:\n"
    "Rough winds do shake the darling buds of May,\n"
    "And summer's lease hath all too short a date;\n"
)
print(f"{len(text)} characters, {len(set(text))} distinct")

# %% [markdown]
# ## 1. Characters to ids
#
# The simplest tokenizer gives every distinct character one id. Sort the characters so that the
# vocabulary does not depend on the order in which they appear: id `i` is `chars[i]`.
# `encode` maps a string to a list of ids (one per character), `decode` maps ids back.
# Real models use sub-word tokenizers (GPT-2 has 50,257 tokens), but every idea in these lessons
# works the same way with characters, and the vocabulary stays tiny.


# %%
class CharTokenizer:
    def __init__(self, text: str):
        # BEGIN SOLUTION: build self.chars (sorted distinct characters) and self.index (char -> id)
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        # END SOLUTION

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> list[int]:
        # BEGIN SOLUTION: CharTokenizer.encode
        return [self.index[c] for c in s]
        # END SOLUTION

    def decode(self, ids: list[int]) -> str:
        # BEGIN SOLUTION: CharTokenizer.decode
        return "".join(self.chars[i] for i in ids)
        # END SOLUTION


tok = CharTokenizer(text)
print(tok.vocab_size, tok.encode("summer"))

# %% [markdown]
# ### Self-check 1

# %%
checks.report("character tokenizer", checks.check_char_tokenizer, tok, text)

from lamina.data import CharTokenizer as LaminaCharTokenizer

# lamina's own tokenizer makes the same choices, so the ids agree
print(LaminaCharTokenizer.from_text(text).encode("summer") == tok.encode("summer"))

# %% [markdown]
# ## 2. Ids to vectors: a lookup table
#
# An embedding is a table with one row of `d_model` numbers per token id; embedding an id means
# reading its row. That is the same as multiplying a one-hot vector by the table, which is why
# the rows can be learned by gradient descent like any other weight.

# %%
table = nn.Embedding(tok.vocab_size, 8)
ids = torch.tensor(tok.encode("day"))
one_hot = nn.functional.one_hot(ids, tok.vocab_size).float()  # (3, vocab)
print(torch.allclose(table(ids), one_hot @ table.weight))  # (3, 8) either way

# %% [markdown]
# ## 3. Why positions matter
#
# Attention (lesson 2) mixes the vectors of a sequence by comparing their *contents*. It has no
# idea where each vector sits: shuffle the inputs and the outputs are shuffled the same way, so
# "dog bites man" and "man bites dog" look alike. Here is a lamina Transformer block (without a
# causal mask) doing exactly that:

# %%
from lamina.block import TransformerBlock

block = TransformerBlock(8, 2, causal=False).eval()
x = table(torch.tensor([tok.encode("Thou art")]))  # (1, 8, 8): tokens only, no positions
perm = torch.randperm(x.shape[1])
with torch.no_grad():
    shuffled_then_block = block(x[:, perm])[0]
    block_then_shuffled = block(x)[0][:, perm]
print("order is invisible:", torch.allclose(shuffled_then_block, block_then_shuffled, atol=1e-6))

# %% [markdown]
# The fix is to add a second table with one learned vector per *position* `0 .. block_size - 1`:
#
# `x[b, t] = token_table[ids[b, t]] + position_table[pos_offset + t]`
#
# Now the same character at two places gives two different vectors. `pos_offset` says at which
# position `ids[:, 0]` sits. It is 0 for a whole sequence; when a model generates one token at a
# time (lesson 5), the new token at position `k` arrives alone, and must still get position `k`.
#
# **TODO:** write `Embedding.forward`. Both tables are `nn.Embedding`s; build the positions with
# `torch.arange` (on the same device as `ids`).


# %%
class Embedding(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, d_model: int):
        super().__init__()
        self.token_table = nn.Embedding(vocab_size, d_model)
        self.position_table = nn.Embedding(block_size, d_model)

    def forward(self, ids: torch.Tensor, pos_offset: int = 0) -> torch.Tensor:
        # ids (B, T) -> (B, T, d_model)
        # BEGIN SOLUTION: Embedding.forward
        T = ids.shape[1]
        positions = torch.arange(pos_offset, pos_offset + T, device=ids.device)  # (T,)
        return self.token_table(ids) + self.position_table(positions)  # broadcasts over B
        # END SOLUTION


emb = Embedding(tok.vocab_size, block_size=32, d_model=16)
emb(torch.tensor([tok.encode("May")])).shape

# %% [markdown]
# ### Self-check 2
#
# The check verifies that the token part of each vector does not depend on its position, and
# that embedding a slice that starts at position `k` with `pos_offset=k` gives exactly the
# vectors of the whole sequence at those positions.

# %%
checks.report("token + position embedding", checks.check_embedding, emb, tok.vocab_size, 32)

# %% [markdown]
# What does a check say when something is off? Here is a version with a classic off-by-one:
# it counts positions from 1 instead of 0, so the last position of a full block falls off the
# end of the table.


# %%
class OffByOne(Embedding):
    def forward(self, ids, pos_offset=0):
        return super().forward(ids, pos_offset + 1)


try:
    checks.check_embedding(OffByOne(tok.vocab_size, 32, 16), tok.vocab_size, 32)
except CheckFailed as exc:
    print("the check says:", exc)

# %% [markdown]
# ## 4. Weight tying
#
# At the other end of a GPT, an output head `nn.Linear(d_model, vocab_size, bias=False)` turns
# each vector into one score (logit) per token. Its weight has shape `(vocab_size, d_model)`:
# the same shape as the token table. GPT-2 **shares** the two: a token's input vector is also
# the direction that scores it as output. That saves `vocab_size * d_model` parameters
# (38.6 million of GPT-2 small's 124 million) and tends to help small models.
#
# Sharing means both modules hold *the same* `nn.Parameter`. A copy (`.clone()`, or
# `load_state_dict`) starts equal but drifts apart as soon as training updates one of them.
#
# **TODO:** make `head` use the embedding's token table.


# %%
def tie(head: nn.Linear, embedding: Embedding) -> None:
    # BEGIN SOLUTION: tie the head to the token table
    head.weight = embedding.token_table.weight
    # END SOLUTION


head = nn.Linear(16, tok.vocab_size, bias=False)
tie(head, emb)
head.weight.shape

# %% [markdown]
# ### Self-check 3

# %%
checks.report(
    "head tied to the token table", checks.check_tied, emb.token_table.weight, head.weight
)

# %% [markdown]
# Shared storage shows up in two places: the parameter count (PyTorch's `parameters()` yields a
# shared tensor once) and training, where one update moves both.

# %%
pair = nn.ModuleList([emb, head])
print("parameter tensors:", len(list(pair.parameters())))  # token and position tables: 2, not 3

opt = torch.optim.SGD(pair.parameters(), lr=0.1)
logits = head(emb(torch.tensor([tok.encode("buds")])))  # (1, 4, vocab)
loss = nn.functional.cross_entropy(logits[0], torch.tensor(tok.encode("uds ")))
loss.backward()
opt.step()
print("still the same tensor after a step:", head.weight is emb.token_table.weight)

# %% [markdown]
# ## Summary
#
# * A tokenizer maps text to ids; a character tokenizer is a sorted list of characters.
# * An embedding reads one row per id from a token table and adds one row per position from a
#   position table; without positions, attention cannot tell word order.
# * `pos_offset` lets a sequence continue at the right position, one token at a time.
# * Tying shares one `Parameter` between the token table and the output head.
#
# lamina's versions: `lamina.data.CharTokenizer` and `lamina.embedding.Embedding` (which adds
# a sinusoidal option, dropout and `tie_lm_head`). Next, lesson 2: attention and its masks.
