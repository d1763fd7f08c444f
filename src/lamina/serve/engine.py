"""The model behind the playground: checked requests, one job at a time, a bounded queue.

    Engine(model, tokenizer, limits)
        .generate_request(body) -> GenerateRequest      (LaminaError naming the field if bad)
        .attention_request(body) -> text
        .submit(fn, *args) -> concurrent Future          (Busy when the queue is full)
        .run_generation(req, cancel, emit)               (in the worker thread; emits events)
        .run_attention(text) -> dict                     (maps, patterns, next-token table)

All model work runs on one worker thread (a single-thread executor), so requests to a model run
one at a time, in order, and never on the event loop. At most `limits.queue` jobs are admitted
(running or waiting); past that `submit` raises `Busy` at once, so a flood of requests gets
503 answers instead of a growing queue. A generation checks its `cancel` event before every
token: a client that disconnects stops its generation at the next token, and a job cancelled
while it waited does no work.

Prompts are encoded and generated text is streamed by `lamina.generation` (`encode_prompt`,
`TextStream`), as `lamina sample` does; a generation ends at the tokenizer's end-of-turn ids.

Deliberately unaware of HTTP: `app.py` turns requests into calls and events into bytes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from lamina.errors import LaminaError
from lamina.generation import TextStream, check_sampling, encode_prompt, stream
from lamina.inspect import forward_with_maps, head_patterns, table_from_logits, token_labels

GENERATE_FIELDS = {"prompt", "max_tokens", "temperature", "top_k", "top_p", "seed"}


class Busy(LaminaError):
    """The queue is full: try again later (HTTP 503)."""


@dataclass(frozen=True)
class Limits:
    """What one server accepts: per request, and in flight at once."""

    max_tokens: int = 400  # most tokens one generation may ask for
    max_prompt_chars: int = 2000  # longest prompt (characters)
    attention_tokens: int = 128  # /api/attention looks at the last N tokens of a text at most
    queue: int = 8  # jobs admitted at once (one running, the rest waiting); more get 503
    max_connections: int = 64  # open HTTP connections; uvicorn answers 503 past it
    top_k_table: int = 5  # alternatives shown per token


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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lamina-model")
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
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        with self._lock:
            if self.admitted >= self.limits.queue:
                raise Busy(f"busy: {self.admitted} requests are running or queued; try again soon")
            self.admitted += 1

        def job() -> Any:
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self.admitted -= 1
                    self.served += 1

        return self._executor.submit(job)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

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
