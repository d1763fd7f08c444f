"""lamina.checks on learners' code: each classic mistake is caught with the intended message.

Every test builds a deliberately wrong module or function the way a learner might write it,
and checks that the check fails with a message that names the mistake (and a correct version
passes). Tiny sizes throughout.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lamina import GPT, GPTConfig, checks
from lamina.attention import MultiHeadAttention
from lamina.data import CharTokenizer
from lamina.errors import CheckFailed
from lamina.generation import sample as lamina_sample

# --- learners' modules, right and wrong ----------------------------------------------------


class LayerNorm(nn.Module):
    def __init__(self, d: int, unbiased: bool = False, eps_outside: bool = False) -> None:
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.unbiased, self.eps_outside = unbiased, eps_outside

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=self.unbiased)
        denom = torch.sqrt(var) + 1e-5 if self.eps_outside else torch.sqrt(var + 1e-5)
        return self.scale * (x - mean) / denom + self.shift


class Embedding(nn.Module):
    def __init__(self, vocab: int, block: int, d: int, shift: int = 0, offset_shift: int = 0):
        super().__init__()
        self.token_table, self.position_table = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.shift, self.offset_shift = shift, offset_shift

    def forward(self, ids, pos_offset=0):
        start = pos_offset + self.shift + (self.offset_shift if pos_offset else 0)
        positions = torch.arange(start, start + ids.shape[1])
        return self.token_table(ids) + self.position_table(positions)


class Attention(nn.Module):
    """A learner's attention with switchable mistakes."""

    def __init__(self, d: int, causal: bool, use_causal=True, use_padding=True, softmax=True):
        super().__init__()
        self.qkv, self.proj, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), 2
        self.causal, self.use_causal, self.use_padding = causal, use_causal, use_padding
        self.softmax = softmax

    def forward(self, x, padding_mask=None, need_weights=False):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.h)
        if self.causal and self.use_causal:
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
            scores = scores.masked_fill(future, float("-inf"))
        if padding_mask is not None and self.use_padding:
            scores = scores.masked_fill(padding_mask[:, None, None, :], float("-inf"))
        w = torch.softmax(scores, -1) if self.softmax else torch.sigmoid(scores)
        out = self.proj((w @ v).transpose(1, 2).reshape(B, T, d))
        return out, (w if need_weights else None)


class FeedForward(nn.Module):
    def __init__(self, d: int, width: int = 4, bias: bool = True):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, width * d, bias=bias), nn.Linear(width * d, d, bias=bias)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d: int, post_norm: bool = False, causal: bool = True):
        super().__init__()
        self.norm1, self.norm2 = LayerNorm(d), LayerNorm(d)
        self.attn = Attention(d, causal=True, use_causal=causal)
        self.ff = FeedForward(d)
        self.post_norm = post_norm

    def forward(self, x):
        if self.post_norm:
            x = self.norm1(x + self.attn(x)[0])
            return self.norm2(x + self.ff(x))
        x = x + self.attn(self.norm1(x))[0]
        return x + self.ff(self.norm2(x))


def fails(check, *args, **kwargs) -> str:
    with pytest.raises(CheckFailed) as info:
        check(*args, **kwargs)
    return str(info.value)


# --- layer norm, GELU, feed-forward --------------------------------------------------------


def test_layer_norm_right_passes():
    """A LayerNorm with the biased variance and eps inside the root passes."""
    checks.check_layer_norm(LayerNorm(8), 8)


def test_layer_norm_unbiased_variance_is_named():
    """The unbiased variance (d - 1) is named, with the variance it gives: 7/8 for d = 8."""
    msg = fails(checks.check_layer_norm, LayerNorm(8, unbiased=True), 8)
    assert "your LayerNorm uses the unbiased variance" in msg
    assert "expected variance 1.000, got 0.875" in msg


def test_layer_norm_eps_outside_the_root_is_caught():
    """eps added after the square root differs from F.layer_norm at small scales."""
    msg = fails(checks.check_layer_norm, LayerNorm(8, eps_outside=True), 8)
    assert "inside the square root" in msg


def test_exact_erf_gelu_is_named():
    """The exact (erf) GELU is told apart from GPT-2's tanh approximation."""
    assert "exact (erf) GELU" in fails(checks.check_gelu, nn.GELU())
    checks.check_gelu(nn.GELU(approximate="tanh"))


def test_relu_instead_of_gelu_is_caught():
    """Another activation fails with the size of the difference, without the erf hint."""
    msg = fails(checks.check_gelu, nn.ReLU())
    assert "differs from F.gelu(approximate='tanh')" in msg and "erf" not in msg


def test_feed_forward_wrong_width_or_no_bias():
    """A 2d hidden width, or missing biases, miscounts the parameters with both numbers."""
    checks.check_feed_forward(FeedForward(16), 16)
    assert "expected d*f + f + f*d + d = 2,128" in fails(
        checks.check_feed_forward, FeedForward(16, width=2), 16
    )
    assert "has 2,048 parameters" in fails(
        checks.check_feed_forward, FeedForward(16, bias=False), 16
    )


# --- blocks --------------------------------------------------------------------------------


def test_pre_ln_block_passes_both_block_checks():
    """A pre-LN causal block keeps causality and returns its input when sublayers are zero."""
    checks.check_block_causality(Block(16), 16)
    checks.check_residual_identity(Block(16), 16)


def test_post_norm_block_fails_residual_identity():
    """Post-LN normalises the residual sum, so zero sublayers do not give the input back."""
    msg = fails(checks.check_residual_identity, Block(16, post_norm=True), 16)
    assert "must return its input" in msg and "norm applied after the residual sum" in msg


def test_block_without_causal_mask_leaks_the_future():
    """A block whose attention lacks the causal mask leaks a later token into earlier outputs."""
    msg = fails(checks.check_block_causality, Block(16, causal=False), 16)
    assert "leaks information from a later token" in msg and "causal mask" in msg


# --- embeddings and tying ------------------------------------------------------------------


def test_embedding_right_passes():
    checks.check_embedding(Embedding(20, 32, 8), 20, 32)


def test_positions_starting_at_one_are_off_by_one():
    """Positions counted from 1: a full block no longer fits, reported as off by +1."""
    msg = fails(checks.check_embedding, Embedding(20, 32, 8, shift=1), 20, 32)
    assert "positions start at 1, not 0 (off by +1)" in msg


@pytest.mark.parametrize("shift", [1, -1])
def test_pos_offset_off_by_one(shift):
    """pos_offset handled one position early or late is reported with its sign."""
    msg = fails(checks.check_embedding, Embedding(20, 32, 8, offset_shift=shift), 20, 32)
    assert f"pos_offset=8 placed the tokens at positions starting from {8 + shift}" in msg
    assert f"off by {shift:+d}" in msg


def test_embedding_that_is_not_a_sum():
    """Multiplying token and position vectors makes the token part depend on the position."""

    class Product(Embedding):
        def forward(self, ids, pos_offset=0):
            pos = torch.arange(pos_offset, pos_offset + ids.shape[1])
            return self.token_table(ids) * self.position_table(pos)

    assert "x must be token + position" in fails(checks.check_embedding, Product(20, 32, 8), 20, 32)


def test_copied_head_is_not_tied():
    """A head holding a copy of the token table is caught; sharing the Parameter passes."""
    table = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = nn.Parameter(table.weight.detach().clone())
    assert "is a copy of the token table, not shared" in fails(
        checks.check_tied, table.weight, head.weight
    )
    head.weight = table.weight
    checks.check_tied(table.weight, head.weight)


def test_copied_head_adds_vocab_times_d_parameters():
    """A GPT whose head is a copy counts vocab * d more parameters than the tied formula."""
    cfg = GPTConfig.preset("tiny")
    model = GPT(cfg)
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    msg = fails(checks.check_param_formula, model, cfg)
    assert f"off by +{cfg.vocab_size * cfg.d_model:,}" in msg


# --- attention and masks -------------------------------------------------------------------


def test_learner_attention_right_passes():
    checks.check_attention_weights(Attention(16, causal=True), 16, causal=True)
    checks.check_attention_weights(Attention(16, causal=False), 16, causal=False)


def test_missing_causal_mask_is_caught():
    """Attention used in a decoder without its causal mask gives future keys weight."""
    msg = fails(
        checks.check_attention_weights, Attention(16, True, use_causal=False), 16, causal=True
    )
    assert "future keys must get exactly zero probability (missing causal mask?)" in msg


def test_ignored_padding_mask_is_caught():
    msg = fails(
        checks.check_attention_weights, Attention(16, False, use_padding=False), 16, causal=False
    )
    assert "padded keys must get exactly zero probability" in msg


def test_sigmoid_instead_of_softmax_is_caught():
    """Weights that are not a softmax over the keys: rows no longer sum to 1."""
    msg = fails(
        checks.check_attention_weights, Attention(16, False, softmax=False), 16, causal=False
    )
    assert "rows must sum to 1" in msg


def test_attention_without_weights_is_told_what_to_return():
    class NoWeights(Attention):
        def forward(self, x, padding_mask=None, need_weights=False):
            return super().forward(x, padding_mask)[0]

    assert "must return (output, weights)" in fails(
        checks.check_attention_weights, NoWeights(16, False), 16, causal=False
    )


@pytest.mark.parametrize(
    "mask, words",
    [
        (lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool), 1), "inverted"),
        (lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool)), "transposed"),
        (lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool), -1), "attend to itself"),
        (lambda T: torch.tril(torch.ones(T, T)), "bool tensor"),
    ],
)
def test_causal_mask_mistakes(mask, words):
    """Inverted, transposed, diagonal-less and non-bool causal masks each get their message."""
    assert words in fails(checks.check_causal_mask, mask)


def test_causal_mask_right_passes():
    checks.check_causal_mask(lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool)))


# --- tokenizer -----------------------------------------------------------------------------


def test_char_tokenizer_right_passes():
    checks.check_char_tokenizer(CharTokenizer.from_text("to be or not"), "to be or not")


def test_char_tokenizer_decode_mistake_is_located():
    class Broken:
        vocab_size = 7

        def __init__(self):
            self.chars = sorted(set("to be or not"))

        def encode(self, s):
            return [self.chars.index(c) for c in s]

        def decode(self, ids):
            return "".join(self.chars[i] for i in ids).replace("o", "0")

    msg = fails(checks.check_char_tokenizer, Broken(), "to be or not")
    assert "differs from the text at character 1" in msg


def test_char_tokenizer_wrong_vocab_size():
    class OneTooMany(CharTokenizer):
        @property
        def vocab_size(self):
            return super().vocab_size + 1

    msg = fails(checks.check_char_tokenizer, OneTooMany.from_text("abc"), "abc")
    assert "number of distinct characters in the text, 3, got 4" in msg


# --- models: loss, greedy, cache -----------------------------------------------------------


def test_initial_loss_far_from_ln_vocab():
    """Logits scaled up at init give a loss far above ln(vocab)."""

    class Loud(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = GPT(GPTConfig.preset("tiny", init_std=0.5))

        def forward(self, ids):
            return self.inner(ids) * 10

    assert "far from ln(vocab) = 4.605" in fails(checks.check_initial_loss, Loud(), 100)


def test_greedy_that_drops_the_prompt():
    model = GPT(GPTConfig.preset("tiny")).eval()
    msg = fails(
        checks.check_greedy,
        lambda p, n: model.greedy(p, n)[:, p.shape[1] - 3 :].roll(1, 1),
        100,
        32,
    )
    assert "prompt must be kept" in msg


def test_cached_generation_without_continued_positions():
    """Feeding the new token without the cache restarts at position 0 and changes the tokens."""
    torch.manual_seed(0)
    # a wider init than the default: near-uniform logits could make both paths repeat one token
    model = GPT(GPTConfig.preset("tiny", init_std=0.3)).eval()

    def forgetful(ids, n):
        for _ in range(n):
            nxt = model(ids[:, -1:])[:, -1].argmax(-1, keepdim=True)  # no cache, no context
            ids = torch.cat([ids, nxt], 1)
        return ids

    msg = fails(checks.check_cached_generation, forgetful, model.greedy, 100)
    assert "are positions continued from the cache" in msg


def test_cached_generation_with_lamina_caches_passes():
    model = GPT(GPTConfig.preset("tiny")).eval()

    @torch.no_grad()
    def cached(ids, n):
        caches = model.make_caches(ids.shape[0], ids.shape[1] + n)
        logits = model(ids, caches=caches)
        for _ in range(n):
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
            logits = model(ids[:, -1:], caches=caches)
        return ids

    checks.check_cached_generation(cached, model.greedy, 100)


# --- sampling ------------------------------------------------------------------------------


def test_lamina_sampler_passes():
    checks.check_sampler(lamina_sample)


def _sampler(temp_mul=False, ignore_temp=False, top_p_strict=False, ignore_top_k=False):
    def sample(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
        if temperature == 0:
            return logits.argmax(-1)
        if not ignore_temp:
            logits = logits * temperature if temp_mul else logits / temperature
        if top_k is not None and not ignore_top_k:
            kth = torch.topk(logits, top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None:
            probs, order = torch.sort(logits.softmax(-1), descending=True)
            cum = probs.cumsum(-1)
            drop = cum > top_p if top_p_strict else cum - probs >= top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)

    return sample


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"ignore_temp": True}, "the temperature was ignored"),
        ({"temp_mul": True}, "divide the logits by the temperature"),
        ({"ignore_top_k": True}, "top_k=2 keeps the 2 most likely tokens (1 and 3), but token"),
        ({"top_p_strict": True}, "top_p=0.7 keeps the smallest set reaching 0.7"),
    ],
)
def test_sampler_mistakes(kwargs, words):
    """Ignored or inverted temperature, ignored top-k, and a top-p that stops one token short."""
    assert words in fails(checks.check_sampler, _sampler(**kwargs))


# --- training step -------------------------------------------------------------------------


def _step(zero=True, step=True, last_only=False):
    def train_step(model, opt, x, y):
        logits = model(x)
        if last_only:
            loss = F.cross_entropy(logits[:, -1], y[:, -1])
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if zero:
            opt.zero_grad()
        loss.backward()
        if step:
            opt.step()
        return loss.item()

    return train_step


def test_train_step_right_passes():
    checks.check_train_step(_step())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"step": False}, "optimizer.step() called"),
        ({"last_only": True}, "flatten the logits to (B*T, V)"),
        ({"zero": False}, "are the gradients zeroed at every step?"),
    ],
)
def test_train_step_mistakes(kwargs, words):
    assert words in fails(checks.check_train_step, _step(**kwargs))


# --- the report helper ---------------------------------------------------------------------


def test_report_prints_pass_and_fail(capsys, monkeypatch):
    """report() prints PASS or FAIL with the message, and raises only in strict mode."""
    monkeypatch.delenv("LAMINA_LESSON_STRICT", raising=False)
    checks.report("norm", checks.check_layer_norm, LayerNorm(8), 8)
    checks.report("norm", checks.check_layer_norm, LayerNorm(8, unbiased=True), 8)
    out = capsys.readouterr().out
    assert "PASS: norm" in out
    assert "FAIL: norm" in out and "unbiased variance" in out
    monkeypatch.setenv("LAMINA_LESSON_STRICT", "1")
    with pytest.raises(CheckFailed):
        checks.report("norm", checks.check_layer_norm, LayerNorm(8, unbiased=True), 8)


def test_report_lets_a_todo_through():
    """A TODO's NotImplementedError is not hidden behind a FAIL line."""

    def todo(*_):
        raise NotImplementedError("TODO")

    with pytest.raises(NotImplementedError):
        checks.report("todo", todo)


def test_lamina_attention_has_the_interface_the_checks_expect():
    """The checks' attention interface is lamina's own: its module passes them."""
    checks.check_attention_weights(MultiHeadAttention(16, 4, causal=True), 16, causal=True)


# --- lesson 7: chat rendering, a LoRA linear, the assistant-only mask ------------------------


class LoRA(nn.Module):
    """A learner's LoRA linear with switchable mistakes."""

    def __init__(self, base, r=8, alpha=16.0, dropout=0.0, mistake=None):
        super().__init__()
        self.base, self.mistake = base, mistake
        if mistake != "unfrozen":
            base.requires_grad_(False)
        self.A = nn.Parameter(torch.empty(r, base.in_features))
        if mistake == "A zero":
            nn.init.zeros_(self.A)
        elif mistake == "A normal":
            nn.init.normal_(self.A)
        else:
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.B = nn.Parameter(torch.randn(base.out_features, r) if mistake == "B random" else
                              torch.zeros(base.out_features, r))  # fmt: skip
        self.scaling = alpha if mistake == "scaling alpha" else alpha / r
        self.alpha = alpha
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        m = self.mistake
        if m == "no adapter":
            return self.base(x)
        h = x if m == "no dropout" else self.dropout(x)
        scale = {"forward alpha": self.alpha, "no scaling": 1.0}.get(m, self.scaling)
        y = self.base(x) + scale * (h @ self.A.T) @ self.B.T
        return self.dropout(y) if m == "dropout outside" else y


def test_lora_linear_right_passes():
    checks.check_lora_linear(LoRA)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("B random", "B must start at zero"),
        ("A zero", "A must start random"),
        ("A normal", "kaiming_uniform_"),
        ("unfrozen", "freeze the base"),
        ("scaling alpha", "alpha / r, not alpha"),
        ("forward alpha", "is scaled by alpha instead of alpha / r"),
        ("no scaling", "misses the scaling"),
        ("no adapter", "B got no gradient"),
        ("dropout outside", "dropout goes on the adapter's input only"),
        ("no dropout", "changed nothing in training mode"),
    ],
)
def test_lora_linear_mistakes(mistake, words):
    assert words in fails(
        checks.check_lora_linear, lambda base, **kw: LoRA(base, **kw, mistake=mistake)
    )


def test_lamina_lora_linear_agrees_with_the_learners_formula():
    """The reference the check compares with is lamina's LoRALinear: one adapter, one segment."""
    from lamina.lora import LoRAConfig, LoRALinear

    torch.manual_seed(0)
    base = nn.Linear(16, 8)
    ours = LoRALinear(base, [("q", 8)], ["q"], LoRAConfig(r=2, alpha=4.0, dropout=0.0)).eval()
    with torch.no_grad():
        ours.lora_B["q"].normal_()
    x = torch.randn(3, 16)
    a, b = ours.lora_A["q"], ours.lora_B["q"]
    assert torch.allclose(ours(x), base(x) + 2.0 * (x @ a.T) @ b.T, atol=1e-6)


@pytest.fixture(scope="module")
def smol_tok(smollm2_gguf):
    """The real model's tokenizer, from the GGUF file's metadata only (no weights read)."""
    from lamina.native.gguf_read import read_gguf
    from lamina.tokenizers.pretrained import PretrainedTokenizer

    return PretrainedTokenizer.from_gguf_metadata(read_gguf(smollm2_gguf).metadata)


SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(messages, add_generation_prompt=True, mistake=None):
    if mistake != "no default system" and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": SMOL_SYSTEM}, *messages]
    end = "<|im_end|>" if mistake == "no newline" else "<|im_end|>\n"
    role = "<|im_start|> {}\n" if mistake == "spaced role" else "<|im_start|>{}\n"
    text = "".join(role.format(m["role"]) + m["content"] + end for m in messages)
    gen = add_generation_prompt if mistake is None else mistake == "always header"
    if mistake in ("no default system", "no newline", "spaced role"):
        gen = add_generation_prompt
    return text + ("<|im_start|>assistant\n" if gen else "")


def test_chat_render_right_passes(smol_tok):
    checks.check_chat_render(chatml, smol_tok)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("no default system", "default system message"),
        ("never header", "with add_generation_prompt=True the text ends with"),
        ("always header", "add_generation_prompt=False: no assistant header"),
        ("no newline", "newlines, the template writes"),
        ("spaced role", "differs from the template at character"),
    ],
)
def test_chat_render_mistakes(smol_tok, mistake, words):
    render = lambda m, g: chatml(m, g, mistake=mistake)  # noqa: E731
    assert words in fails(checks.check_chat_render, render, smol_tok)


def example(messages, tokenizer, mistake=None):
    """A learner's ids and labels, piece by piece, with switchable mistakes."""
    if mistake != "no default system" and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": SMOL_SYSTEM}, *messages]
    ids, labels = [], []
    for m in messages:
        mine = m["role"] == "assistant" or mistake == "every token"
        pieces = [(f"<|im_start|>{m['role']}\n", mine and mistake == "header trained")]
        if mistake == "eot not trained":
            pieces += [(m["content"], mine), ("<|im_end|>", False)]
        else:
            pieces += [(m["content"] + "<|im_end|>", mine)]
        pieces += [("\n", mine and mistake in ("newline trained", "every token"))]
        for piece, trained in pieces:
            piece_ids = tokenizer.encode(piece)
            ids += piece_ids
            labels += piece_ids if trained else [-100] * len(piece_ids)
    if mistake == "shifted":
        labels = labels[1:] + [-100]
    return ids, labels


def test_assistant_mask_right_passes(smol_tok):
    checks.check_assistant_mask(example, smol_tok)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("no default system", "not those of the conversation as the template renders it"),
        ("eot not trained", "how the model learns to stop"),
        ("newline trained", "comes after the end-of-turn token"),
        ("header trained", "not part of an assistant reply"),
        ("every token", "not part of an assistant reply"),
        ("shifted", "shifted by one"),
    ],
)
def test_assistant_mask_mistakes(smol_tok, mistake, words):
    fn = lambda m, t: example(m, t, mistake=mistake)  # noqa: E731
    assert words in fails(checks.check_assistant_mask, fn, smol_tok)
