"""Generation: `generate` (all at once) and `stream` (token by token) for a GPT.

    generate(model, ids, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, seed=None,
             stop=None, use_cache=True, ...) -> ids (B, T + n), n <= max_new_tokens
    stream(model, ids, max_new_tokens, ...) -> iterator of Step(tokens (B,), finished (B,))

Prompts: a (B, T) tensor (optionally with `attention_mask` (B, T), 1 at real tokens, left
padded), a 1-D tensor (one prompt), or a list of prompts of any lengths, which are left-padded
with `pad_id`. Each row sees only its own tokens, at positions counted from its first real
token, so a row of a batch gets the same greedy tokens as that prompt alone.

Stopping: a row ends at its first stop (see `stops.py`); the token that completes the stop is
kept, and the row's later tokens are `pad_id`. Generation ends when every row has stopped or
after `max_new_tokens` steps, so the result may be shorter than T + max_new_tokens (only when
all rows stopped). Past block_size the window rule of `decoder.py` applies, to both the cached
and the uncached path.

The model runs in eval mode, without gradients, and is put back in the mode it was in when the
call returns (for `stream`, when the iterator is exhausted or closed). Sampling knows nothing of
the model (`sampling.py`); this module knows tokenizers only to match stop strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.generation.decoder import Decoder
from lamina.generation.fast import compiled_step
from lamina.generation.prompts import MAX_TOKENS
from lamina.generation.sampling import check_sampling, sample
from lamina.generation.stops import Stops, StopSpec
from lamina.models.gpt import GPT
from lamina.modes import eval_mode

Prompts = Tensor | Sequence[Sequence[int] | Tensor]
MAX_SEED = 2**64 - 1  # torch.Generator seeds are 64-bit


class Step(NamedTuple):
    """One decoding step: the new token of each row, and which rows have stopped.

    tokens: (B,) int64; a row that stopped at an earlier step shows `pad_id`.
    finished: (B,) bool; True from the step whose token completes the row's stop.
    """

    tokens: Tensor
    finished: Tensor


def left_pad(
    ids: Prompts, attention_mask: Tensor | None, pad_id: int, device: torch.device
) -> tuple[Tensor, list[int]]:
    """Prompts -> ((B, T) left-padded int64 ids, pad count of each row)."""
    if isinstance(ids, Tensor):
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise LaminaError(f"ids must be integer token ids, got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise LaminaError(f"ids must be a (B, T) or (T,) tensor, got shape {tuple(ids.shape)}")
        ids = ids.to(device=device, dtype=torch.long)
        if attention_mask is None:
            pads = [0] * ids.shape[0]
        else:
            if tuple(attention_mask.shape) != tuple(ids.shape):
                raise LaminaError(
                    f"attention_mask shape {tuple(attention_mask.shape)} != ids shape "
                    f"{tuple(ids.shape)}"
                )
            real = attention_mask.to(torch.bool).cpu()
            pads = (~real).sum(-1).tolist()
            if not all(bool(row[p:].all()) for row, p in zip(real, pads, strict=True)):
                raise LaminaError("attention_mask must be left padding: pads first, then tokens")
    elif isinstance(ids, Sequence) and not isinstance(ids, (str, bytes)):
        if attention_mask is not None:
            raise LaminaError("attention_mask goes with a (B, T) tensor, not a list of prompts")
        rows = [_row(i, r) for i, r in enumerate(ids)]
        if not rows:
            raise LaminaError("no prompts given")
        T = max(len(r) for r in rows)
        out = torch.full((len(rows), T), pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, T - len(r) :] = r
        ids, pads = out.to(device), [T - len(r) for r in rows]
    else:
        raise LaminaError(f"ids must be a tensor or a list of prompts, got {type(ids).__name__}")
    if ids.shape[0] == 0:
        raise LaminaError("no prompts given (batch of 0)")
    empty = [i for i, p in enumerate(pads) if p >= ids.shape[1]]
    if empty:
        raise LaminaError(
            f"prompt {empty[0]} is empty: generation needs at least one token (a start token)"
        )
    return ids, pads


def _row(i: int, row: Any) -> Tensor:
    """One prompt of a list -> 1-D int64; floats (1.5 would become 1) and bools are refused."""
    try:
        t = torch.as_tensor(row)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise LaminaError(f"prompt {i} is not a sequence of token ids ({e})") from None
    if t.numel() and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise LaminaError(f"prompt {i} must hold integer token ids, got dtype {t.dtype}")
    return t.to(torch.long).reshape(-1)


def _check_int(name: str, value: Any, lowest: int, highest: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lowest
        or (highest is not None and value > highest)
    ):
        bound = f">= {lowest}" if highest is None else f"in [{lowest}, {highest}]"
        raise LaminaError(f"{name} must be an integer {bound}, got {value!r}")


def _start(
    model: GPT,
    ids: Prompts,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    stop: StopSpec | None = None,
    tokenizer: Any = None,
    use_cache: bool = True,
    attention_mask: Tensor | None = None,
    pad_id: int = 0,
    window_keep: int | None = None,
    cache_dtype: torch.dtype | None = None,
    fixed_shape: bool = False,
    compile: bool = False,
) -> tuple[Tensor, Iterator[Step]]:
    """Check the arguments, pad the prompts, build the decoder: (prompts (B, T), step iterator)."""
    if not isinstance(model, GPT):
        raise LaminaError(f"generation needs a lamina GPT, got {type(model).__name__}")
    _check_int("max_new_tokens", max_new_tokens, 0, MAX_TOKENS)
    _check_int("pad_id", pad_id, 0)
    if pad_id >= model.config.vocab_size:
        raise LaminaError(f"pad_id {pad_id} is outside [0, vocab_size={model.config.vocab_size})")
    check_sampling(temperature, top_k, top_p)
    if seed is not None and generator is not None:
        raise LaminaError("give seed or generator, not both")
    if seed is not None:
        _check_int("seed", seed, 0, MAX_SEED)
    device = model.reference_tensor().device
    prompts, pads = left_pad(ids, attention_mask, pad_id, device)
    B, T = prompts.shape
    if B * (T + max_new_tokens) > MAX_TOKENS:
        raise LaminaError(
            f"{B} prompt(s) x ({T} + max_new_tokens={max_new_tokens:,}) tokens is more than "
            f"{MAX_TOKENS:,} tokens in all: generate fewer"
        )
    stops = Stops(stop, tokenizer, model.config.vocab_size)
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        decoder = Decoder(
            model,
            prompts,
            pads,
            prompts.shape[1] + max_new_tokens,
            use_cache=use_cache,
            keep=window_keep,
            cache_dtype=cache_dtype,
            fixed_shape=fixed_shape,
            step=compiled_step() if compile else None,
        )
    sampling = (temperature, top_k, top_p, generator)
    return prompts, _steps(model, decoder, max_new_tokens, sampling, stops, pad_id)


def stream(model: GPT, ids: Prompts, max_new_tokens: int, **kwargs: Any) -> Iterator[Step]:
    """Yield a `Step` per generated token; takes the arguments of `generate` but `callback`.

    Arguments are checked here, before the first step; the model is in eval mode from the first
    step until the iterator is exhausted or closed, then back in its previous mode.
    """
    return _start(model, ids, max_new_tokens, **kwargs)[1]


def _steps(
    model: GPT,
    decoder: Decoder,
    max_new_tokens: int,
    sampling: tuple[float, int | None, float | None, torch.Generator | None],
    stops: Stops,
    pad_id: int,
) -> Iterator[Step]:
    B = decoder.seq.shape[0]
    finished = torch.zeros(B, dtype=torch.bool, device=decoder.seq.device)
    history: list[list[int]] = [[] for _ in range(B)]
    token = finished.long()  # placeholder until the first sample
    with eval_mode(model):
        for step in range(max_new_tokens):
            with torch.no_grad():
                logits = decoder.prefill() if step == 0 else decoder.decode(token)
                token = sample(logits, *sampling)
                if stops:
                    token = token.masked_fill(finished, pad_id)
                    before = finished.tolist()
                    for i, t in enumerate(token.tolist()):
                        if not before[i]:
                            history[i].append(t)
                            if stops.hit(history[i]):
                                finished[i] = True
            yield Step(token.clone(), finished.clone())
            if stops and bool(finished.all()):
                return


def generate(
    model: GPT,
    ids: Prompts,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: StopSpec | None = None,
    use_cache: bool = True,
    tokenizer: Any = None,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    pad_id: int = 0,
    window_keep: int | None = None,
    cache_dtype: torch.dtype | None = None,
    fixed_shape: bool = False,
    compile: bool = False,
    callback: Callable[[Step], None] | None = None,
) -> Tensor:
    """Continue each prompt by up to `max_new_tokens` tokens; returns ids (B, T + n).

    Args:
        model: a lamina GPT (fp32 or bf16 weights; the caches follow the weights' dtype).
        ids: prompts: (B, T) tensor, 1-D tensor, or list of prompts of different lengths.
        max_new_tokens: steps to run at most (0 returns the prompts); B x (T + it) may not
            pass 2**28 tokens.
        temperature: 0 is greedy; > 0 samples from softmax(logits / temperature).
        top_k, top_p: keep the k most likely tokens / the nucleus of mass top_p (None: off).
        seed: seed of a fresh `torch.Generator`, 0 .. 2**64 - 1 (None: torch's global one).
        stop: token id, string, id sequence, or a list of them; a row ends at its first stop.
        use_cache: KV caches (True) or recompute the window every step (same tokens, slower).
        tokenizer: decodes generated ids to match stop strings.
        generator: a generator to draw from instead of `seed` (e.g. shared across calls).
        attention_mask: (B, T), 1 at real tokens, for an already left-padded tensor.
        pad_id: fills left padding and the tokens after a row's stop.
        window_keep: tokens kept when the window jumps past block_size (see `decoder.py`).
        cache_dtype: dtype of the KV caches (default: the weights').
        fixed_shape: decode with fixed-shape steps (`fast.py`): same tokens, compilable.
        compile: fixed-shape steps through `torch.compile` (a one-off compile per model shape;
            pays off for long or repeated generation, most on small models).
        callback: called with each `Step` as it is produced.
    """
    prompts, steps = _start(
        model,
        ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        generator=generator,
        stop=stop,
        tokenizer=tokenizer,
        use_cache=use_cache,
        attention_mask=attention_mask,
        pad_id=pad_id,
        window_keep=window_keep,
        cache_dtype=cache_dtype,
        fixed_shape=fixed_shape,
        compile=compile,
    )
    new: list[Tensor] = []
    for step in steps:
        new.append(step.tokens)
        if callback is not None:
            callback(step)
    if not new:
        return prompts.clone()
    return torch.cat([prompts, torch.stack(new, dim=1)], dim=1)
