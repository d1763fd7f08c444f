"""An OpenAI-compatible HTTP API over the served model: what the `openai` client library calls.

    GET  /v1/models                 the one model, by the name given to `lamina serve`
    POST /v1/chat/completions       {"messages": [...], "stream": bool, ...}
    POST /v1/completions            {"prompt": "...", "stream": bool, ...}

Answers have OpenAI's shapes: `chat.completion` / `text_completion` objects with `choices`
and `usage` (prompt, completion and total tokens; `prompt_tokens_details.cached_tokens` counts
the prompt tokens the KV cache already held). With `"stream": true` the answer is server-sent
events, one `data: {chunk}` per piece of text, a last chunk with `finish_reason`, a usage chunk
when `stream_options.include_usage` is set, then `data: [DONE]`. Errors are OpenAI's error
object `{"error": {"message", "type", "param", "code"}}` with a 4xx status (503 with
Retry-After when the queue is full). A client that disconnects stops its generation at the
next token. The fields and their checks are in `chat_service.py`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lamina.errors import LaminaError
from lamina.generation.conversation import Reply
from lamina.serve.chat_service import ChatService, Job, RequestError
from lamina.serve.engine import Busy


def openai_error(status: int, message: str, param: str | None = None, kind: str = "") -> Response:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(
        body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None
    )


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _usage(last: Reply | None) -> dict[str, Any]:
    p = last.prompt_tokens if last else 0
    c = last.completion_tokens if last else 0
    cached = last.cached_tokens if last else 0
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _data(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def openai_routes(
    service: ChatService, read_json: Any, guarded: Any, streams: set[threading.Event]
) -> list[Route]:
    """The /v1 routes; `read_json` and `guarded` are the app's body reader and error guard;
    the cancel event of each open stream is kept in `streams` (the server sets them all when
    it stops, so every stream still ends with its last chunk and [DONE])."""
    engine = service.engine

    async def models(request: Request) -> Response:
        entry = {"id": service.name, "object": "model", "created": 0, "owned_by": "lamina"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def answer(request: Request, kind: str) -> Response:
        try:
            body = await read_json(request)
            job = service.chat_request(body) if kind == "chat" else service.completion_request(body)
        except RequestError as exc:
            return openai_error(400, str(exc), exc.param)
        except LaminaError as exc:
            return openai_error(400, str(exc))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Reply | None] | None] = asyncio.Queue()
        cancel = threading.Event()

        def emit(text: str, last: Reply | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (text, last))

        def work() -> None:
            try:
                service.run(job, cancel, emit)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        try:
            engine.submit(work)
        except Busy as exc:
            return openai_error(503, str(exc), kind="server_error")
        ident = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        meta = {"id": ident, "created": int(time.time()), "model": service.name}
        if job.stream:
            return StreamingResponse(
                _stream(job, queue, cancel, meta, streams),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        parts, last = [], None
        try:
            while (item := await queue.get()) is not None:
                parts.append(item[0])
                last = item[1] or last
        finally:
            cancel.set()
        text = "".join(parts)
        if job.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": _finish(last and last.finish),
                "logprobs": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": _finish(last and last.finish),
                "logprobs": None,
            }
            obj = "text_completion"
        return JSONResponse({**meta, "object": obj, "choices": [choice], "usage": _usage(last)})

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
    job: Job,
    queue: asyncio.Queue[tuple[str, Reply | None] | None],
    cancel: threading.Event,
    meta: dict[str, Any],
    streams: set[threading.Event],
) -> AsyncIterator[bytes]:
    chat = job.kind == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, role: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return _data({**meta, "object": obj, "choices": [choice]})

    streams.add(cancel)
    try:
        if chat:
            yield chunk("", role=True)
        last = None
        while (item := await queue.get()) is not None:
            text, reply = item
            if reply is not None:
                last = reply
            elif text:
                yield chunk(text)
        yield chunk(None, _finish(last and last.finish))
        if job.include_usage:
            yield _data({**meta, "object": obj, "choices": [], "usage": _usage(last)})
        yield b"data: [DONE]\n\n"
    finally:
        streams.discard(cancel)
        cancel.set()  # the client left (or the stream ended): stop at the next token
