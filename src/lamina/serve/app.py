"""The HTTP side of the playground: a Starlette app, server-sent events, JSON errors.

    create_app(engine) -> Starlette app          serve(engine, host, port) -> runs uvicorn

Routes (the API is documented in `lamina.serve`): GET / (the page), GET /static/* (its JS and
CSS, shipped as package data), GET /api/info, POST /api/generate (text/event-stream),
POST /api/attention (JSON), GET /chat (the chat page), and the OpenAI-compatible /v1 API
(`openai_api.py`). Every request passes `guard.Guard` first (a foreign Host or Origin is
answered 403). Every error is a JSON object {"error": "..."} with a 4xx/5xx
status; an unexpected exception in an endpoint is logged as one line (no traceback) and
answered with 500,
and the server keeps serving.

Streaming: the worker thread hands each event to the event loop (`call_soon_threadsafe`) and
the response yields it as `event: NAME` / `data: JSON`. When the client goes away Starlette
cancels the response; its `finally` sets the job's cancel event, so generation stops at the
next token. On Ctrl-C (`server`'s handle_exit) every open stream is cancelled the same way, so
each ends with its final event ("done", reason "cancelled", or an "error" for a job that had not
started) before uvicorn stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lamina.errors import LaminaError
from lamina.serve.chat_service import ChatService
from lamina.serve.engine import Busy, Engine
from lamina.serve.guard import Guard
from lamina.serve.openai_api import openai_routes

log = logging.getLogger("lamina.serve")
MAX_BODY = 64 * 1024  # bytes of JSON a request may send


def error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


MAX_DEPTH = 64  # nesting of arrays and objects a request body may have


async def read_json(request: Request) -> Any:
    """The body as JSON: at most MAX_BODY bytes and MAX_DEPTH levels (LaminaError otherwise)."""
    if int(request.headers.get("content-length") or 0) > MAX_BODY:
        raise LaminaError(f"request body is over {MAX_BODY} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise LaminaError(f"request body is over {MAX_BODY} bytes")
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LaminaError(f"the request body is not valid JSON ({exc})") from exc
    except RecursionError:
        raise LaminaError(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    check_depth(value)
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """LaminaError if lists and dicts nest deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth > limit:
                raise LaminaError(f"the request body nests deeper than {limit} levels")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def guarded(endpoint: Any) -> Any:
    """An endpoint whose unexpected exceptions become one log line and a JSON 500."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:
            log.error(
                "%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc
            )
            return error(500, f"internal error: {type(exc).__name__}")

    return run


def create_app(
    engine: Engine,
    model_name: str = "lamina",
    *,
    origins: tuple[str, ...] = (),
    any_host: bool = False,
) -> Starlette:
    """The app; `origins` / `any_host`: what the guard lets through besides loopback."""
    streams: set[threading.Event] = set()  # the cancel events of the open streams
    static = resources.files("lamina.serve") / "static"
    index_html = (static / "index.html").read_bytes()

    async def index(request: Request) -> Response:
        return Response(index_html, media_type="text/html; charset=utf-8")

    chat_html = (static / "chat.html").read_bytes()

    async def chat_page(request: Request) -> Response:
        return Response(chat_html, media_type="text/html; charset=utf-8")

    async def info(request: Request) -> Response:
        return JSONResponse(engine.info)

    async def generate(request: Request) -> Response:
        try:
            req = engine.generate_request(await read_json(request))
        except LaminaError as exc:
            return error(400, str(exc))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, dict] | None] = asyncio.Queue()
        cancel = threading.Event()

        def emit(name: str, data: dict) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (name, data))

        def job() -> None:
            try:
                engine.run_generation(req, cancel, emit)
            except Exception as exc:  # reported to the client; the server keeps going
                log.error("generation failed: %s: %s", type(exc).__name__, exc)
                emit("error", {"error": f"generation failed: {exc}"})
            finally:
                loop.call_soon_threadsafe(events.put_nowait, None)

        try:
            engine.submit(job)
        except Busy as exc:
            return error(503, str(exc), **{"Retry-After": "1"})

        async def body() -> AsyncIterator[bytes]:
            streams.add(cancel)
            ended = False
            try:
                while (item := await events.get()) is not None:
                    ended = ended or item[0] in ("done", "error")
                    yield sse(*item)
                if not ended:  # cancelled before it started (the server is stopping)
                    yield sse("error", {"error": "the server is shutting down"})
            finally:
                streams.discard(cancel)
                cancel.set()  # the client left (or the stream ended): stop at the next token

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def attention(request: Request) -> Response:
        try:
            text = engine.attention_request(await read_json(request))
            future = engine.submit(engine.run_attention, text)
        except Busy as exc:
            return error(503, str(exc), **{"Retry-After": "1"})
        except LaminaError as exc:
            return error(400, str(exc))
        try:
            return JSONResponse(await asyncio.wrap_future(future))
        except LaminaError as exc:
            return error(400, str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        return error(status, getattr(exc, "detail", "") or "error")

    routes = [
        Route("/", guarded(index)),
        Route("/api/info", guarded(info)),
        Route("/api/generate", guarded(generate), methods=["POST"]),
        Route("/api/attention", guarded(attention), methods=["POST"]),
        Route("/chat", guarded(chat_page)),
        *openai_routes(ChatService(engine, model_name), read_json, streams),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    handlers = {HTTPException: http_error}
    guard = Middleware(Guard, origins=origins, any_host=any_host)
    app = Starlette(routes=routes, exception_handlers=handlers, middleware=[guard])
    app.state.engine = engine
    app.state.stop_streams = lambda: [c.set() for c in list(streams)]
    return app


def server(
    engine: Engine,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    origins: tuple[str, ...] = (),
    model_name: str = "lamina",
) -> Any:
    """A uvicorn Server for the app (call `.run()`; set `.should_exit` to stop it). Bound to a
    loopback address, the guard also refuses foreign Host names; `origins` are let through."""
    import uvicorn

    from lamina.serve.guard import is_loopback_name

    app = create_app(engine, model_name, origins=origins, any_host=not is_loopback_name(host))

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.stop_streams()  # each stream ends with its final event
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        limit_concurrency=engine.limits.max_connections,
        timeout_graceful_shutdown=2,
        access_log=False,
        lifespan="off",  # no startup/shutdown hooks; its task logged a traceback on Ctrl-C
    )
    return Server(config)
