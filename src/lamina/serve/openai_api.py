"""An OpenAI-compatible HTTP API over the served model: what the `openai` client library calls.

    GET  /v1/models                 the one model, by the name given to `lamina serve`
    POST /v1/chat/completions       {"messages": [...], "stream": bool, ...}
    POST /v1/completions            {"prompt": "...", "stream": bool, ...}

Answers have OpenAI's shapes: `chat.completion` / `text_completion` objects with `choices`
(n of them; a chat message's `tool_calls` with finish_reason "tool_calls"; `logprobs` when
asked) and `usage` (prompt, completion and total tokens; `prompt_tokens_details.cached_tokens`
counts the prompt tokens a KV-cache row already held). With `"stream": true` the answer is
server-sent events: the role, then one `data: {chunk}` per piece of text (a choice's first
token at once, later ones every `Limits.stream_interval` tokens, merged into one chunk:
`pacing.py`; the JSON is built in `answers.py`), a last chunk per choice with `finish_reason`,
a usage chunk when `stream_options.include_usage` is set, then `data: [DONE]` (a reply with
tools is sent whole when it ends, as its text may be a call).

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
from lamina.serve.answers import Answer, data, error_body
from lamina.serve.chat_service import ChatService, RequestError
from lamina.serve.engine import Busy, PrepTimeout, Stopping
from lamina.serve.pacing import Pace, every_for
from lamina.serve.workers import Mail

log = logging.getLogger("lamina.serve")


def openai_error(status: int, message: str, param: str | None = None) -> Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(message, status, param), status_code=status, headers=headers)


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

            def post(item: tuple[int, str, Any]) -> None:
                try:
                    box.post(queue, item)
                except RuntimeError:  # the loop has closed (the server stopped): no one listens
                    cancel.set()

            ident = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
            meta = {"id": ident, "created": int(time.time()), "model": service.name}
            ans = Answer(service, job, meta)
            batcher = engine.batcher
            every = every_for(engine.limits.stream_interval, batcher)
            pace = Pace(post, req.n, every if req.stream and not ans.hold else None)
            deadline = time.monotonic() + engine.limits.wait
            try:
                seqs = service.sequences(job, pace.sink, cancel, deadline)
            except LaminaError as exc:
                return openai_error(400, str(exc), "response_format")
            for seq in seqs:
                batcher.submit(seq)
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
    ans: Answer,
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
                yield data(error_body(ans.failure[1], ans.failure[0]))
                break
        else:
            if ans.req.include_usage:
                obj = "chat.completion.chunk" if ans.chat else "text_completion"
                yield data({**ans.meta, "object": obj, "choices": [], "usage": ans.usage()})
        yield b"data: [DONE]\n\n"
    finally:
        streams.discard(cancel)
        cancel.set()  # the client left (or the stream ended): stop at the next step
        ticket.release()
