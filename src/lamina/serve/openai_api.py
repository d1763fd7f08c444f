"""An OpenAI-compatible HTTP API over the served model: what the `openai` client library calls.

    GET  /v1/models                 the one model, by the name given to `lamina serve`
    POST /v1/chat/completions       {"messages": [...], "stream": bool, ...}
    POST /v1/completions            {"prompt": "...", "stream": bool, ...}

Answers have OpenAI's shapes: `chat.completion` / `text_completion` objects with `choices`
(n of them; a chat message's `tool_calls` with finish_reason "tool_calls"; `logprobs` when
asked) and `usage` (prompt, completion and total tokens; `prompt_tokens_details.cached_tokens`
counts the prompt tokens a KV-cache row already held). With `"stream": true` the answer is
server-sent events, one `data: {chunk}` per piece of text, a last chunk per choice with
`finish_reason`, a usage chunk when `stream_options.include_usage` is set, then `data:
[DONE]` (a reply with tools is sent whole when it ends, as its text may be a call).

A request is checked on the event loop; rendering and grammar compiling run in the engine's
prep threads (bounded in time: a template that hangs is a 500 after `Limits.prep_seconds`,
and other routes keep answering); decoding runs in the batch (`batch.py`). Errors are
OpenAI's error object `{"error": {"message", "type", "param", "code"}}`: 400 for a bad request
(a schema that cannot compile included), 503 with Retry-After when the queue is full or no
slot freed within `Limits.wait` seconds, 500 when the generation failed (a stream that already
started ends with a `data: {"error": ...}` chunk instead) — never an empty success. A client
that disconnects stops its generation at the next step. The fields are checked in `chat_service.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lamina.errors import LaminaError
from lamina.serve.chat_service import ChatService, Job, RequestError
from lamina.serve.engine import Busy, PrepTimeout, Stopping
from lamina.serve.sequence import Done, Token
from lamina.serve.workers import Mail

log = logging.getLogger("lamina.serve")


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def openai_error(status: int, message: str, param: str | None = None) -> Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(message, status, param), status_code=status, headers=headers)


def _data(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


_text_json = json.JSONEncoder(ensure_ascii=False).encode  # a string alone, as _data writes it
_MARK = "\0lamina\0"  # a text no reply holds (a NUL), where a chunk's template takes the text


class _Choice:
    """What one choice has received so far."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []
        self.done: Done | None = None
        self.failed: tuple[int, str] | None = None

    @property
    def ended(self) -> bool:
        return self.done is not None or self.failed is not None


class _Answer:
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
        if kind == "token":
            c.tokens.append(payload)
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

    def logprobs(self, tokens: list[Token]) -> Any:
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
        offsets, at = [], 0
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
            return _data({**self.meta, "object": "chat.completion.chunk", "choices": [choice]})
        choice = {"index": i, "text": delta, "finish_reason": finish, "logprobs": lp}
        return _data({**self.meta, "object": "text_completion", "choices": [choice]})

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
        if kind == "token" and not self.hold and payload.text:
            if self.req.sampling.logprobs is None:
                return [self.text_chunk(i, payload.text)]
            delta = {"content": payload.text} if self.chat else payload.text
            return [self.chunk(i, delta, None, self.logprobs([payload]))]
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


def openai_routes(
    service: ChatService, read_json: Any, streams: set[threading.Event]
) -> list[Route]:
    """The /v1 routes; `read_json` is the app's body reader; the cancel event of each open
    request is kept in `streams` (the server sets them all when it stops, so every stream
    still ends with its last chunk and [DONE])."""
    engine = service.engine
    mail: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mail] = weakref.WeakKeyDictionary()

    def guarded(endpoint: Any) -> Any:
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Exception as exc:  # one log line and an OpenAI error object
                log.error(
                    "%s %s failed: %s: %s",
                    request.method,
                    request.url.path,
                    type(exc).__name__,
                    exc,
                )
                return openai_error(500, f"internal error: {type(exc).__name__}")

        return run

    async def models(request: Request) -> Response:
        entry = {"id": service.name, "object": "model", "created": 0, "owned_by": "lamina"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def answer(request: Request, kind: str) -> Response:
        try:
            req = service.parse(await read_json(request), kind)
        except RequestError as exc:
            return openai_error(400, str(exc), exc.param)
        except LaminaError as exc:
            return openai_error(400, str(exc))
        try:
            ticket = engine.admit()
        except Busy as exc:
            return openai_error(503, str(exc))
        cancel = threading.Event()
        streams.add(cancel)  # the server's stop ends this request too
        handed_over = False
        try:
            try:
                job = await engine.off_loop(service.prepare, req, cancel=cancel)
            except RequestError as exc:
                return openai_error(400, str(exc), exc.param)
            except PrepTimeout as exc:
                return openai_error(500, str(exc))
            except Stopping as exc:
                return openai_error(503, str(exc))
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

            box = mail.get(loop) or mail.setdefault(loop, Mail(loop))

            def sink(i: int, kind: str, payload: Any) -> None:
                try:
                    box.post(queue, (i, kind, payload))
                except RuntimeError:  # the loop has closed (the server stopped): no one listens
                    cancel.set()

            deadline = time.monotonic() + engine.limits.wait
            try:
                seqs = service.sequences(job, sink, cancel, deadline)
            except LaminaError as exc:
                return openai_error(400, str(exc), "response_format")
            batcher = engine.batcher
            for seq in seqs:
                batcher.submit(seq)
            ident = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
            meta = {"id": ident, "created": int(time.time()), "model": service.name}
            ans = _Answer(service, job, meta)
            first = await queue.get()
            ans.take(first)
            if ans.failure:
                return openai_error(*ans.failure)
            if req.stream:
                handed_over = True
                return StreamingResponse(
                    _stream(ans, first, queue, cancel, streams, ticket),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                )
            while not ans.ended:
                ans.take(await queue.get())
                if ans.failure:
                    return openai_error(*ans.failure)
            return JSONResponse(ans.whole())
        finally:
            if not handed_over:
                streams.discard(cancel)
                cancel.set()
                ticket.release()

    async def chat(request: Request) -> Response:
        return await answer(request, "chat")

    async def completions(request: Request) -> Response:
        return await answer(request, "completion")

    return [
        Route("/v1/models", guarded(models)),
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
    ]


async def _stream(
    ans: _Answer,
    first: tuple[int, str, Any],
    queue: asyncio.Queue[tuple[int, str, Any]],
    cancel: threading.Event,
    streams: set[threading.Event],
    ticket: Any,
) -> AsyncIterator[bytes]:
    try:
        if ans.chat:
            for i in range(ans.req.n):
                yield ans.chunk(i, {"role": "assistant", "content": ""}, None, None)
        for piece in ans.pieces(first):
            yield piece
        while not ans.ended:
            items = [await queue.get()]
            while not queue.empty():  # what else came meanwhile: one write for all of it
                items.append(queue.get_nowait())
            out: list[bytes] = []
            for item in items:
                ans.take(item)
                if ans.failure:
                    break
                out.extend(ans.pieces(item))
                if ans.ended:
                    break
            if out:
                yield b"".join(out)
            if ans.failure:
                yield _data(error_body(ans.failure[1], ans.failure[0]))
                break
        else:
            if ans.req.include_usage:
                obj = "chat.completion.chunk" if ans.chat else "text_completion"
                yield _data({**ans.meta, "object": obj, "choices": [], "usage": ans.usage()})
        yield b"data: [DONE]\n\n"
    finally:
        streams.discard(cancel)
        cancel.set()  # the client left (or the stream ended): stop at the next step
        ticket.release()
