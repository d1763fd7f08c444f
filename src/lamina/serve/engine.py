"""The model behind the server: checked requests, bounded admission, off-loop workers, the batch.

    Engine(model, tokenizer, limits)
        .generate_request(body) -> GenerateRequest      (LaminaError naming the field if bad)
        .attention_request(body) -> text
        .submit(fn, *args) -> concurrent Future          (Busy when the queue is full)
        .admit() -> Ticket                               (Busy when full; .release() once done)
        await .off_loop(fn, *args)                       fn in a prep thread, at most
                                                         limits.prep_seconds (PrepTimeout)
        .batcher                                         the continuous batch (`batch.py`),
                                                         made at first use
        .run_generation(req, cancel, emit)               (worker thread; emits events)
        .run_attention(text) -> dict                     (maps, patterns, next-token table)

Nothing that touches the model or a template runs on the event loop. The playground's jobs
(/api/generate, /api/attention) run one at a time on a worker thread; the OpenAI routes render
and compile in prep threads, then decode in the batch (`limits.slots` KV-cache rows of
`limits.context` tokens). Every thread is a daemon: a job stuck in a model or a template never
holds the process when it stops. At most `limits.queue` requests are admitted at once (running,
preparing or waiting for a slot); past that `submit` / `admit` raise `Busy` at once, so a flood
gets 503 answers instead of a growing queue. A generation checks its `cancel` event before
every token: a client that disconnects stops its generation at the next token.

Prompts are encoded and generated text is streamed by `lamina.generation` (`encode_prompt`,
`TextStream`), as `lamina sample` does; a generation ends at the tokenizer's end-of-turn ids.

Deliberately unaware of HTTP: `app.py` turns requests into calls and events into bytes.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from lamina.errors import LaminaError
from lamina.generation import TextStream, check_sampling, encode_prompt, stream
from lamina.inspect import forward_with_maps, head_patterns, table_from_logits, token_labels
from lamina.serve.pacing import check_interval
from lamina.serve.workers import Ticket, Workers

GENERATE_FIELDS = {"prompt", "max_tokens", "temperature", "top_k", "top_p", "seed"}


class Busy(LaminaError):
    """The queue is full: try again later (HTTP 503)."""


class PrepTimeout(LaminaError):
    """Rendering or compiling a request took longer than allowed (HTTP 500)."""


class Stopping(LaminaError):
    """The server is shutting down (HTTP 503)."""


@dataclass(frozen=True)
class Limits:
    """What one server accepts: per request, and in flight at once."""

    max_tokens: int = 400  # most tokens one generation may ask for
    max_prompt_chars: int = 2000  # longest prompt (characters)
    attention_tokens: int = 128  # /api/attention looks at the last N tokens of a text at most
    queue: int = 32  # requests admitted at once (running, preparing, waiting); more get 503
    max_connections: int = 64  # open HTTP connections; uvicorn answers 503 past it
    top_k_table: int = 5  # alternatives shown per token
    slots: int = 8  # sequences decoding at once (KV-cache rows)
    context: int = 2048  # tokens of KV cache per slot (at most the model's block_size)
    wait: float = 30.0  # seconds a request may wait for a free slot, then 503
    prep_seconds: float = 10.0  # seconds rendering a template / compiling a grammar may take
    prefill_chunk: int = 256  # prompt tokens prefilled between two decode steps
    kv16: bool = True  # float16 KV caches where the native step runs (batch.py)
    # a streamed reply's tokens go out every N (pacing.py); None: 1 while one sequence decodes,
    # pacing.SHARED while several do
    stream_interval: int | None = None

    def __post_init__(self) -> None:
        check_interval(self.stream_interval)


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    ids: list[int]
    max_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int


def _int(body: dict[str, Any], name: str, default: Any, lowest: int, highest: int | None) -> Any:
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise LaminaError(f"{name} must be an integer >= {lowest}, got {value!r}")
    if highest is not None and value > highest:
        raise LaminaError(f"{name} must be at most {highest}, got {value}")
    return value


class Engine:
    def __init__(self, model: Any, tokenizer: Any, limits: Limits | None = None) -> None:
        if tokenizer is None:
            raise LaminaError("the playground needs a model with a tokenizer (tokenizer.json)")
        self.model, self.tokenizer = model, tokenizer
        self.limits = limits or Limits()
        self.context = min(model.config.block_size, self.limits.context)
        self._worker = Workers(1, "lamina-model")
        self._prep = Workers(2, "lamina-prep")
        self._batcher: Any = None
        self._lock = threading.Lock()
        self.admitted = 0  # jobs running or waiting
        self.served = 0

    @property
    def info(self) -> dict[str, Any]:
        c = self.model.config
        return {
            "layers": c.n_layers,
            "heads": c.n_heads,
            "block_size": c.block_size,
            "vocab_size": c.vocab_size,
            "limits": {
                "max_tokens": self.limits.max_tokens,
                "max_prompt_chars": self.limits.max_prompt_chars,
                "attention_tokens": self.limits.attention_tokens,
                "queue": self.limits.queue,
                "slots": self.limits.slots,
                "context": self.context,
            },
        }

    # -- requests ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Text -> ids: unknown characters named; an empty text becomes the start token."""
        return encode_prompt(self.tokenizer, text, what="prompt")

    def encode_text(self, text: str) -> list[int]:
        """A text to look at (never empty, no start token added) -> ids."""
        return encode_prompt(self.tokenizer, text, empty="error", what="text")

    def generate_request(self, body: Any) -> GenerateRequest:
        if not isinstance(body, dict):
            raise LaminaError(f"the request body must be a JSON object, got {type(body).__name__}")
        unknown = sorted(set(body) - GENERATE_FIELDS)
        if unknown:
            raise LaminaError(f"unknown field(s): {', '.join(unknown)}")
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise LaminaError(f"prompt must be a string, got {type(prompt).__name__}")
        if len(prompt) > self.limits.max_prompt_chars:
            raise LaminaError(
                f"prompt is {len(prompt)} characters; the limit is {self.limits.max_prompt_chars}"
            )
        limit = self.limits.max_tokens
        max_tokens = _int(body, "max_tokens", min(100, limit), 1, limit)
        temperature = body.get("temperature", 0.8)
        top_k, top_p = _int(body, "top_k", None, 1, None), body.get("top_p")
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
            temperature = float(temperature)
        if isinstance(top_p, int) and not isinstance(top_p, bool):
            top_p = float(top_p)
        check_sampling(temperature, top_k, top_p)
        seed = _int(body, "seed", None, 0, 2**63 - 1)
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        ids = self.encode(prompt)
        return GenerateRequest(prompt, ids, max_tokens, temperature, top_k, top_p, seed)

    def attention_request(self, body: Any) -> str:
        if not isinstance(body, dict):
            raise LaminaError(f"the request body must be a JSON object, got {type(body).__name__}")
        unknown = sorted(set(body) - {"text"})
        if unknown:
            raise LaminaError(f"unknown field(s): {', '.join(unknown)}")
        text = body.get("text")
        if not isinstance(text, str):
            raise LaminaError("text must be a string")
        limit = self.limits.max_prompt_chars + self.limits.max_tokens * 8
        if len(text) > limit:
            raise LaminaError(f"text is {len(text)} characters; the limit is {limit}")
        self.encode_text(text)  # named errors for empty text and unknown characters
        return text

    # -- the queue -----------------------------------------------------------------------------
    def admit(self) -> Ticket:
        """A place among the admitted requests (Busy if none is left); release it when done."""
        with self._lock:
            if self.admitted >= self.limits.queue:
                raise Busy(f"busy: {self.admitted} requests are running or queued; try again soon")
            self.admitted += 1
        return Ticket(self._leave)

    def _leave(self) -> None:
        with self._lock:
            self.admitted -= 1
            self.served += 1

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        ticket = self.admit()

        def job() -> Any:
            try:
                return fn(*args)
            finally:
                ticket.release()

        return self._worker.submit(job)

    async def off_loop(
        self, fn: Callable[..., Any], *args: Any, cancel: threading.Event | None = None
    ) -> Any:
        """fn(*args) in a prep thread; PrepTimeout after limits.prep_seconds, Stopping once
        `cancel` is set (the server stops). The thread is left to finish on its own: a daemon."""
        future = self._prep.submit(fn, *args)
        waiting = asyncio.wrap_future(future)
        end = time.monotonic() + self.limits.prep_seconds
        while not waiting.done():
            left = end - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                future.cancel()
                waiting.cancel()
                if left > 0:
                    raise Stopping("the server is shutting down")
                raise PrepTimeout(
                    f"preparing the request took over {self.limits.prep_seconds:g} s (the chat "
                    "template or the grammar); it was abandoned"
                )
            await asyncio.wait({waiting}, timeout=min(left, 0.1))
        return waiting.result()

    @property
    def batcher(self) -> Any:
        with self._lock:
            if self._batcher is None:
                from lamina.serve.batch import Batcher

                lim = self.limits
                self._batcher = Batcher(
                    self.model,
                    self.tokenizer,
                    lim.slots,
                    self.context,
                    lim.prefill_chunk,
                    kv16=lim.kv16,
                )
            return self._batcher

    def close(self) -> None:
        """Stop the workers and the batch (a job stuck in the model is left to the daemon)."""
        self._worker.close()  # its generations stop at their next token
        self._prep.close(wait=0.2)  # a stuck template is not waited for
        if self._batcher is not None:
            self._batcher.close()

    # -- jobs (worker thread) ------------------------------------------------------------------
    def run_generation(
        self, req: GenerateRequest, cancel: threading.Event, emit: Callable[[str, dict], None]
    ) -> None:
        """Emit "start", one "token" per generated token, then "done" (or "error")."""
        if cancel.is_set():
            return
        t0 = time.perf_counter()
        emit("start", {"prompt_tokens": len(req.ids), "seed": req.seed})
        eot = tuple(getattr(self.tokenizer, "eot_ids", ()) or ())
        steps = stream(
            self.model,
            torch.tensor([req.ids]),
            req.max_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
            stop=list(eot) or None,
        )
        text = TextStream(self.tokenizer, stop_ids=eot)
        reason, index = "length", 0
        try:
            for step in steps:
                if cancel.is_set():
                    reason = "cancelled"
                    break
                token = int(step.tokens[0])
                delta = text.push(token)
                if text.stopped:
                    reason = "stop"
                    break
                emit("token", {"index": index, "id": token, "text": delta})
                index += 1
        finally:
            steps.close()
        text.flush()
        seconds = time.perf_counter() - t0
        emit(
            "done",
            {
                "reason": reason,
                "tokens": index,
                "text": text.text,
                "seconds": round(seconds, 4),
                "tokens_per_s": round(index / max(seconds, 1e-9), 1),
            },
        )

    def run_attention(self, text: str) -> dict[str, Any]:
        """Maps (L, H, T, T), head patterns and next-token tables of the text's last tokens."""
        ids = self.encode_text(text)
        keep = min(self.limits.attention_tokens, self.model.config.block_size)
        cut = max(0, len(ids) - keep)
        ids = ids[cut:]
        logits, maps = forward_with_maps(self.model, ids)
        labels = token_labels(self.tokenizer, ids)
        patterns = head_patterns(maps, ids, labels)
        table = table_from_logits(logits, self.tokenizer, ids, self.limits.top_k_table)
        return {
            "tokens": labels,
            "ids": ids,
            "cut": cut,
            "layers": maps.shape[0],
            "heads": maps.shape[1],
            "maps": [
                [
                    [[round(x, 4) for x in row[: q + 1]] for q, row in enumerate(head)]
                    for head in layer
                ]
                for layer in maps.tolist()
            ],
            "patterns": [[p.to_dict() | {"caption": p.caption()} for p in row] for row in patterns],
            "table": [r.to_dict() for r in table],
        }
