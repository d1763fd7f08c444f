"""Multiple-choice log-likelihood, scored the way lm-evaluation-harness scores it.

    ChoiceItem(context, choices, gold)                 one question (tasks.py reads them)
    encode_pair(tokenizer, context, continuation) -> (context ids, continuation ids)
    score_items(model, tokenizer, items, delimiter=" ", method="cache") -> [ItemScore]
    accuracy(scores) -> {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "items"}

The rules are lm-eval's (lm_eval/api/model.py `_encode_pair`, models/huggingface.py
`_loglikelihood_tokens`, api/task.py `process_results` for `multiple_choice`):
- each choice is the continuation `delimiter + choice` (lm-eval's `target_delimiter`, " ");
- trailing whitespace of the context moves to the front of the continuation;
- the context and context + continuation are encoded separately (each with what the
  tokenizer puts in front of a prompt: BOS where `add_bos`); the continuation's tokens are
  the tail of the whole encoding after as many tokens as the context alone has, and the
  model reads context ids + those tail ids (so a merge across the boundary is resolved as
  lm-eval resolves it);
- an empty context is the BOS id (else EOS) alone, as lm-eval's `prefix_token_id`;
- a sequence longer than block_size + 1 tokens loses tokens from the left (a choice longer than
  block_size itself has only its last block_size tokens scored, where lm-eval stops);
- a choice's log-likelihood is the sum of its tokens' log-probabilities (log_softmax in fp32);
- `acc`: the arg-max log-likelihood is the gold; `acc_norm`: the arg-max of log-likelihood /
  len(choice) in characters (the choice without the delimiter); ties go to the first;
- standard errors are the sample standard error of the mean, sqrt(sum (x - mean)^2 / (n - 1))
  / sqrt(n), lm-eval's `mean_stderr`.

Two ways to run the model, which agree (tests/test_evals_choice.py):
- "cache": the context is run once per item into KV caches, their rows copied to one per
  choice, then the choices' tokens run as one right-padded batch continuing from the cache;
- "batch": every choice row is context + continuation, several items' rows per forward
  (right padding; a causal model's real positions never see the pads).
bench/eval_parity.py measures which is faster. Items that do not fit the block fall back to
"batch" (their rows are cut from the left one by one, as lm-eval cuts them).
Memory is bounded whatever the sizes: no forward holds more than LOGIT_BUDGET logits (2^25,
128 MiB in fp32), MAX_CHUNK positions or MAX_ROWS rows; a long row runs in chunks of positions
through KV caches, many choices run in batches of rows (the same sums as one forward).

Deliberately unaware of files, task formats and the command line; takes a model and a
tokenizer, never opens a model itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.modes import eval_mode

Method = Literal["cache", "batch"]
METHODS: tuple[str, ...] = ("cache", "batch")


@dataclass(frozen=True)
class ChoiceItem:
    """A context, two or more choices (continuations) and the index of the right one."""

    context: str
    choices: tuple[str, ...]
    gold: int


@dataclass(frozen=True)
class ItemScore:
    """One item's log-likelihoods (one per choice) and what they pick."""

    logliks: tuple[float, ...]
    lengths: tuple[int, ...]  # characters of each choice (acc_norm's divisor)
    tokens: tuple[int, ...]  # continuation tokens of each choice
    gold: int

    @property
    def pred(self) -> int:
        return _argmax(self.logliks)

    @property
    def pred_norm(self) -> int:
        return _argmax([ll / max(n, 1) for ll, n in zip(self.logliks, self.lengths, strict=True)])

    @property
    def acc(self) -> float:
        return float(self.pred == self.gold)

    @property
    def acc_norm(self) -> float:
        return float(self.pred_norm == self.gold)


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


# -- encoding ----------------------------------------------------------------------------------
def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as a prompt: the tokenizer's `encode_prompt` (BOS where it adds one), else encode."""
    encode = getattr(tokenizer, "encode_prompt", None) or tokenizer.encode
    return list(encode(text))


def prefix_id(tokenizer: Any) -> int:
    """The id an empty context stands for: BOS, else EOS (lm-eval's `prefix_token_id`)."""
    for name in ("bos_id", "eos_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    eot = tokenizer.special_tokens.get("<|endoftext|>")
    if eot is None:
        raise LaminaError(
            "an item has an empty context, and this tokenizer has no BOS or EOS token to stand "
            "for it; give every item a context"
        )
    return int(eot)


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) by lm-eval's rule (see the module docstring)."""
    if context == "":
        cont = list(tokenizer.encode(continuation))
        first = prefix_id(tokenizer)
        return ([first], cont) if not cont or cont[0] != first else (cont[:1], cont[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = prompt_ids(tokenizer, context + continuation)
    ctx = prompt_ids(tokenizer, context)
    return ctx, whole[len(ctx) :]


def encode_item(
    tokenizer: Any, item: ChoiceItem, delimiter: str = " "
) -> tuple[list[int], list[list[int]]]:
    """The context's ids and each choice's continuation ids (every choice has at least one)."""
    pairs = [encode_pair(tokenizer, item.context, delimiter + c) for c in item.choices]
    for i, (_, cont) in enumerate(pairs):
        if not cont:
            raise LaminaError(f"choice {i} ({item.choices[i]!r}) encodes to no tokens")
    return pairs[0][0], [cont for _, cont in pairs]  # the context encodes alike for every choice


# -- running the model -------------------------------------------------------------------------
def _block_size(model: nn.Module) -> int:
    return int(model.config.block_size)


def _device(model: nn.Module) -> torch.device:
    ref = getattr(model, "reference_tensor", None)
    return ref().device if ref is not None else next(model.parameters()).device


LOGIT_BUDGET = 2**25  # logits (rows x positions x vocab, fp32) of one forward: 128 MiB
MAX_CHUNK = 1024  # positions per forward (the attention's scores grow with it)
MAX_ROWS = 64  # choice rows per forward (their KV caches and activations grow with them)


def _sum_logp(
    model: nn.Module, ids: Tensor, spans: list[tuple[int, list[int]]], caches: Any = None
) -> list[float]:
    """Per row r of ids (R, W): the sum of log_softmax(logits)[t, targets[t - start]] over the
    positions t that row's (start, targets) span covers (logits at t predict token t + 1).

    The positions run in chunks of at most LOGIT_BUDGET / (R x vocab) and MAX_CHUNK, continuing
    through KV caches (the caller's, which may already hold a context, or new ones), so no
    forward holds more than LOGIT_BUDGET logits whatever W is; the sums equal one forward's."""
    R, W = ids.shape
    step = max(1, min(W, MAX_CHUNK, LOGIT_BUDGET // (R * int(model.config.vocab_size))))
    if step < W and caches is None:
        caches = model.make_caches(R, W)
    totals = [0.0] * R
    for a in range(0, W, step):
        b = min(W, a + step)
        logp = F.log_softmax(model(ids[:, a:b], caches=caches).float(), dim=-1)
        for r, (start, targets) in enumerate(spans):
            lo, hi = max(a, start), min(b, start + len(targets))
            if lo < hi:
                idx = torch.tensor(targets[lo - start : hi - start], device=logp.device)
                totals[r] += float(logp[r, lo - a : hi - a].gather(1, idx[:, None]).sum())
    return totals


def _rows_per_forward(width: int, vocab: int) -> int:
    return max(1, min(MAX_ROWS, LOGIT_BUDGET // max(1, width * vocab)))


def _rows_batch(
    model: nn.Module, rows: list[tuple[list[int], list[int]]], pad: int = 0
) -> list[float]:
    """Log-likelihood of each (context, continuation) row: right-padded forwards of as many
    rows as fit the budgets (see `_sum_logp`)."""
    limit = _block_size(model) + 1
    inputs = [(ctx + cont)[-limit:][:-1] for ctx, cont in rows]
    out: list[float] = []
    group = _rows_per_forward(max(len(x) for x in inputs), int(model.config.vocab_size))
    for g in range(0, len(rows), group):
        xs, conts = inputs[g : g + group], [cont for _, cont in rows[g : g + group]]
        ids = torch.full((len(xs), max(len(x) for x in xs)), pad, dtype=torch.long)
        spans = []
        for r, (x, cont) in enumerate(zip(xs, conts, strict=True)):
            ids[r, : len(x)] = torch.tensor(x)
            scored = cont[-len(x) :]  # a choice longer than the block: its last tokens
            spans.append((len(x) - len(scored), scored))
        out += _sum_logp(model, ids.to(_device(model)), spans)
    return out


def _item_cached(model: nn.Module, ctx: list[int], conts: list[list[int]]) -> list[float]:
    """The context once into KV caches, then the choices in batches continuing from it."""
    longest = max(len(c) for c in conts)
    device = _device(model)
    context = model.make_caches(1, len(ctx))
    first = model(torch.tensor([ctx], device=device), caches=context, last_only=True)[0, -1]
    first_logp = F.log_softmax(first.float(), dim=-1)
    totals = [float(first_logp[c[0]]) for c in conts]
    if longest == 1:
        return totals
    group = min(len(conts), _rows_per_forward(longest - 1, int(model.config.vocab_size)))
    caches = model.make_caches(group, len(ctx) + longest - 1)
    for g in range(0, len(conts), group):
        rows = conts[g : g + group]
        for cache, ctx_cache in zip(caches, context, strict=True):  # each row from the context
            cache.k[: len(rows), :, : len(ctx)] = ctx_cache.k[:1, :, : len(ctx)]
            cache.v[: len(rows), :, : len(ctx)] = ctx_cache.v[:1, :, : len(ctx)]
            cache.pos = len(ctx)
        width = max(len(c) for c in rows) - 1
        ids = torch.zeros((len(rows), max(width, 1)), dtype=torch.long)
        for r, c in enumerate(rows):
            ids[r, : len(c) - 1] = torch.tensor(c[:-1])
        spans = [(0, c[1:]) for c in rows]
        for r, ll in enumerate(_sum_logp(model, ids.to(device), spans, caches)):
            totals[g + r] += ll
    return totals


@torch.no_grad()
def score_items(
    model: nn.Module,
    tokenizer: Any,
    items: Iterable[ChoiceItem],
    *,
    delimiter: str = " ",
    method: Method = "cache",
    max_tokens: int = 4096,
    progress: Callable[[int], None] | None = None,
) -> list[ItemScore]:
    """Every item's choice log-likelihoods. `max_tokens` caps the padded tokens of one
    "batch" forward (rows x width); `progress(n)` is told after every n items scored."""
    if method not in METHODS:
        raise LaminaError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    limit = _block_size(model) + 1
    encoded = []
    for n, item in enumerate(items, 1):
        try:
            encoded.append((item, *encode_item(tokenizer, item, delimiter)))
        except LaminaError as e:
            raise LaminaError(f"item {n}: {e}") from None
    out: list[ItemScore] = []
    scored: dict[int, list[float]] = {}
    pending: list[int] = []  # items waiting for one "batch" forward
    rows = width = 0  # the pending forward's rows and padded width

    def flush() -> None:
        batch = [(encoded[i][1], c) for i in pending for c in encoded[i][2]]
        logliks, at = _rows_batch(model, batch), 0
        for i in pending:
            k = len(encoded[i][2])
            scored[i], at = logliks[at : at + k], at + k
        if progress is not None:
            progress(len(pending))
        pending.clear()

    with eval_mode(model):
        for i, (_, ctx, conts) in enumerate(encoded):
            if method == "cache" and len(ctx) + max(map(len, conts)) <= limit:
                scored[i] = _item_cached(model, ctx, conts)
                if progress is not None:
                    progress(1)
                continue
            w = max(min(len(ctx) + len(c), limit) - 1 for c in conts)
            if pending and (rows + len(conts)) * max(width, w) > max_tokens:
                flush()
                rows = width = 0
            pending.append(i)
            rows, width = rows + len(conts), max(width, w)
        if pending:
            flush()
    for i, (item, _, conts) in enumerate(encoded):
        lengths = tuple(len(c) for c in item.choices)
        out.append(ItemScore(tuple(scored[i]), lengths, tuple(map(len, conts)), item.gold))
    return out


# -- metrics -----------------------------------------------------------------------------------
def mean_stderr(values: Sequence[float]) -> float:
    """Sample standard error of the mean (n - 1 in the variance), lm-eval's `mean_stderr`;
    NaN for fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


def accuracy(scores: Sequence[ItemScore]) -> dict[str, float | int]:
    """acc and acc_norm (means over items) with their standard errors, and the item count."""
    if not scores:
        raise LaminaError("no items to score")
    acc = [s.acc for s in scores]
    norm = [s.acc_norm for s in scores]
    return {
        "acc": sum(acc) / len(acc),
        "acc_stderr": mean_stderr(acc),
        "acc_norm": sum(norm) / len(norm),
        "acc_norm_stderr": mean_stderr(norm),
        "items": len(scores),
    }


def chance(items: Sequence[ChoiceItem]) -> float:
    """The expected accuracy of picking uniformly at random: mean of 1 / choices."""
    return sum(1 / len(it.choices) for it in items) / len(items) if items else math.nan
