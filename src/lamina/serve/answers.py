"""OpenAI's JSON for one request's answer, from its sequences' events (`openai_api.py` serves it).

    Answer(service, job, meta)
        .take((i, kind, payload))     choice i's event: "tokens" [Token, ...], "done" Done,
                                      "error" / "busy" a message
        .whole() -> dict              the chat.completion / text_completion object
        .pieces(item) -> [bytes]      the server-sent events one event gives (after `take`)
        .usage() -> dict
    error_body(message, status, param) -> dict      OpenAI's error object
    data(obj) -> bytes                              one `data: {json}` event

A "tokens" event holds one token or several (the stream interval, `pacing.py`): they become ONE
chunk, their texts joined and, with logprobs, one entry per token in its `logprobs` (a
completion's `text_offset` counts from the start of the choice's text, as the whole answer's
does). A token whose text is still empty (an incomplete character) has no chunk of its own:
it travels with the next. A reply that may hold a tool call is sent whole when it ends.

Deliberately unaware of HTTP and of when events arrive.
"""

from __future__ import annotations

import json
from typing import Any

from lamina.serve.chat_service import ChatService, Job
from lamina.serve.sequence import Done, Token


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def data(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


_text_json = json.JSONEncoder(ensure_ascii=False).encode  # a string alone, as `data` writes it
_MARK = "\0lamina\0"  # a text no reply holds (a NUL), where a chunk's template takes the text


class _Choice:
    """What one choice has received so far."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []
        self.shown = 0  # a completion's text offset after the tokens its chunks carried
        self.done: Done | None = None
        self.failed: tuple[int, str] | None = None

    @property
    def ended(self) -> bool:
        return self.done is not None or self.failed is not None


class Answer:
    """The events of one request's sequences, turned into OpenAI's JSON."""

    def __init__(self, service: ChatService, job: Job, meta: dict[str, Any]) -> None:
        self.service, self.job, self.meta = service, job, meta
        self.req = job.request
        self.chat = self.req.kind == "chat"
        self.choices = [_Choice() for _ in range(self.req.n)]
        self.hold = self.chat and bool(self.req.tools) and self.req.tool_choice != "none"
        self.templates: dict[int, tuple[bytes, bytes] | None] = {}

    def take(self, item: tuple[int, str, Any]) -> None:
        i, kind, payload = item
        c = self.choices[i]
        if kind == "tokens":
            c.tokens.extend(payload)
        elif kind == "done":
            c.done = payload
        else:
            c.failed = (503 if kind == "busy" else 500, str(payload))

    @property
    def failure(self) -> tuple[int, str] | None:
        return next((c.failed for c in self.choices if c.failed), None)

    @property
    def ended(self) -> bool:
        return all(c.ended for c in self.choices)

    def finish(self, c: _Choice, message: dict[str, Any] | None = None) -> str:
        if message and message.get("tool_calls"):
            return "tool_calls"
        return "length" if c.done and c.done.finish == "length" else "stop"

    def logprobs(self, tokens: list[Token], at: int = 0) -> Any:
        """The tokens' logprobs object (None when not asked); a completion's text offsets
        start at `at`."""
        if self.req.sampling.logprobs is None:
            return None
        tok = self.service.engine.tokenizer
        scored = [t for t in tokens if t.logprob is not None]

        def text(i: int) -> str:
            return tok.decode([i])

        if self.chat:
            return {
                "content": [
                    {
                        "token": text(t.id),
                        "logprob": t.logprob,
                        "bytes": list(text(t.id).encode()),
                        "top_logprobs": [
                            {"token": text(j), "logprob": lp, "bytes": list(text(j).encode())}
                            for j, lp in t.top
                        ],
                    }
                    for t in scored
                ],
                "refusal": None,
            }
        offsets = []
        for t in scored:
            offsets.append(at)
            at += len(text(t.id))
        return {
            "tokens": [text(t.id) for t in scored],
            "token_logprobs": [t.logprob for t in scored],
            "top_logprobs": [{text(j): lp for j, lp in t.top} for t in scored]
            if self.req.sampling.logprobs
            else None,
            "text_offset": offsets,
        }

    def usage(self) -> dict[str, Any]:
        done = [c.done for c in self.choices if c.done]
        p = self.job.ids and len(self.job.ids)
        completion = sum(d.completion_tokens for d in done)
        cached = done[0].cached_tokens if done else 0
        return {
            "prompt_tokens": p,
            "completion_tokens": completion,
            "total_tokens": p + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def whole(self) -> dict[str, Any]:
        out = []
        for i, c in enumerate(self.choices):
            text = "".join(t.text for t in c.tokens)
            lp = self.logprobs(c.tokens)
            if self.chat:
                message = {"role": "assistant", **self.service.message(self.job, text)}
                finish = self.finish(c, message)
                out.append(
                    {"index": i, "message": message, "finish_reason": finish, "logprobs": lp}
                )
            else:
                out.append(
                    {"index": i, "text": text, "finish_reason": self.finish(c), "logprobs": lp}
                )
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self.meta, "object": obj, "choices": out, "usage": self.usage()}

    def chunk(self, i: int, delta: dict[str, Any] | str, finish: str | None, lp: Any) -> bytes:
        if self.chat:
            choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": lp}
            return data({**self.meta, "object": "chat.completion.chunk", "choices": [choice]})
        choice = {"index": i, "text": delta, "finish_reason": finish, "logprobs": lp}
        return data({**self.meta, "object": "text_completion", "choices": [choice]})

    def text_chunk(self, i: int, text: str) -> bytes:
        """chunk(i, text as its delta, None, None), byte for byte, from choice i's template
        (made once: the chunk around a mark) with only the text encoded each time."""
        if i not in self.templates:
            whole = self.chunk(i, {"content": _MARK} if self.chat else _MARK, None, None)
            mark = _text_json(_MARK).encode()
            parts = whole.split(mark)
            self.templates[i] = (parts[0], parts[1]) if len(parts) == 2 else None
        parts = self.templates[i]
        if parts is None:  # the mark in the model's name: no template
            return self.chunk(i, {"content": text} if self.chat else text, None, None)
        return parts[0] + _text_json(text).encode() + parts[1]

    def pieces(self, item: tuple[int, str, Any]) -> list[bytes]:
        """The chunks one event gives (after `take`)."""
        i, kind, payload = item
        c = self.choices[i]
        if kind == "tokens" and not self.hold:
            return self._text(i, c, payload)
        if kind != "done":
            return []
        out = []
        if self.hold:
            text = "".join(t.text for t in c.tokens)
            message = self.service.message(self.job, text)
            delta = {k: v for k, v in message.items() if v is not None}
            if delta.get("tool_calls"):
                delta["tool_calls"] = [
                    {"index": k, **tc} for k, tc in enumerate(delta["tool_calls"])
                ]
            out.append(self.chunk(i, delta, None, self.logprobs(c.tokens)))
            finish = self.finish(c, message)
        else:
            finish = self.finish(c)
        out.append(self.chunk(i, {} if self.chat else "", finish, None))
        return out

    def _text(self, i: int, c: _Choice, tokens: list[Token]) -> list[bytes]:
        """One chunk for a group of tokens (none if it has no text and no logprobs)."""
        text = "".join(t.text for t in tokens)
        if self.req.sampling.logprobs is None:
            return [self.text_chunk(i, text)] if text else []
        if not text and all(t.logprob is None for t in tokens):
            return []
        lp = self.logprobs(tokens, c.shown)
        if not self.chat and lp["tokens"]:  # where the next chunk's first token starts
            c.shown = lp["text_offset"][-1] + len(lp["tokens"][-1])
        return [self.chunk(i, {"content": text} if self.chat else text, None, lp)]
