"""Look inside a trained model: attention maps, next-token tables and what each head does.

    token_labels(tokenizer, ids) -> list[str]                        (one readable label per id)
    forward_with_maps(model, ids) -> (logits (T, vocab), maps (L, H, T, T))
    attention_maps(model, ids) -> maps (L, H, T, T)                  float32, on the CPU
    next_token_table(model, tokenizer, ids, k=5) -> list[NextToken]  (one row per position)
    head_patterns(maps, ids=None, tokens=None) -> L lists of H HeadPattern (ids, tokens: the
                                                      text's ids and labels, for more patterns)

The maps come from the model's own forward, with every attention layer asked for its weights
(`need_weights=True`, the reference softmax path of `lamina.attention`): a forward pre-hook
sets that argument and a forward hook keeps the weights. There is no second implementation of
attention here, and the logits that come back are the ones that path computed (a test holds
them, and each layer's attention output, equal to the SDPA forward). Rows are queries, columns
keys; row i sums to 1 over keys 0..i for a causal model.

Head patterns, the simple documented score: for each head, over the query rows i >= 1 (row 0
can only attend to itself), the mean attention mass that a pattern predicts:
    previous token   A[i, i-1]
    first token      A[i, 0]
    own position     A[i, i]
    same token       sum of A[i, j] over j < i with ids[j] == ids[i]   (needs ids; rows with
                     no earlier copy of their token are left out)
    induction        sum of A[i, j] over 0 < j <= i with ids[j-1] == ids[i] (attends to what
                     came after an earlier copy of the current token; needs ids)
    recent           sum of A[i, j] over i-8 <= j <= i-2 (a local window, the previous token
                     and the query's own position left to their own patterns)
    fixed key        the largest, over keys 1 <= j <= T/2, of the mean of A[i, j] over the
                     queries i > j: one earlier token (a newline, a comma) that many later
                     queries look at; the caption names it
    line start       A[i, s] where s follows the latest earlier token holding a newline
    word start       A[i, s] where s follows the latest earlier whitespace token
                     (both need the tokens' text; rows where s is 0, i-1 or i are left out, so
                     the pattern is not the first token, previous token or own position again)
    broad            the attention's entropy over keys 0..i divided by log(i + 1)
                     (1 = spread evenly over everything seen, 0 = one key)
The pattern with the highest score names the head; below 0.3 the head is called "mixed".

Texts become ids through `lamina.generation.encode_prompt` (the one prompt encoder), called by
whoever holds the text (the attention verb, the playground); here everything is ids.

Deliberately unaware of pictures, files and the command line (`lamina.pictures` draws, the
`attention` verb writes); knows models only through their public forward and their attention
modules.
"""

from __future__ import annotations

import inspect as _pyinspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lamina.attention import MultiHeadAttention
from lamina.errors import LaminaError
from lamina.modes import eval_mode

MIXED_BELOW = 0.3
PATTERNS = (
    "previous token",
    "first token",
    "own position",
    "same token",
    "induction",
    "recent",
    "fixed key",
    "line start",
    "word start",
    "broad",
)


@dataclass
class HeadPattern:
    """The most typical pattern of one head: its name, score and every pattern's score."""

    layer: int
    head: int
    name: str
    score: float
    scores: dict[str, float] = field(default_factory=dict)
    detail: str = ""  # e.g. which key a "fixed key" head looks at

    def caption(self) -> str:
        return f"{self.name}{self.detail} ({self.score:.2f})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "name": self.name,
            "score": self.score,
            "scores": dict(self.scores),
            "detail": self.detail,
        }


@dataclass
class NextToken:
    """What the model expected after position `position` (whose token is `token`).

    top: the k most likely next tokens, (label, id, probability), most likely first.
    actual / p_actual: the token that came next in the text and the probability the model gave
    it; None at the last position.
    """

    position: int
    token: str
    top: list[tuple[str, int, float]]
    actual: str | None
    p_actual: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "token": self.token,
            "top": [{"token": t, "id": i, "p": p} for t, i, p in self.top],
            "actual": self.actual,
            "p_actual": self.p_actual,
        }


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each id decoded alone (a part of a multi-byte character shows as U+FFFD)."""
    return [tokenizer.decode([int(i)]) for i in ids]


def _as_batch(model: nn.Module, ids: Tensor | Sequence[int]) -> Tensor:
    t = ids if isinstance(ids, Tensor) else torch.as_tensor(list(ids), dtype=torch.long)
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise LaminaError(f"ids must be one sequence of token ids (T,), got {tuple(t.shape)}")
    if t.numel() == 0:
        raise LaminaError("ids is empty: give at least one token")
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and (int(t.min()) < 0 or int(t.max()) >= vocab):
        raise LaminaError(f"token ids must be in [0, {vocab}), got {t.min()}..{t.max()}")
    block = getattr(config, "block_size", None)
    if block is not None and t.numel() > block:
        raise LaminaError(f"{t.numel()} tokens are more than the model's block_size {block}")
    device = next(model.parameters()).device
    return t.to(device=device, dtype=torch.long)[None]


def attention_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """The model's attention modules, in forward order (one per layer)."""
    found = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not found:
        raise LaminaError(f"{type(model).__name__} has no lamina attention layers to look into")
    return found


def forward_with_maps(model: nn.Module, ids: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
    """One forward in eval mode, every attention layer on its weights path.

    ids: (T,) or (1, T). Returns (the model's output for the sequence, e.g. logits (T, vocab);
    maps (L, H, T, T) float32 on the CPU).
    """
    batch = _as_batch(model, ids)
    layers = attention_layers(model)
    kept: dict[int, Tensor] = {}
    handles = []

    def ask_for_weights(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = _pyinspect.signature(module.forward).bind(*args, **kwargs)
        bound.arguments["need_weights"] = True
        return bound.args, bound.kwargs

    for n, layer in enumerate(layers):

        def keep(module: nn.Module, args: tuple, output: Any, n: int = n) -> None:
            kept[n] = output[1]

        handles.append(layer.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
        handles.append(layer.register_forward_hook(keep))
    try:
        with eval_mode(model), torch.no_grad():
            out = model(batch)
    finally:
        for h in handles:
            h.remove()
    if len(kept) != len(layers) or any(w is None for w in kept.values()):
        raise LaminaError("the model's forward did not return attention weights from every layer")
    maps = torch.stack([kept[n][0].float().cpu() for n in range(len(layers))])
    out = out[0] if isinstance(out, Tensor) and out.dim() >= 2 and out.shape[0] == 1 else out
    return out, maps


def attention_maps(model: nn.Module, ids: Tensor | Sequence[int]) -> Tensor:
    """Attention weights of every layer and head: (L, H, T, T), queries by keys, float32."""
    return forward_with_maps(model, ids)[1]


def next_token_table(
    model: nn.Module, tokenizer: Any, ids: Sequence[int], k: int = 5
) -> list[NextToken]:
    """Per position of `ids`: the top-k next tokens and the probability of the one that came."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise LaminaError(f"k must be a positive integer, got {k!r}")
    ids = [int(i) for i in ids]
    return table_from_logits(forward_with_maps(model, ids)[0], tokenizer, ids, k)


def table_from_logits(
    logits: Tensor, tokenizer: Any, ids: Sequence[int], k: int
) -> list[NextToken]:
    """Rows of `next_token_table` from logits (T, vocab) already computed for `ids`."""
    if logits.dim() != 2 or logits.shape[0] != len(ids):
        raise LaminaError(f"expected logits ({len(ids)}, vocab), got {tuple(logits.shape)}")
    probs = torch.softmax(logits.float(), dim=-1).cpu()
    k = min(k, probs.shape[-1])
    top_p, top_i = probs.topk(k, dim=-1)
    labels = token_labels(tokenizer, ids)
    rows = []
    for t in range(len(ids)):
        top = [
            (tokenizer.decode([i]), i, float(p))
            for p, i in zip(top_p[t].tolist(), top_i[t].tolist(), strict=True)
        ]
        nxt = int(ids[t + 1]) if t + 1 < len(ids) else None
        rows.append(
            NextToken(
                position=t,
                token=labels[t],
                top=top,
                actual=None if nxt is None else labels[t + 1],
                p_actual=None if nxt is None else float(probs[t, nxt]),
            )
        )
    return rows


def _start_after(tokens: Sequence[str], i: int, test: Any) -> int:
    """The position after the latest j < i whose token passes `test` (0 if none)."""
    for j in range(i - 1, -1, -1):
        if test(tokens[j]):
            return j + 1
    return 0


def pattern_scores(
    attn: Tensor, ids: Sequence[int] | None = None, tokens: Sequence[str] | None = None
) -> dict[str, float]:
    """The scores of the module docstring for one head's (T, T) map (T >= 2)."""
    T = attn.shape[-1]
    a = attn.float()
    rows = torch.arange(1, T)
    scores = {
        "previous token": float(a[rows, rows - 1].mean()),
        "first token": float(a[rows, 0].mean()),
        "own position": float(a[rows, rows].mean()),
        "recent": sum(float(a[i, max(0, i - 8) : max(0, i - 1)].sum()) for i in range(1, T))
        / (T - 1),
    }
    if tokens is not None:
        for name, test in (
            ("line start", lambda t: "\n" in t),
            ("word start", lambda t: t.isspace()),
        ):
            got = []
            for i in range(1, T):
                s = _start_after(tokens, i, test)
                if s not in (0, i - 1, i):
                    got.append(float(a[i, s]))
            if got:
                scores[name] = sum(got) / len(got)
    if ids is not None:
        same, after = [], []
        for i in range(1, T):
            earlier = [j for j in range(i) if ids[j] == ids[i]]
            if earlier:
                same.append(float(a[i, earlier].sum()))
            nexts = [j for j in range(1, i + 1) if ids[j - 1] == ids[i]]
            if nexts:
                after.append(float(a[i, nexts].sum()))
        if same:
            scores["same token"] = sum(same) / len(same)
        if after:
            scores["induction"] = sum(after) / len(after)
    # after line/word start: on a tie (one newline) the more telling name wins
    if T >= 3:
        keys = torch.arange(1, T // 2 + 1)
        means = torch.stack([a[j + 1 :, j].mean() for j in keys.tolist()])
        scores["fixed key"] = float(means.max())
        scores["fixed key at"] = float(keys[int(means.argmax())])
    ent = []
    for i in range(1, T):
        p = a[i, : i + 1].clamp_min(1e-12)
        ent.append(float(-(p * p.log()).sum()) / math.log(i + 1))
    scores["broad"] = sum(ent) / len(ent)
    return scores


def head_patterns(
    maps: Tensor, ids: Sequence[int] | None = None, tokens: Sequence[str] | None = None
) -> list[list[HeadPattern]]:
    """Name each head's most typical pattern: maps (L, H, T, T) -> L lists of H patterns.

    ids / tokens: the text's token ids and labels (`token_labels`), which the same-token,
    induction, line-start and word-start patterns need; without them those are not scored.
    """
    if not isinstance(maps, Tensor) or maps.dim() != 4 or maps.shape[-1] != maps.shape[-2]:
        shape = tuple(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
        raise LaminaError(f"maps must be a (L, H, T, T) tensor, got {shape}")
    L, H, T, _ = maps.shape
    if ids is not None and len(ids) != T:
        raise LaminaError(f"ids has {len(ids)} tokens, the maps {T}")
    if tokens is not None and len(tokens) != T:
        raise LaminaError(f"tokens has {len(tokens)} labels, the maps {T}")
    out = []
    for layer in range(L):
        row = []
        for head in range(H):
            if T < 2:
                row.append(HeadPattern(layer, head, "one token only", 1.0, {}))
                continue
            scores = pattern_scores(maps[layer, head], ids, tokens)
            at = int(scores.pop("fixed key at", 0))
            name = max(scores, key=scores.__getitem__)
            score = scores[name]
            detail = ""
            if score < MIXED_BELOW:
                name = "mixed"
            elif name == "fixed key":
                detail = f" {tokens[at]!r} at {at}" if tokens is not None else f" {at}"
            row.append(HeadPattern(layer, head, name, score, scores, detail))
        out.append(row)
    return out
