"""Chat and completion requests in OpenAI's shape, checked, then answered on the model's thread.

    ChatService(engine, name, context=None)
        .chat_request(body) -> Job         POST /v1/chat/completions: messages rendered with the
                                           model's chat template, oldest turns dropped to fit
        .completion_request(body) -> Job   POST /v1/completions: a plain prompt
        .run(job, cancel, emit)            (worker thread) emit(text, None) per piece of text,
                                           then emit("", Reply) with the finish and the counts

One `PrefixCache` serves every request in turn (requests run one at a time on the engine's
worker), so a client that resends a growing conversation, as chat clients do, prefills only
the new turn. Fields: `messages` / `prompt`, `max_tokens` (or `max_completion_tokens`, at most
the server's limit), `temperature` (0..2, default 1), `top_p`, `stop` (a string or up to 4),
`seed`, `n` (1 only), `stream`, `stream_options.include_usage`, and `model` (any name: this
server has one model). Fields OpenAI defines that change nothing at their defaults
(`frequency_penalty` 0, `logprobs` false, ...) are accepted at those values and refused at
others; any other field is refused, naming it, with a `RequestError` (HTTP 400) that says
which parameter is wrong.

Deliberately unaware of HTTP: `openai_api.py` turns requests into calls and events into JSON.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lamina.errors import LaminaError
from lamina.generation.conversation import (
    ChatOptions,
    PrefixCache,
    Reply,
    check_chat_model,
    fit_messages,
    render_prompt,
    reply_room,
    stream_reply,
)

ROLES = ("system", "user", "assistant")
# fields OpenAI defines that are harmless at these values (a client library may send them)
NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logprobs": False,
    "top_logprobs": None,
    "logit_bias": None,
    "user": ...,  # any value: an end-user id, for the client's own logs
    "response_format": {"type": "text"},
    "tools": None,
    "tool_choice": None,
    "parallel_tool_calls": ...,
    "metadata": ...,
    "store": ...,
    "echo": False,
    "best_of": 1,
    "suffix": None,
}
COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream"}
COMMON |= {"stream_options", "top_k"}


class RequestError(LaminaError):
    """A request OpenAI's API would refuse: HTTP 400 with the parameter it names."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Job:
    """A checked request: the prompt's ids and how to answer it."""

    kind: str  # "chat" or "completion"
    ids: list[int]
    options: ChatOptions
    stream: bool
    include_usage: bool
    dropped: int  # messages left out to fit the context


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{name} must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(f"{name} must be an integer in [{low}, {high}], got {value!r}", name)
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or a list of at most 4 strings", "stop")
    if any(not s for s in stops):
        raise RequestError("stop strings must not be empty", "stop")
    return tuple(stops)


def _content(message: Any, i: int) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with role and content", "messages")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise RequestError(
            f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", "messages"
        )
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise RequestError(f"{where}.content: only text parts are supported", "messages")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string", "messages")
    return {"role": role, "content": content}


class ChatService:
    """See the module docstring."""

    def __init__(self, engine: Any, name: str, context: int | None = None) -> None:
        self.engine, self.name = engine, name
        model, tok = engine.model, engine.tokenizer
        self.chat = True
        try:
            check_chat_model(model, tok)
        except LaminaError:
            self.chat = False  # /v1/completions still works on a plain language model
        block = model.config.block_size
        self.context = min(block, 4096) if context is None else context
        self._cache: PrefixCache | None = None
        self._cache_lock = threading.Lock()

    def _options(self, body: dict[str, Any], extra: set[str]) -> tuple[ChatOptions, bool, bool]:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        for key, value in body.items():
            if key in COMMON or key in extra:
                continue
            if key not in NEUTRAL:
                raise RequestError(f"unknown or unsupported parameter: {key}", key)
            if NEUTRAL[key] is not ... and value != NEUTRAL[key] and value is not None:
                raise RequestError(f"{key}={value!r} is not supported here", key)
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1: this server returns one choice", "n")
        limit = self.engine.limits.max_tokens
        given = body.get("max_completion_tokens", body.get("max_tokens"))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        n = _integer({name: given}, name, 1, limit) or min(256, limit)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be true or false", "stream")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
            raise RequestError('stream_options must be {"include_usage": bool}', "stream_options")
        try:
            options = ChatOptions(
                max_new_tokens=n,
                temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                top_k=_integer(body, "top_k", 1, 10**6),
                top_p=None
                if body.get("top_p") in (None, 1, 1.0)
                else _number(body, "top_p", 1.0, 0.0, 1.0),
                seed=_integer(body, "seed", 0, 2**63 - 1),
                stop=_stops(body.get("stop")),
            )
        except RequestError:
            raise
        except LaminaError as exc:
            raise RequestError(str(exc)) from None
        return options, stream, bool(so.get("include_usage", False))

    def chat_request(self, body: Any) -> Job:
        """POST /v1/chat/completions -> a Job (RequestError naming the parameter if bad)."""
        options, stream, usage = self._options(body, {"messages", "max_completion_tokens"})
        if not self.chat:
            raise RequestError("this model has no chat template: use /v1/completions", "messages")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise RequestError("messages must be a non-empty list", "messages")
        messages = [_content(m, i) for i, m in enumerate(raw)]
        limit = self.engine.limits.max_prompt_chars * 8
        if sum(len(m["content"]) for m in messages) > limit:
            raise RequestError(f"messages hold more than {limit:,} characters", "messages")
        try:
            ids, dropped = fit_messages(
                lambda ms: render_prompt(self.engine.tokenizer, ms),
                messages,
                self.context,
                reply_room(options, self.context),
            )
        except LaminaError as exc:
            raise RequestError(str(exc), "messages") from None
        return Job("chat", ids, options, stream, usage, dropped)

    def completion_request(self, body: Any) -> Job:
        """POST /v1/completions -> a Job."""
        options, stream, usage = self._options(body, {"prompt", "max_completion_tokens"})
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("prompt must be a non-empty string", "prompt")
        if len(prompt) > self.engine.limits.max_prompt_chars:
            raise RequestError(
                f"prompt is {len(prompt)} characters; the limit is "
                f"{self.engine.limits.max_prompt_chars}",
                "prompt",
            )
        try:
            ids = self.engine.encode(prompt)
        except LaminaError as exc:
            raise RequestError(str(exc), "prompt") from None
        if len(ids) + 1 > self.context:
            raise RequestError(
                f"the prompt is {len(ids):,} tokens; the context holds {self.context:,}", "prompt"
            )
        return Job("completion", ids, options, stream, usage, 0)

    def run(
        self, job: Job, cancel: threading.Event, emit: Callable[[str, Reply | None], None]
    ) -> None:
        """Answer `job` (worker thread): emit(text, None) per piece, then ("", last Reply)."""
        with self._cache_lock:
            if self._cache is None:
                self._cache = PrefixCache(self.engine.model, self.context)
            replies = stream_reply(
                self._cache, self.engine.tokenizer, job.ids, job.options, dropped=job.dropped
            )
            last = None
            try:
                for reply in replies:
                    if cancel.is_set():
                        last = dataclasses.replace(reply, text="", finish="cancelled")
                        break
                    if reply.finish is None:
                        emit(reply.text, None)
                    else:
                        if reply.text:
                            emit(reply.text, None)
                        last = reply
            finally:
                replies.close()
            if last is not None:
                emit("", last)
