"""Chat and completion requests in OpenAI's shape: checked, prepared, then answered in the batch.

    ChatService(engine, name)
        .parse(body, kind) -> Request     on the event loop: the fields checked, nothing rendered
        .prepare(request) -> Job          off it (a prep thread, under the engine's limits): the
                                          template rendered with oldest turns dropped to fit,
                                          or the prompt encoded; grammars compiled
        .sequences(job, sink, cancel, deadline) -> [Sequence]     the job's n sequences
        .message(job, text) -> dict       the reply's content, or its tool_calls

Fields: `messages` (roles system, user, assistant (with `tool_calls`), tool) / `prompt`,
`max_tokens` or `max_completion_tokens` (at most the server's limit), `temperature` (0..2,
default 1), `top_p`, `top_k`, `stop` (a string or up to 4), `seed` (choice i samples with
seed + i), `n` (1 up to the server's slots; n sequences in the batch), `stream`,
`stream_options.include_usage`, `logprobs` / `top_logprobs` (chat: a bool and 0..20;
completions: `logprobs` 0..5), `response_format` ({"type": "text" | "json_object" |
"json_schema", "json_schema": {"schema": ...}}: decoded under that grammar, `grammar.py`),
`tools` / `tool_choice` (rendered through the chat template when it takes tools, `tools.py`;
a 400 saying so when it does not), and `model` (any name: this server has one model). Fields
OpenAI defines that change nothing at their defaults (`frequency_penalty` 0, ...) are accepted
at those values and refused at others; any other field is refused, naming it, with a
`RequestError` (HTTP 400) that says which parameter is wrong.

Deliberately unaware of HTTP: `openai_api.py` turns requests into calls and events into JSON.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lamina.errors import LaminaError
from lamina.generation.conversation import ChatOptions, check_chat_model, fit_messages, reply_room
from lamina.generation.sampling import check_sampling
from lamina.serve.grammar import Grammars
from lamina.serve.sequence import Sampling, Sequence
from lamina.serve.tools import (
    OPEN,
    call_schema,
    check_choice,
    check_tools,
    parse_calls,
    supports_tools,
    template_message,
)

ROLES = ("system", "user", "assistant", "tool")
# fields OpenAI defines that are harmless at these values (a client library may send them)
NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logit_bias": None,
    "user": ...,  # any value: an end-user id, for the client's own logs
    "parallel_tool_calls": ...,
    "metadata": ...,
    "store": ...,
    "echo": False,
    "best_of": 1,
    "suffix": None,
}
COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream"}
COMMON |= {"stream_options", "top_k", "max_completion_tokens", "logprobs"}
CHAT = COMMON | {"messages", "top_logprobs", "response_format", "tools", "tool_choice"}
COMPLETION = COMMON | {"prompt"}


class RequestError(LaminaError):
    """A request OpenAI's API would refuse: HTTP 400 with the parameter it names."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Request:
    """A request whose fields are checked (nothing rendered or encoded yet)."""

    kind: str  # "chat" or "completion"
    sampling: Sampling
    n: int
    stream: bool
    include_usage: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str = ""
    schema: dict[str, Any] | None = None
    json: bool = False  # response_format json_object / json_schema
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "none"


@dataclass(frozen=True)
class Job:
    """A prepared request: the prompt's ids and how to answer it."""

    request: Request
    ids: list[int]
    dropped: int  # messages left out to fit the context
    grammar: str | None = None  # every sequence decodes under it
    opener: str = ""  # text the reply starts with (in the prompt, not sampled)


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


def _message(message: Any, i: int) -> dict[str, Any]:
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
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and message.get("tool_calls"):
        out["content"] = content or ""
        out["tool_calls"] = message["tool_calls"]
    elif role == "tool" and isinstance(message.get("tool_call_id"), str):
        out["tool_call_id"] = message["tool_call_id"]
    if not isinstance(out["content"], str):
        raise RequestError(f"{where}.content must be a string", "messages")
    return out


def _response_format(value: Any) -> tuple[bool, dict[str, Any] | None]:
    if value is None:
        return False, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return False, None
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                "response_format",
            )
        return True, schema
    raise RequestError(
        'response_format type must be "text", "json_object" or "json_schema"', "response_format"
    )


class ChatService:
    """See the module docstring."""

    def __init__(self, engine: Any, name: str) -> None:
        self.engine, self.name = engine, name
        model, tok = engine.model, engine.tokenizer
        self.chat = True
        try:
            check_chat_model(model, tok)
        except LaminaError:
            self.chat = False  # /v1/completions still works on a plain language model
        self.context = engine.context
        self.tools_ok = supports_tools(getattr(tok, "chat_template", None))
        self.grammars = Grammars(tok)
        self._lock = threading.Lock()

    # -- on the event loop: checks only --------------------------------------------------------
    def parse(self, body: Any, kind: str) -> Request:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        allowed = CHAT if kind == "chat" else COMPLETION
        for key, value in body.items():
            if key in allowed:
                continue
            if key not in NEUTRAL:
                raise RequestError(f"unknown or unsupported parameter: {key}", key)
            if NEUTRAL[key] is not ... and value != NEUTRAL[key] and value is not None:
                raise RequestError(f"{key}={value!r} is not supported here", key)
        limits = self.engine.limits
        n = _integer(body, "n", 1, limits.slots) or 1
        given = body.get("max_completion_tokens", body.get("max_tokens"))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        most = _integer({name: given}, name, 1, limits.max_tokens) or min(256, limits.max_tokens)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be true or false", "stream")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
            raise RequestError('stream_options must be {"include_usage": bool}', "stream_options")
        if kind == "chat":
            want = body.get("logprobs")
            if want is not None and not isinstance(want, bool):
                raise RequestError("logprobs must be true or false", "logprobs")
            top = _integer(body, "top_logprobs", 0, 20)
            if top is not None and not want:
                raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
            logprobs = (top or 0) if want else None
        else:
            logprobs = _integer(body, "logprobs", 0, 5)
        top_p = body.get("top_p")
        sampling = Sampling(
            max_tokens=most,
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_k=_integer(body, "top_k", 1, 10**6),
            top_p=None if top_p in (None, 1, 1.0) else _number(body, "top_p", 1.0, 0.0, 1.0),
            seed=_integer(body, "seed", 0, 2**63 - 1 - limits.slots),
            stop=_stops(body.get("stop")),
            logprobs=logprobs,
        )
        try:
            check_sampling(sampling.temperature, sampling.top_k, sampling.top_p)
        except LaminaError as exc:
            raise RequestError(str(exc)) from None
        common = {"sampling": sampling, "n": n, "stream": stream}
        common["include_usage"] = bool(so.get("include_usage", False))
        if kind == "completion":
            return Request("completion", prompt=self._prompt(body), **common)
        return self._chat(body, common)

    def _prompt(self, body: dict[str, Any]) -> str:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("prompt must be a non-empty string", "prompt")
        limit = self.engine.limits.max_prompt_chars
        if len(prompt) > limit:
            raise RequestError(
                f"prompt is {len(prompt)} characters; the limit is {limit}", "prompt"
            )
        return prompt

    def _chat(self, body: dict[str, Any], common: dict[str, Any]) -> Request:
        if not self.chat:
            raise RequestError("this model has no chat template: use /v1/completions", "messages")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise RequestError("messages must be a non-empty list", "messages")
        messages = [_message(m, i) for i, m in enumerate(raw)]
        limit = self.engine.limits.max_prompt_chars * 8
        if sum(len(m["content"]) for m in messages) > limit:
            raise RequestError(f"messages hold more than {limit:,} characters", "messages")
        json_mode, schema = _response_format(body.get("response_format"))
        tools = None
        try:
            if body.get("tools") is not None:
                if not self.tools_ok:
                    raise RequestError(
                        "this model's chat template does not render tools, so it cannot call "
                        "them (its template has no `tools`)",
                        "tools",
                    )
                tools = check_tools(body["tools"])
            choice = check_choice(body.get("tool_choice"), tools)
            messages = [template_message(m) for m in messages]
        except RequestError:
            raise
        except LaminaError as exc:
            param = "tool_choice" if "tool_choice" in str(exc) else "tools"
            raise RequestError(
                str(exc), "messages" if "tool_calls" in str(exc) else param
            ) from None
        if json_mode and choice not in ("none", "auto"):
            raise RequestError("response_format and a required tool call exclude each other")
        return Request(
            "chat",
            messages=messages,
            schema=schema,
            json=json_mode,
            tools=tools,
            tool_choice=choice,
            **common,
        )

    # -- off the event loop --------------------------------------------------------------------
    def prepare(self, req: Request) -> Job:
        """Render (fitting the context) or encode; compile the grammar (RequestError if bad)."""
        tok = self.engine.tokenizer
        try:
            grammar, opener = None, ""
            if req.json:
                grammar = self.grammars.for_schema(req.schema)
            elif req.tool_choice not in ("none", "auto"):
                name = None if req.tool_choice == "required" else req.tool_choice
                grammar, opener = (
                    self.grammars.for_schema(call_schema(req.tools, name)),
                    OPEN + "\n",
                )
        except LaminaError as exc:
            raise RequestError(str(exc), "response_format" if req.json else "tools") from None
        if req.kind == "completion":
            try:
                ids = self.engine.encode(req.prompt)
            except LaminaError as exc:
                raise RequestError(str(exc), "prompt") from None
            if len(ids) + 1 > self.context:
                raise RequestError(
                    f"the prompt is {len(ids):,} tokens; the context holds {self.context:,}",
                    "prompt",
                )
            return Job(req, ids, 0)
        extra = tok.encode(opener) if opener else []

        def render(messages: list[dict[str, Any]]) -> list[int]:
            kw = {"tools": req.tools} if req.tools else {}
            ids = list(tok.render_chat(messages, add_generation_prompt=True, **kw))
            if not ids:
                raise LaminaError("the chat template rendered an empty conversation")
            return ids + extra

        room = reply_room(ChatOptions(max_new_tokens=req.sampling.max_tokens), self.context)
        try:
            ids, dropped = fit_messages(render, req.messages, self.context, room)
        except LaminaError as exc:
            raise RequestError(str(exc), "messages") from None
        return Job(req, ids, dropped, grammar, opener)

    def sequences(
        self,
        job: Job,
        sink: Callable[[int, str, Any], None],
        cancel: threading.Event,
        deadline: float | None,
    ) -> list[Sequence]:
        """The job's n sequences; choice i's events go to sink(i, kind, payload)."""
        s, out = job.request.sampling, []
        for i in range(job.request.n):
            sampling = s if s.seed is None else dataclasses.replace(s, seed=s.seed + i)
            constraint = self.grammars.constraint(job.grammar) if job.grammar else None
            out.append(
                Sequence(
                    job.ids,
                    sampling,
                    lambda kind, payload, i=i: sink(i, kind, payload),
                    constraint=constraint,
                    cancel=cancel,
                    deadline=deadline,
                )
            )
        return out

    def message(self, job: Job, text: str) -> dict[str, Any]:
        """The assistant message: {"content"} or, for a tool call, {"content", "tool_calls"}."""
        req = job.request
        if req.kind != "chat" or req.tool_choice == "none" or not req.tools:
            return {"content": text}
        content, calls = parse_calls(job.opener + text)
        return {"content": content, "tool_calls": calls} if calls else {"content": text}
