"""Invariant checks, reusable on any module with the documented interface.

Each `check_*` function takes a module (lamina's own, or a learner's), probes it with small
random inputs and raises `CheckFailed` with a message that says what is wrong and how far off it
is; it returns None when the invariant holds. Interfaces expected:

    norm(x) -> y                               x, y: (B, T, d)
    gelu(x) -> y                               elementwise
    ff(x) -> y                                 (B, T, d) -> (B, T, d)
    block(x) -> y or (y, weights)              (B, T, d) -> (B, T, d)
    embedding(ids, pos_offset=k) -> x          (B, T) -> (B, T, d)
    attn(x, padding_mask=m, need_weights=True) -> (out, weights (B, H, T, T))
    model(ids) -> logits                       (B, T) -> (B, T, vocab)

`run_all()` runs every check on lamina's own modules (what `lamina check` prints).
Checks run in eval mode with gradients off and restore the module's mode afterwards.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.errors import CheckFailed
from lamina.models.config import GPTConfig
from lamina.models.params import count_module_params, count_params


@contextlib.contextmanager
def _probing(module: nn.Module | Callable, seed: int = 0) -> Iterator[None]:
    """Eval mode, no gradients, a fixed seed; the module's mode is restored afterwards."""
    was_training = getattr(module, "training", None)
    if isinstance(module, nn.Module):
        module.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed)
            yield
    finally:
        if isinstance(module, nn.Module) and was_training is not None:
            module.train(was_training)


def _first(out: Tensor | tuple) -> Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _shape(name: str, got: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(got.shape) != tuple(expected):
        raise CheckFailed(f"{name}: expected shape {tuple(expected)}, got {tuple(got.shape)}")


def check_layer_norm(norm: nn.Module, d_model: int = 8, eps: float = 1e-5) -> None:
    """Mean 0 and biased variance 1 over the last dim; equal to F.layer_norm at init."""
    with _probing(norm):
        x = torch.randn(4, 5, d_model) * 3 + 7
        y = _first(norm(x))
        _shape("LayerNorm output", y, x.shape)
        mean = y.mean(-1).abs().max().item()
        if mean > 1e-4:
            raise CheckFailed(
                f"each vector should have mean 0 after normalisation: largest |mean| is {mean:.4f}"
            )
        var = y.var(-1, unbiased=False).mean().item()
        if abs(var - 1.0) > 1e-3 and abs(var - (d_model - 1) / d_model) < 1e-3:
            raise CheckFailed(
                "your LayerNorm uses the unbiased variance (divides by d - 1): "
                f"expected variance 1.000, got {var:.3f}"
            )
        for scale in (1.0, 0.003):  # a tiny scale makes eps matter
            xs = x * scale
            diff = (_first(norm(xs)) - F.layer_norm(xs, (d_model,), eps=eps)).abs().max().item()
            if diff > 1e-4:
                raise CheckFailed(
                    f"differs from F.layer_norm(eps={eps}) by {diff:.2e} at input scale {scale} "
                    f"(variance of the output {var:.3f}; check eps, and that it is added to the "
                    "variance inside the square root)"
                )
        if abs(var - 1.0) > 1e-3:
            raise CheckFailed(f"expected variance 1.000, got {var:.3f}")


def check_gelu(gelu: Callable[[Tensor], Tensor]) -> None:
    """Equal to GELU's tanh approximation (GPT-2's), not the exact erf form."""
    with _probing(gelu):
        t = torch.linspace(-6, 6, 241)
        y = gelu(t)
        diff = (y - F.gelu(t, approximate="tanh")).abs().max().item()
        if diff > 1e-5:
            hint = ""
            if (y - F.gelu(t)).abs().max().item() < 1e-5:
                hint = "this is the exact (erf) GELU; GPT-2 uses the tanh approximation: "
            raise CheckFailed(f"{hint}differs from F.gelu(approximate='tanh') by {diff:.2e}")


def check_feed_forward(ff: nn.Module, d_model: int = 16, d_ff: int | None = None) -> None:
    """Shape is kept and the parameters are d f + f + f d + d (f = 4 d by default)."""
    f = 4 * d_model if d_ff is None else d_ff
    with _probing(ff):
        x = torch.randn(2, 3, d_model)
        _shape("feed-forward output", _first(ff(x)), x.shape)
    n, expected = count_module_params(ff), 2 * d_model * f + f + d_model
    if n != expected:
        raise CheckFailed(
            f"feed-forward has {n:,} parameters, expected d*f + f + f*d + d = {expected:,} "
            f"(d={d_model}, f={f})"
        )


def check_block_causality(block: nn.Module, d_model: int, T: int = 10) -> None:
    """A block keeps the shape, and a change at the last position leaves earlier outputs alone."""
    with _probing(block):
        h = torch.randn(2, T, d_model)
        y = _first(block(h))
        _shape("block output", y, h.shape)
        h2 = h.clone()
        # a random change, not a constant shift: LayerNorm would erase a shift of all features
        h2[:, -1] = torch.randn(2, d_model) * 3
        diff = (_first(block(h2))[:, :-1] - y[:, :-1]).abs().max().item()
        if diff > 1e-5:
            raise CheckFailed(
                "the block leaks information from a later token: outputs before the last position "
                f"changed by {diff:.3g} when only the last input changed (is the causal mask applied?)"
            )


def _sublayers(block: nn.Module) -> list[nn.Module]:
    """Children with parameters that are not norms: the attention and feed-forward sublayers."""
    return [
        m
        for m in block.children()
        if any(True for _ in m.parameters()) and "norm" not in type(m).__name__.lower()
    ]


def check_residual_identity(
    block: nn.Module, d_model: int, sublayers: list[nn.Module] | None = None
) -> None:
    """With every sublayer outputting zero, a pre-LN block returns its input exactly."""
    subs = _sublayers(block) if sublayers is None else sublayers
    if not subs:
        raise CheckFailed("found no sublayers (children with parameters that are not norms)")

    def zero(_m: nn.Module, _inp: tuple, out: Tensor | tuple) -> Tensor | tuple:
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out)

    handles = [m.register_forward_hook(zero) for m in subs]
    try:
        with _probing(block):
            h = torch.randn(2, 6, d_model)
            diff = (_first(block(h)) - h).abs().max().item()
    finally:
        for handle in handles:
            handle.remove()
    if diff > 1e-6:
        raise CheckFailed(
            "with both sublayers outputting zero a residual block must return its input; it moved "
            f"by {diff:.3g} (is a norm applied after the residual sum, or the residual missing?)"
        )


def check_embedding(embedding: nn.Module, vocab_size: int, block_size: int) -> None:
    """x = token part + position part; pos_offset continues positions exactly."""
    T = min(8, block_size)
    with _probing(embedding):
        a = torch.full((1, T), 1 % vocab_size, dtype=torch.long)
        b = torch.full((1, T), 2 % vocab_size, dtype=torch.long)
        d = embedding(a) - embedding(b)  # token part difference, must not depend on position
        spread = (d - d[:, :1]).abs().max().item()
        if spread > 1e-5:
            raise CheckFailed(
                f"the token part varies with position by {spread:.3g}: x must be token + position"
            )
        if block_size < 8:
            return
        k, m = block_size // 4, block_size // 2  # a segment of m tokens starting at position k
        ids = torch.randint(0, vocab_size, (2, block_size))
        seg = embedding(ids[:, k : k + m], pos_offset=k)
        try:
            whole = embedding(ids)
        except (IndexError, RuntimeError) as exc:  # e.g. positions shifted past the table
            raise CheckFailed(_full_block_message(embedding, vocab_size, block_size, exc)) from exc
        diff = (seg - whole[:, k : k + m]).abs().max().item()
        if diff <= 1e-5:
            return
        same = torch.full((1, block_size), 1 % vocab_size, dtype=torch.long)
        full, seg = embedding(same), embedding(same[:, :m], pos_offset=k)
        for shift in (-2, -1, 1, 2):
            if (seg - full[:, k + shift : k + shift + m]).abs().max().item() <= 1e-5:
                raise CheckFailed(
                    f"pos_offset={k} placed the tokens at positions starting from {k + shift}, "
                    f"not {k}: off by {shift:+d}"
                )
        raise CheckFailed(
            f"embedding(ids[:, {k}:{k + m}], pos_offset={k}) differs from "
            f"embedding(ids)[:, {k}:{k + m}] by {diff:.3g}"
        )


def _full_block_message(
    embedding: nn.Module, vocab_size: int, block_size: int, exc: Exception
) -> str:
    """Why a full block of ids failed to embed: find the longest sequence that does embed."""
    longest = 0
    for T in range(block_size - 1, 0, -1):
        try:
            embedding(torch.zeros(1, T, dtype=torch.long) + 1 % vocab_size)
        except (IndexError, RuntimeError):
            continue
        longest = T
        break
    if longest:
        s = block_size - longest
        return (
            f"a full block of {block_size} tokens cannot be embedded, but {longest} can: the "
            f"positions start at {s}, not 0 (off by +{s}); a block needs positions 0 .. "
            f"{block_size - 1}"
        )
    return f"embedding a full block of {block_size} tokens raised {type(exc).__name__}: {exc}"


def check_tied(token_table: Tensor, head_weight: Tensor) -> None:
    """The head's weight is the token table itself (shared storage), not a copy."""
    if head_weight is token_table or head_weight.data_ptr() == token_table.data_ptr():
        return
    if head_weight.shape == token_table.shape and torch.equal(head_weight, token_table):
        raise CheckFailed(
            "the head's weight is a copy of the token table, not shared: the two will drift "
            "apart in training (assign head.weight = token_table, the same Parameter)"
        )
    raise CheckFailed("the head's weight and the token table are different tensors")


def check_attention_weights(attn: nn.Module, d_model: int, *, causal: bool, T: int = 6) -> None:
    """Rows sum to 1; padded keys (and future keys if causal) get exactly zero probability."""
    with _probing(attn):
        x = torch.randn(2, T, d_model)
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, T - 2 :] = True  # the second sequence ends with two pads
        out = attn(x, padding_mask=pad, need_weights=True)
        if not isinstance(out, tuple) or len(out) < 2 or out[1] is None:
            raise CheckFailed("attention must return (output, weights) when need_weights=True")
        y, w = out[0], out[1]
        _shape("attention output", y, x.shape)
        if w.dim() != 4 or w.shape[0] != 2 or tuple(w.shape[2:]) != (T, T):
            raise CheckFailed(
                f"weights must be (B, H, T, T) = (2, H, {T}, {T}), got {tuple(w.shape)}"
            )
        rows = (w.sum(-1) - 1).abs().max().item()
        if rows > 1e-5:
            raise CheckFailed(f"attention rows must sum to 1; the worst is off by {rows:.3g}")
        leaked = w[1, :, :, T - 2 :].abs().max().item()
        if leaked != 0.0:
            raise CheckFailed(
                f"padded keys must get exactly zero probability, got up to {leaked:.3g}"
            )
        if causal:
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            peek = w[:, :, future].abs().max().item()
            if peek != 0.0:
                raise CheckFailed(
                    f"future keys must get exactly zero probability (missing causal mask?): got up to {peek:.3g}"
                )


def check_logits_shape(model: nn.Module, vocab_size: int, T: int = 12) -> None:
    with _probing(model):
        logits = _first(model(torch.randint(0, vocab_size, (3, T))))
        _shape("logits", logits, (3, T, vocab_size))


def check_param_formula(model: nn.Module, config: GPTConfig) -> None:
    """Counted parameters (shared tensors once) equal the formula."""
    n, expected = count_module_params(model), count_params(config)
    if n != expected:
        raise CheckFailed(
            f"the model has {n:,} parameters, the formula says {expected:,} "
            f"(off by {n - expected:+,}; a copied rather than shared head adds vocab*d)"
        )


def check_greedy(
    generate: Callable[[Tensor, int], Tensor], vocab_size: int, block_size: int
) -> None:
    """Greedy decoding keeps the prompt, is deterministic, stays in range and runs past block_size."""
    prompt = torch.tensor([[1, 2, 3]]) % vocab_size
    n = block_size + 8  # forces cropping to the context
    with torch.no_grad():
        out = generate(prompt, n)
        again = generate(prompt, n)
    _shape("generated ids", out, (1, 3 + n))
    if not torch.equal(out[:, :3], prompt):
        raise CheckFailed("the prompt must be kept at the start of the output")
    if not torch.equal(out, again):
        raise CheckFailed("greedy decoding of an eval-mode model must be deterministic")
    if int(out.min()) < 0 or int(out.max()) >= vocab_size:
        raise CheckFailed(f"generated ids must lie in [0, {vocab_size})")


def check_initial_loss(model: nn.Module, vocab_size: int, T: int = 16, tol: float = 0.25) -> None:
    """An untrained model's cross-entropy is about ln(vocab): within tol (relative)."""
    with _probing(model):
        ids = torch.randint(0, vocab_size, (4, T))
        targets = torch.randint(0, vocab_size, (4, T))
        logits = _first(model(ids))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()
    expected = math.log(vocab_size)
    if abs(loss - expected) > tol * expected:
        raise CheckFailed(
            f"initial loss {loss:.3f} is far from ln(vocab) = {expected:.3f}: the init is too large "
            "or the logits are scaled"
        )


def check_fast_path_matches_reference(attn: nn.Module, d_model: int, tol: float = 1e-5) -> None:
    """lamina's SDPA path equals its explicit-softmax path (with and without a padding mask)."""
    saved = attn.impl
    try:
        with _probing(attn):
            x = torch.randn(2, 7, d_model)
            pad = torch.zeros(2, 7, dtype=torch.bool)
            pad[0, 5:] = True
            pad[1, :] = True  # a fully padded row must give finite zeros on both paths
            for mask in (None, pad):
                attn.impl = "sdpa"
                fast = attn(x, mask)[0]
                attn.impl = "reference"
                ref = attn(x, mask)[0]
                if not torch.isfinite(fast).all() or not torch.isfinite(ref).all():
                    raise CheckFailed("attention produced non-finite values on a padded batch")
                diff = (fast - ref).abs().max().item()
                if diff > tol:
                    raise CheckFailed(f"SDPA path differs from the reference path by {diff:.2e}")
    finally:
        attn.impl = saved


@dataclass
class CheckResult:
    name: str
    ok: bool
    message: str = ""


def run_all(seed: int = 0) -> list[CheckResult]:
    """Every check on lamina's own modules, in layer order."""
    from lamina.attention import MultiHeadAttention
    from lamina.block import GELU, FeedForward, LayerNorm, TransformerBlock
    from lamina.embedding import Embedding
    from lamina.models.gpt import GPT

    torch.manual_seed(seed)
    cfg = GPTConfig.preset("tiny")
    d = cfg.d_model
    model = GPT(cfg)
    untied = GPT(cfg.replace(tie_weights=False, qkv_bias=False))
    checks: list[tuple[str, Callable[[], None]]] = [
        (
            "embedding: token + position, pos_offset",
            lambda: check_embedding(
                Embedding(cfg.vocab_size, cfg.block_size, d), cfg.vocab_size, cfg.block_size
            ),
        ),
        (
            "embedding: sinusoidal positions",
            lambda: check_embedding(
                Embedding(cfg.vocab_size, cfg.block_size, d, positions="sinusoidal"),
                cfg.vocab_size,
                cfg.block_size,
            ),
        ),
        (
            "attention: causal weights",
            lambda: check_attention_weights(MultiHeadAttention(d, 4, causal=True), d, causal=True),
        ),
        (
            "attention: padding weights",
            lambda: check_attention_weights(MultiHeadAttention(d, 4), d, causal=False),
        ),
        (
            "attention: fast path = reference",
            lambda: check_fast_path_matches_reference(MultiHeadAttention(d, 4, causal=True), d),
        ),
        ("block: LayerNorm statistics", lambda: check_layer_norm(LayerNorm(8), 8)),
        ("block: GELU (tanh)", lambda: check_gelu(GELU())),
        ("block: feed-forward parameters", lambda: check_feed_forward(FeedForward(16), 16)),
        ("block: shape and causality", lambda: check_block_causality(TransformerBlock(d, 4), d)),
        ("block: residual identity", lambda: check_residual_identity(TransformerBlock(d, 4), d)),
        ("gpt: logits shape", lambda: check_logits_shape(model, cfg.vocab_size)),
        (
            "gpt: head tied to token table",
            lambda: check_tied(model.embed.wte.weight, model.head.weight),
        ),
        ("gpt: parameter formula (tied)", lambda: check_param_formula(model, cfg)),
        (
            "gpt: parameter formula (untied, no qkv bias)",
            lambda: check_param_formula(untied, untied.config),
        ),
        (
            "gpt: greedy decoding",
            lambda: check_greedy(model.greedy, cfg.vocab_size, cfg.block_size),
        ),
        ("gpt: initial loss ~ ln(vocab)", lambda: check_initial_loss(model, cfg.vocab_size)),
    ]
    results = []
    for name, fn in checks:
        try:
            fn()
            results.append(CheckResult(name, True))
        except CheckFailed as exc:
            results.append(CheckResult(name, False, str(exc)))
    return results


# --- checks and a report helper for learners' code (the lessons' self-check cells) ---


def report(name: str, check: Callable[..., None], *args: object, **kwargs: object) -> None:
    """Run one check for a notebook self-check cell and say how it went, in plain words.

    Prints "PASS: name", or "FAIL: name" and the check's message (and returns None, so that a
    notebook cell shows only the message).
    Errors other than `CheckFailed` (a `NotImplementedError` from a TODO, a shape error) pass
    through with their traceback. With the environment variable LAMINA_LESSON_STRICT=1 a failed
    check also raises, so a notebook run by a test stops at the first failure.
    """
    try:
        check(*args, **kwargs)
    except CheckFailed as exc:
        print(f"FAIL: {name}\n  {exc}")  # the one print in lamina's library code: it is the point
        if os.environ.get("LAMINA_LESSON_STRICT", "") not in ("", "0"):
            raise
        return
    print(f"PASS: {name}")


def check_char_tokenizer(tokenizer: object, text: str) -> None:
    """One id per character, ids in [0, vocab_size), vocab_size = distinct characters, and
    decode(encode(text)) == text."""
    chars = sorted(set(text))
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab != len(chars):
        raise CheckFailed(
            f"vocab_size should be the number of distinct characters in the text, "
            f"{len(chars)}, got {vocab!r}"
        )
    ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if len(ids) != len(text):
        raise CheckFailed(
            f"expected one id per character: {len(text)} characters gave {len(ids)} ids"
        )
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < len(chars)]
    if bad:
        raise CheckFailed(f"ids must be integers in [0, {len(chars)}), got {bad[0]!r}")
    per_char = {c: tokenizer.encode(c) for c in chars}  # type: ignore[attr-defined]
    distinct = {tuple(v.tolist() if hasattr(v, "tolist") else v) for v in per_char.values()}
    if len(distinct) != len(chars):
        raise CheckFailed("two different characters got the same id")
    back = tokenizer.decode(ids)  # type: ignore[attr-defined]
    if back != text:
        at = next(
            (i for i, (a, b) in enumerate(zip(back, text, strict=False)) if a != b),
            min(len(back), len(text)),
        )
        raise CheckFailed(
            f"decode(encode(text)) differs from the text at character {at}: "
            f"expected {text[at : at + 10]!r}, got {back[at : at + 10]!r}"
        )


def check_causal_mask(mask_fn: Callable[[int], Tensor], T: int = 5) -> None:
    """mask_fn(T) is a (T, T) bool tensor, True where query i may attend key j, i.e. j <= i."""
    m = mask_fn(T)
    if not isinstance(m, Tensor) or m.dtype != torch.bool:
        raise CheckFailed(f"the mask must be a bool tensor, got {getattr(m, 'dtype', type(m))}")
    _shape("causal mask", m, (T, T))
    expected = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if torch.equal(m, expected):
        return
    if torch.equal(m, ~expected):
        raise CheckFailed(
            "the mask is inverted: True must mean 'may attend' (the key is not in the future)"
        )
    if torch.equal(m, expected.T):
        raise CheckFailed("the mask is transposed: row i is query i, which may see keys 0..i")
    if torch.equal(m, torch.tril(expected, diagonal=-1)):
        raise CheckFailed("a token must be able to attend to itself: the diagonal must be True")
    wrong = int((m != expected).sum())
    raise CheckFailed(f"{wrong} of {T * T} entries differ from the lower-triangular mask (j <= i)")


def _draw(sample: Callable[..., Tensor], logits: Tensor, **kwargs: object) -> Tensor:
    ids = sample(logits.clone(), **kwargs)
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point:
        raise CheckFailed(f"sample must return integer ids, got {getattr(ids, 'dtype', type(ids))}")
    ids = ids.reshape(-1)
    _shape("sampled ids", ids, (logits.shape[0],))
    if int(ids.min()) < 0 or int(ids.max()) >= logits.shape[1]:
        raise CheckFailed(f"sampled ids must lie in [0, {logits.shape[1]})")
    return ids


def check_sampler(sample: Callable[..., Tensor], n: int = 4000, tol: float = 0.035) -> None:
    """sample(logits (B, V), temperature=, top_k=, top_p=, generator=) -> ids (B,) or (B, 1).

    Probes four tokens with probabilities 0.05, 0.5, 0.15, 0.3: temperature 0 is argmax;
    temperature scales logits; top-k and top-p never pick outside their set, and what they keep
    is drawn in proportion to its probability.
    """
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log().expand(n, 4).contiguous()
    gen = torch.Generator().manual_seed(0)

    def freq(ids: Tensor) -> list[float]:
        return (torch.bincount(ids, minlength=4).float() / n).tolist()

    def draw(**kw: object) -> Tensor:
        kw = {"temperature": 1.0, "top_k": None, "top_p": None, **kw}
        return _draw(sample, logits, generator=gen, **kw)

    greedy = freq(draw(temperature=0.0))
    if greedy[1] != 1.0:
        raise CheckFailed(
            f"temperature=0 must always pick the most likely token (id 1); it did {greedy[1]:.1%} "
            "of the time"
        )
    for t in (1.0, 0.5):
        want = torch.softmax(probs.log() / t, -1).tolist()
        got = freq(draw(temperature=t))
        if abs(got[1] - want[1]) > tol:
            hint = ""
            if t != 1.0 and abs(got[1] - 0.5) <= tol:
                hint = "the temperature was ignored: "
            elif t != 1.0:
                hint = "divide the logits by the temperature (before the softmax): "
            raise CheckFailed(
                f"{hint}at temperature {t} token 1 should be drawn with probability "
                f"{want[1]:.3f}, got {got[1]:.3f}"
            )
    for kw, keep, what in (
        ({"top_k": 2}, {1, 3}, "top_k=2 keeps the 2 most likely tokens (1 and 3)"),
        ({"top_p": 0.7}, {1, 3}, "top_p=0.7 keeps the smallest set reaching 0.7: tokens 1 and 3"),
        ({"top_p": 0.4}, {1}, "top_p=0.4 keeps only token 1 (0.5 already reaches 0.4)"),
    ):
        got = freq(draw(**kw))
        outside = [i for i in range(4) if i not in keep and got[i] > 0]
        if outside:
            raise CheckFailed(f"{what}, but token {outside[0]} was drawn {got[outside[0]]:.1%}")
        missing = [i for i in keep if got[i] == 0]
        if missing:
            raise CheckFailed(f"{what}, but token {missing[0]} was never drawn")
        if keep == {1, 3} and abs(got[1] - 0.625) > tol:
            raise CheckFailed(
                f"{what}, drawn in proportion 0.5 : 0.3, so token 1 at 0.625; got {got[1]:.3f}"
            )


def check_cached_generation(
    generate_cached: Callable[[Tensor, int], Tensor],
    generate_reference: Callable[[Tensor, int], Tensor],
    vocab_size: int,
    n_new: int = 12,
) -> None:
    """Greedy tokens with a KV cache equal greedy tokens recomputed from scratch."""
    prompt = torch.tensor([[1, 2, 3, 4]]) % vocab_size
    with torch.no_grad():
        fast, slow = generate_cached(prompt, n_new), generate_reference(prompt, n_new)
    _shape("generated ids", fast, tuple(slow.shape))
    if not torch.equal(fast[:, :4], prompt):
        raise CheckFailed("the prompt must be kept at the start of the output")
    diff = (fast != slow).nonzero()
    if len(diff):
        b, t = diff[0].tolist()
        raise CheckFailed(
            f"with the cache, new token {t - 4} (position {t}) is {int(fast[b, t])}; recomputing "
            f"everything gives {int(slow[b, t])} (are positions continued from the cache, and "
            "is only the new token fed after the prompt?)"
        )


def check_train_step(
    train_step: Callable[[nn.Module, torch.optim.Optimizer, Tensor, Tensor], float],
    steps: int = 40,
) -> None:
    """train_step(model, optimizer, x, y) -> the batch's loss before the update, as a number.

    The loss must be the next-token cross-entropy of model(x) (B, T, V) against y (B, T); one
    step must lower it; repeated on one batch it must fall below half (a model memorises one
    batch easily).
    """
    from lamina.models.gpt import GPT  # checks sit above the models

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=16, block_size=8, d_model=32, n_heads=2, n_layers=1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        x, y = torch.randint(0, 16, (4, 8)), torch.randint(0, 16, (4, 8))

        def loss_now() -> float:
            with torch.no_grad():
                return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()

        model.train()
        before = loss_now()
        got = train_step(model, opt, x, y)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(
                f"train_step must return the loss as a number (loss.item()), got {type(got).__name__}"
            ) from None
        if abs(got - before) > 1e-3:
            raise CheckFailed(
                f"train_step returned {got:.4f}, but the cross-entropy of model(x) against y "
                f"before the update is {before:.4f} (flatten the logits to (B*T, V) and the "
                "targets to (B*T,), and return the loss computed before optimizer.step())"
            )
        after = loss_now()
        if after >= before - 1e-4:
            raise CheckFailed(
                f"one step did not lower the loss on its own batch ({before:.3f} -> {after:.3f}): "
                "are loss.backward() and optimizer.step() called?"
            )
        for _ in range(steps):
            train_step(model, opt, x, y)
        last = loss_now()
        if last > 0.5 * before:
            raise CheckFailed(
                f"after {steps + 1} steps on one batch the loss is {last:.3f}, from {before:.3f}; "
                "it should fall below half (are the gradients zeroed at every step?)"
            )
