"""Checks of the pieces a learner writes to fine-tune a chat model (lesson 7).

    check_chat_render(render, tokenizer)       render(messages, add_generation_prompt) -> str
        equals the tokenizer's own chat template (tokenizer.render_chat_text) on a few chats
    check_lora_linear(cls)                     cls(base, r=, alpha=, dropout=): a LoRA linear
        with a frozen base, `A` (r, in), `B` (out, r), `scaling` = alpha / r; step 0 is the base,
        and with B set it equals lamina's LoRALinear and the merged W + scaling B A
    check_assistant_mask(fn, tokenizer)        fn(messages, tokenizer) -> (ids, labels): the
        conversation's ids, labels = the id on assistant tokens (tokenizer.chat_with_mask:
        the reply and the end-of-turn token closing it), -100 everywhere else

Like learners.py, each raises CheckFailed with what is wrong and a guess at the mistake. The
tokenizer is anything with lamina's PretrainedTokenizer interface (chat_template,
render_chat_text, chat_with_mask, encode, token_text, eot_ids); the checks know no model file.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.checks.base import expect_shape
from lamina.errors import CheckFailed
from lamina.lora import LoRAConfig, LoRALinear

IGNORE = -100  # the label cross_entropy skips (its default ignore_index)

CHATS: tuple[tuple[list[dict[str, str]], bool], ...] = (
    ([{"role": "user", "content": "Hi!"}], True),
    ([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}], False),
    (
        [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "2 + 2 = 4."},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Two lines, please."},
            {"role": "assistant", "content": "Roses are red,\nviolets are blue."},
            {"role": "user", "content": "Thanks"},
            {"role": "assistant", "content": "You're welcome!"},
        ],
        False,
    ),
)


def _chat_tokenizer(tokenizer: Any) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise CheckFailed("this tokenizer has no chat template to compare with")


def _around(text: str, at: int, width: int = 24) -> str:
    return repr(text[max(0, at - width) : at + width])


def check_chat_render(render: Callable[[list[dict], bool], str], tokenizer: Any) -> None:
    """render(messages, add_generation_prompt) writes each chat of CHATS exactly as the
    tokenizer's chat template does."""
    _chat_tokenizer(tokenizer)
    for n, (messages, gen) in enumerate(CHATS):
        want = tokenizer.render_chat_text(copy.deepcopy(messages), gen)
        got = render(copy.deepcopy(messages), gen)
        if not isinstance(got, str):
            raise CheckFailed(f"render must return the text (a str), got {type(got).__name__}")
        if got == want:
            continue
        roles = ", ".join(m["role"] for m in messages)
        where = f"chat {n} ({roles}; add_generation_prompt={gen})"
        if messages[0]["role"] != "system" and want.count("system") > got.count("system"):
            raise CheckFailed(
                f"{where}: the template writes a system turn first when the conversation has "
                "none (its default system message); yours does not"
            )
        other = tokenizer.render_chat_text(copy.deepcopy(messages), not gen)
        short, long = (other, want) if gen else (want, other)
        header = long[len(short) :] if long.startswith(short) else ""
        if gen and header and not got.endswith(header):
            raise CheckFailed(
                f"{where}: with add_generation_prompt=True the text ends with the assistant's "
                f"header {header!r}, where the model's reply will start"
            )
        if not gen and header and got == want + header:
            raise CheckFailed(
                f"{where}: add_generation_prompt=False: no assistant header at the end"
            )
        if got.count("\n") != want.count("\n"):
            raise CheckFailed(
                f"{where}: {got.count(chr(10))} newlines, the template writes "
                f"{want.count(chr(10))} (ChatML: one after the role, one after each <|im_end|>)"
            )
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        at = min(len(got), len(want)) if at is None else at
        raise CheckFailed(
            f"{where} differs from the template at character {at}: expected {_around(want, at)}, "
            f"got {_around(got, at)}"
        )


# -- LoRA -------------------------------------------------------------------------------------


def _weight(layer: nn.Module, name: str) -> Tensor:
    """layer.A / layer.B as a tensor: a Parameter, or a bias-free nn.Linear's weight."""
    part = getattr(layer, name, None)
    if isinstance(part, nn.Linear):
        if part.bias is not None:
            raise CheckFailed(f"{name} must have no bias (nn.Linear(..., bias=False))")
        part = part.weight
    if not isinstance(part, Tensor):
        raise CheckFailed(
            f"the LoRA layer needs an attribute {name}: a parameter of shape "
            f"{'(r, in_features)' if name == 'A' else '(out_features, r)'}"
        )
    return part


def _check_init(layer: nn.Module, base: nn.Linear, r: int, alpha: float) -> tuple[Tensor, Tensor]:
    a, b = _weight(layer, "A"), _weight(layer, "B")
    expect_shape("A (r, in_features)", a, (r, base.in_features))
    expect_shape("B (out_features, r)", b, (base.out_features, r))
    scaling = getattr(layer, "scaling", None)
    if not isinstance(scaling, (int, float)) or not math.isclose(scaling, alpha / r):
        hint = " (alpha / r, not alpha)" if scaling == alpha else ""
        raise CheckFailed(f"scaling should be alpha / r = {alpha / r:g}{hint}, got {scaling!r}")
    if bool(b.detach().ne(0).any()):
        raise CheckFailed("B must start at zero, so that the adapted layer starts as the base")
    if not bool(a.detach().ne(0).any()):
        raise CheckFailed(
            "A must start random (B at zero): with both at zero neither ever gets a gradient"
        )
    bound = 1 / math.sqrt(base.in_features)
    top = float(a.detach().abs().max())
    if top > bound * (1 + 1e-5) or float(a.detach().std()) < 0.3 * bound:
        raise CheckFailed(
            f"initialise A as nn.Linear initialises its weight, nn.init.kaiming_uniform_(A, "
            f"a=math.sqrt(5)): uniform in +-1/sqrt(in_features) = +-{bound:.3f}; yours reaches "
            f"{top:.3f} with std {float(a.detach().std()):.3f}"
        )
    return a, b


def _check_trainable(layer: nn.Module, base: nn.Linear, a: Tensor, b: Tensor) -> None:
    if any(p.requires_grad for p in base.parameters()):
        raise CheckFailed("freeze the base: requires_grad_(False) on its weight and bias")
    extra = [
        n for n, p in layer.named_parameters() if p.requires_grad and p is not a and p is not b
    ]
    if extra or not (a.requires_grad and b.requires_grad):
        raise CheckFailed(
            f"only A and B are trained; trainable: "
            f"{[n for n, p in layer.named_parameters() if p.requires_grad]}"
        )


def _reference(base: nn.Linear, a: Tensor, b: Tensor, r: int, alpha: float) -> LoRALinear:
    ref = LoRALinear(
        copy.deepcopy(base), [("q", base.out_features)], ["q"], LoRAConfig(r, alpha, 0.0)
    )
    with torch.no_grad():
        ref.lora_A["q"].copy_(a)
        ref.lora_B["q"].copy_(b)
    return ref.eval()


def check_lora_linear(cls: Callable[..., nn.Module], d_in: int = 64, d_out: int = 24) -> None:
    """cls(base, r=, alpha=, dropout=) wraps the nn.Linear `base`: the base frozen, A (r, in)
    Kaiming-uniform, B (out, r) zero, scaling alpha / r, and
    forward(x) = base(x) + scaling * (dropout(x) @ A^T) @ B^T, dropout in training mode only."""
    r, alpha = 4, 8.0
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base, x = nn.Linear(d_in, d_out), torch.randn(3, 5, d_in)
        w0 = base.weight.detach().clone()
        layer = cls(base, r=r, alpha=alpha, dropout=0.0)
        a, b = _check_init(layer, base, r, alpha)
        _check_trainable(layer, base, a, b)
        with torch.no_grad():
            plain = base(x)
        layer.eval()
        y = layer(x)
        expect_shape("output", y, plain.shape)
        if not torch.equal(y.detach(), plain):
            raise CheckFailed(
                "with B = 0 the output must be base(x) exactly; it differs by up to "
                f"{float((y.detach() - plain).abs().max()):.3g}"
            )
        layer.train()
        out = layer(x)
        if not out.requires_grad:
            raise CheckFailed("B got no gradient: does forward add the adapter's path?")
        out.pow(2).sum().backward()
        if base.weight.grad is not None:
            raise CheckFailed("the base weight got a gradient: it must stay frozen")
        if b.grad is None or not bool(b.grad.ne(0).any()):
            raise CheckFailed("B got no gradient: does forward add the adapter's path?")
        a.grad = b.grad = None
        with torch.no_grad():
            b.copy_(torch.randn_like(b) * 0.2)
        layer.eval()
        with torch.no_grad():
            got = layer(x)
            ref = _reference(base, a.detach(), b.detach(), r, alpha)
            want = ref(x)
            if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
                raise CheckFailed(
                    "with B set, the output differs from lamina's LoRALinear on the same base, A "
                    f"and B by up to {float((got - want).abs().max()):.3g}: your update "
                    f"{_update_hint(got - plain, want - plain, r, alpha)}; forward is base(x) + "
                    "scaling * (x @ A.T) @ B.T"
                )
            merged = F.linear(x, w0 + (alpha / r) * b @ a, base.bias)
            if not torch.allclose(got, merged, atol=1e-5, rtol=1e-4):
                raise CheckFailed("merging W + scaling * B @ A does not give the same output")
            if not torch.allclose(ref.merged()(x), merged, atol=1e-5, rtol=1e-4):
                raise CheckFailed("lamina's own merge disagrees with W + scaling * B @ A")
        if not torch.equal(base.weight.detach(), w0):
            raise CheckFailed("the base weight changed: the adapter must leave it as it was")
        _check_dropout(cls, d_in, d_out, r, alpha)


def _update_hint(got: Tensor, want: Tensor, r: int, alpha: float) -> str:
    ratio = float((got * want).sum() / want.pow(2).sum().clamp_min(1e-30))
    scaling = alpha / r
    for factor, words in (
        (r, "is scaled by alpha instead of alpha / r"),
        (1 / scaling, "misses the scaling"),
        (scaling, "is scaled twice"),
    ):
        if abs(ratio - factor) < 1e-3 * factor:
            return words
    return f"is {ratio:.3g} times lamina's along it"


def _check_dropout(
    cls: Callable[..., nn.Module], d_in: int, d_out: int, r: int, alpha: float
) -> None:
    base, x = nn.Linear(d_in, d_out), torch.randn(64, d_in)
    layer = cls(base, r=r, alpha=alpha, dropout=0.5).train()
    with torch.no_grad():
        if not torch.equal(layer(x), base(x)):
            raise CheckFailed(
                "in training mode with B = 0 the output must still be base(x): dropout goes on "
                "the adapter's input only, base(x) + scaling * B(A(dropout(x)))"
            )
        b = _weight(layer, "B")
        b.copy_(torch.randn_like(b))
        trained, evaluated = layer(x), layer.eval()(x)
        a = _weight(layer, "A")
        want = base(x) + (alpha / r) * (x @ a.T) @ b.T
    if not torch.allclose(evaluated, want, atol=1e-5, rtol=1e-4):
        raise CheckFailed("in eval mode dropout must be off (use nn.Dropout: eval() turns it off)")
    if torch.allclose(trained, evaluated):
        raise CheckFailed(
            "dropout=0.5 changed nothing in training mode: apply nn.Dropout(dropout) to x before A"
        )


# -- the assistant-only loss mask --------------------------------------------------------------


def _as_list(x: Any, what: str) -> list[int]:
    if isinstance(x, Tensor):
        x = x.tolist()
    if not isinstance(x, Sequence) or isinstance(x, str):
        raise CheckFailed(f"{what} must be a list (or 1-D tensor) of ints, got {type(x).__name__}")
    return [int(v) for v in x]


def _token(tokenizer: Any, ids: list[int], at: int) -> str:
    return repr(tokenizer.token_text(ids[at])) if at < len(ids) else "the end"


def check_assistant_mask(
    fn: Callable[[list[dict], Any], tuple[Sequence[int], Sequence[int]]], tokenizer: Any
) -> None:
    """fn(messages, tokenizer) -> (ids, labels) for each chat of CHATS: ids those of the
    rendered conversation, labels[t] = ids[t] where tokenizer.chat_with_mask is True (assistant
    replies and the end-of-turn token closing each), else -100. Not shifted: the loss shifts."""
    _chat_tokenizer(tokenizer)
    for n, (messages, _) in enumerate(CHATS):
        if not any(m["role"] == "assistant" for m in messages):
            continue
        want_ids, mask = tokenizer.chat_with_mask(copy.deepcopy(messages))
        out = fn(copy.deepcopy(messages), tokenizer)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise CheckFailed("return a pair (ids, labels)")
        ids, labels = _as_list(out[0], "ids"), _as_list(out[1], "labels")
        where = f"chat {n} ({', '.join(m['role'] for m in messages)})"
        if ids != want_ids:
            at = next(
                (i for i, (p, q) in enumerate(zip(ids, want_ids, strict=False)) if p != q), None
            )
            at = min(len(ids), len(want_ids)) if at is None else at

            raise CheckFailed(
                f"{where}: the ids are not those of the conversation as the template renders it "
                f"({len(ids)} ids, "
                f"expected {len(want_ids)}); token {at} is {_token(tokenizer, ids, at)}, expected {_token(tokenizer, want_ids, at)}"
            )
        if len(labels) != len(ids):
            raise CheckFailed(f"{where}: one label per id: {len(labels)} labels for {len(ids)} ids")
        want = [i if m else IGNORE for i, m in zip(ids, mask, strict=True)]
        if labels == want:
            continue
        if labels[:-1] == want[1:]:
            raise CheckFailed(
                f"{where}: the labels are shifted by one: label t is token t's own id (or -100); "
                "the loss shifts them (logits at t predict the label at t + 1)"
            )
        at = next(i for i, (p, q) in enumerate(zip(labels, want, strict=True)) if p != q)
        tok = repr(tokenizer.token_text(ids[at]))
        if labels[at] not in (IGNORE, ids[at]):
            raise CheckFailed(
                f"{where}: token {at} ({tok}) has label {labels[at]}; a label is the token's "
                "own id (trained) or -100 (not trained)"
            )
        if want[at] != IGNORE and ids[at] in tuple(getattr(tokenizer, "eot_ids", ())):
            raise CheckFailed(
                f"{where}: the end-of-turn token {tok} closing an assistant reply is trained "
                "on: it is how the model learns to stop"
            )
        if want[at] != IGNORE:
            raise CheckFailed(
                f"{where}: token {at} ({tok}) is part of an assistant reply: train on it"
            )
        prev = ids[at - 1] if at else None
        if prev in tuple(getattr(tokenizer, "eot_ids", ())):
            raise CheckFailed(
                f"{where}: token {at} ({tok}) comes after the end-of-turn token: not trained on"
            )
        raise CheckFailed(
            f"{where}: token {at} ({tok}) is not part of an assistant reply (a header, a prompt "
            "or the system turn): its label must be -100"
        )
