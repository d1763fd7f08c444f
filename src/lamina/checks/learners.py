"""Checks and a report helper for learners' code: the lessons' self-check cells.

``report(name, check, *args)`` prints PASS or FAIL with the check's message (raising too under
``LAMINA_LESSON_STRICT=1``). The checks here test the pieces a learner writes in the lessons
(a character tokenizer, a causal mask, a sampler, cached generation, a training step), and
their messages guess the classic mistake behind a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.checks.base import expect_shape
from lamina.errors import CheckFailed
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT


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
    expect_shape("causal mask", m, (T, T))
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
    expect_shape("sampled ids", ids, (logits.shape[0],))
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
    expect_shape("generated ids", fast, tuple(slow.shape))
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
