"""A conversation with a KV cache that lives across turns.

    Conversation(model, tokenizer, system=None, context=None)   model: a lamina GPT, or the
                                                  torch-free native runtime (its own tokenizer)
        .reply(text, options) -> Iterator[Reply]     streams the assistant's answer to `text`
        .messages                                    the history (system first, if any)
        .clear() / .set_system(text)
    ChatOptions(max_new_tokens, temperature, top_k, top_p, seed, stop)

Each turn renders the *whole* conversation with the tokenizer's chat template
(`render_chat(messages, add_generation_prompt=True) -> ids`) and compares it with the tokens
whose keys and values are already in the cache: only the tokens after their common prefix are
prefilled. So a reply is computed from exactly what a fresh render of the conversation gives
(a test holds the two equal token for token), yet turn n costs only its own new tokens. The
reply's own tokens are usually part of that prefix at the next turn; where the template
renders the reply differently from how it was sampled (a re-tokenized word), the cache is cut
back at the first difference.

When the conversation no longer fits `context` (minus room for a reply), the oldest turns go
first (a user message with the answer that followed it); the system message and the current
message always stay, and each `Reply` says how many messages were dropped. A current message
that does not fit even alone is refused with a `LaminaError`, never cut silently.

A reply ends at one of the tokenizer's end-of-turn ids (`eot_ids`; not shown), at a stop
string, after `max_new_tokens`, or when the context is full. Closing the iterator (Ctrl-C in
`lamina chat`, a client gone in `lamina serve`) keeps what was said so far as the answer.

The model runs behind an `Engine`: the torch model's `PrefixCache` (lamina.generation.prefix)
or the native runtime's `RuntimeCache` (no torch in the process); each samples its own logits
by lamina.generation.pick's one rule, and this module imports no torch.

Deliberately unaware of terminals and HTTP: text in, `Reply` events out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from lamina.errors import LaminaError
from lamina.generation.pick import check_sampling, pick
from lamina.generation.prompts import TextStream
from lamina.generation.stops import common_prefix

if TYPE_CHECKING:
    from lamina.native.runtime import Runtime

DEFAULT_CONTEXT = 4096  # tokens of KV cache a conversation gets when the model allows more
MIN_REPLY_ROOM = 64  # tokens kept free for the reply when old turns must go


@dataclass(frozen=True)
class ChatOptions:
    """How one reply is sampled (the same meanings as `lamina.generate`)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise LaminaError(f"max_new_tokens must be a positive integer, got {n!r}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**64):
            raise LaminaError(f"seed must be an integer in [0, 2**64), got {s!r}")
        if any(not isinstance(x, str) or not x for x in self.stop):
            raise LaminaError("stop strings must be non-empty strings")


@dataclass
class Reply:
    """One event of a streamed reply: new text, then a last event with `finish` set."""

    text: str  # text new since the previous event ("" on the last one, possibly)
    finish: str | None = None  # "stop" (end of turn or stop string), "length", "cancelled"
    prompt_tokens: int = 0  # tokens of the rendered conversation this reply answers
    cached_tokens: int = 0  # of which were reused from the cache (not prefilled again)
    completion_tokens: int = 0  # tokens sampled so far
    dropped: int = 0  # old messages left out to fit the context


class Engine(Protocol):
    """What a `Conversation` runs on: a KV cache of one sequence and the ids it holds.
    `PrefixCache` (lamina.generation.prefix: the torch model) and `RuntimeCache` (the native
    runtime, no torch) are the two; logits are whatever `sampler` takes."""

    capacity: int

    def prefill(self, ids: list[int]) -> tuple[Any, int]:
        """Logits after `ids`, computing only what the cache lacks; how many were reused."""
        ...

    def step(self, token: int) -> Any:
        """Append one token; the logits for the next."""
        ...

    def forget(self, n: int) -> None:
        """Keep the cache's first n tokens."""
        ...

    @property
    def full(self) -> bool: ...

    def sampler(self, options: ChatOptions) -> Callable[[Any], int]:
        """The token `options` pick from logits (seeded once per reply)."""
        ...

    def running(self) -> contextlib.AbstractContextManager[Any]: ...


class RuntimeCache:
    """The native runtime (`lamina.native.runtime.Runtime`) as a conversation's engine: its
    cache keeps the common prefix of each prompt; logits are NumPy rows, sampled by
    lamina.generation.pick with a `numpy.random.Generator`."""

    def __init__(self, runtime: Runtime, capacity: int) -> None:
        if capacity > runtime.cache_len:
            raise LaminaError(
                f"context {capacity} exceeds the runtime's cache ({runtime.cache_len})"
            )
        self.runtime, self.capacity = runtime, capacity

    @property
    def ids(self) -> list[int]:
        return self.runtime.cached

    def prefill(self, ids: list[int]) -> tuple[np.ndarray, int]:
        if not 0 < len(ids) <= self.capacity:
            raise LaminaError(f"a prompt of {len(ids)} tokens does not fit {self.capacity}")
        reused = min(common_prefix(self.runtime.cached, ids), len(ids) - 1)
        self.runtime.forget(reused)
        return self.runtime.feed(ids[reused:]), reused

    def step(self, token: int) -> np.ndarray:
        return self.runtime.feed([token])

    def forget(self, n: int) -> None:
        self.runtime.forget(n)

    @property
    def full(self) -> bool:
        return len(self.runtime.cached) >= self.capacity

    def sampler(self, options: ChatOptions) -> Callable[[np.ndarray], int]:
        o, rng = options, np.random.default_rng(options.seed)
        return lambda logits: pick(logits, o.temperature, o.top_k, o.top_p, rng)

    def running(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def fit_messages(
    render: Callable[[list[dict[str, str]]], list[int]],
    messages: list[dict[str, str]],
    context: int,
    room: int,
) -> tuple[list[int], int]:
    """Render `messages`, dropping the oldest turns (a user message and the answers up to the
    next one) until `room` tokens are left for the reply: (ids, messages dropped). A leading
    system message and the last message always stay; if they alone do not fit, LaminaError.

    The fewest turns to drop are found by bisection over the turn boundaries (fewer turns never
    render longer), so a conversation of n messages costs O(log n) renders, not n."""
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    turns = messages[len(head) :]
    ids = render([*head, *turns])
    if len(ids) + room <= context:
        return ids, 0
    # where the kept turns may start: each later user message, and at last the final message
    cuts = [i for i in range(1, len(turns)) if turns[i].get("role") == "user"]
    if len(turns) > 1 and (not cuts or cuts[-1] != len(turns) - 1):
        cuts.append(len(turns) - 1)
    fits: dict[int, list[int]] = {}
    lo, hi = 0, len(cuts) - 1  # the first cut that fits lies in cuts[lo..hi], if any
    while lo <= hi:
        mid = (lo + hi) // 2
        got = render([*head, *turns[cuts[mid] :]])
        if len(got) + room <= context:
            fits[mid] = got
            hi = mid - 1
        else:
            ids, lo = got, mid + 1
    if lo >= len(cuts):
        raise LaminaError(
            f"the message is too long for the context: with the system message it is "
            f"{len(ids):,} tokens, and the context holds {context:,} (with {room} kept "
            "for the reply)"
        )
    return fits[lo], cuts[lo]


def reply_room(options: ChatOptions, context: int) -> int:
    """Tokens kept free for a reply when old turns must go."""
    room = min(options.max_new_tokens, max(MIN_REPLY_ROOM, context // 4))
    return max(1, min(room, context - 2))


def stream_reply(
    cache: Engine,
    tokenizer: Any,
    ids: list[int],
    options: ChatOptions,
    *,
    dropped: int = 0,
    said: list[str] | None = None,
) -> Iterator[Reply]:
    """Answer the rendered conversation `ids` token by token through `cache`; see the module
    docstring. `said`, if given, receives the text shown so far (kept when the caller stops
    listening)."""
    o = options
    eot = set(getattr(tokenizer, "eot_ids", ()) or ())
    # the one streamed decoder: holds back incomplete characters and a stop string's start
    text = TextStream(tokenizer, o.stop, include_stop=False)
    choose = cache.sampler(o)
    out: list[int] = []
    reused, finish = 0, None

    def event(new: str, end: str | None = None) -> Reply:
        if said is not None:
            said[:] = [text.text]
        return Reply(new, end, len(ids), reused, len(out), dropped)

    with cache.running():
        logits, reused = cache.prefill(ids)
        while finish is None:
            token = choose(logits)
            if token in eot:
                finish = "stop"
                break
            out.append(token)
            new = text.push(token)
            if text.stopped:
                finish = "stop"  # a stop string
            elif len(out) >= o.max_new_tokens or cache.full:
                finish = "length"
            if new:
                yield event(new)
            if finish is None:
                logits = cache.step(token)
    if rest := text.flush():  # what waited (nothing once a stop string has ended it)
        yield event(rest)
    yield event("", finish)


class Conversation:
    """A chat history plus the KV cache of its rendered tokens; see the module docstring."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        system: str | None = None,
        context: int | None = None,
        cache_dtype: Any = None,
    ) -> None:
        """`model`: a lamina GPT (with its `tokenizer`) or a `lamina.native.runtime.Runtime`
        (its own tokenizer when `tokenizer` is None; `context` at most its cache)."""
        from lamina.native.runtime import Runtime

        native = isinstance(model, Runtime)
        if native:
            tokenizer = model.tokenizer if tokenizer is None else tokenizer
            meta = model.contents.metadata
            block = min(model.cache_len, int(meta.get("llama.context_length", model.cache_len)))
        else:
            check_chat_model(model, tokenizer)
            block = model.config.block_size
        check_chat_tokenizer(tokenizer)
        context = min(block, DEFAULT_CONTEXT) if context is None else context
        if isinstance(context, bool) or not isinstance(context, int) or not 2 <= context <= block:
            raise LaminaError(
                f"context must be an integer in [2, block_size={block}], got {context}"
            )
        self.tokenizer, self.context, self.system = tokenizer, context, system
        self.turns: list[dict[str, str]] = []  # user and assistant messages, oldest first
        self.cache: Engine
        if native:
            self.cache = RuntimeCache(model, context)
        else:
            from lamina.generation.prefix import PrefixCache

            self.cache = PrefixCache(model, context, cache_dtype)

    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation as chat-template messages (the system message first, if set)."""
        head = [] if self.system is None else [{"role": "system", "content": self.system}]
        return head + [dict(m) for m in self.turns]

    def clear(self) -> None:
        """Forget the turns (the system message stays); the cache is reused where it matches."""
        self.turns.clear()

    def set_system(self, text: str | None) -> None:
        """A new system message (None: the template's default) for the next turns."""
        self.system = text

    def reply(self, text: str, options: ChatOptions | None = None) -> Iterator[Reply]:
        """Stream the assistant's answer to the user's `text`.

        The message is checked and old turns dropped before this returns; the model runs as
        the iterator is consumed; closing it early keeps what was said as the answer."""
        if not isinstance(text, str):
            raise LaminaError(f"a message must be text, got {type(text).__name__}")
        options = options or ChatOptions()
        messages = [*self.messages, {"role": "user", "content": text}]
        ids, dropped = fit_messages(
            self.render, messages, self.context, reply_room(options, self.context)
        )
        del self.turns[:dropped]
        self.turns.append({"role": "user", "content": text})
        return self._answer(ids, dropped, options)

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        return render_prompt(self.tokenizer, messages)

    def _answer(self, ids: list[int], dropped: int, options: ChatOptions) -> Iterator[Reply]:
        said = [""]
        try:
            yield from stream_reply(
                self.cache, self.tokenizer, ids, options, dropped=dropped, said=said
            )
        finally:
            self.turns.append({"role": "assistant", "content": said[0]})


def check_chat_model(model: Any, tokenizer: Any) -> None:
    """A lamina GPT with a tokenizer that renders chats, or a LaminaError saying what is not."""
    from lamina.models.gpt import GPT

    if not isinstance(model, GPT):
        raise LaminaError(f"chat needs a lamina GPT, got {type(model).__name__}")
    check_chat_tokenizer(tokenizer)


def check_chat_tokenizer(tokenizer: Any) -> None:
    """A tokenizer that renders chats, or a LaminaError saying that the model is no chat model."""
    if not callable(getattr(tokenizer, "render_chat", None)) or not getattr(
        tokenizer, "chat_template", None
    ):
        raise LaminaError(
            "this model has no chat template (not a chat model): use `lamina sample` to "
            "continue plain text"
        )


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Ids of the conversation with the assistant's turn opened."""
    ids = list(tokenizer.render_chat(messages, add_generation_prompt=True))
    if not ids:
        raise LaminaError("the chat template rendered an empty conversation")
    return ids
