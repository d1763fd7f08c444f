"""Who may talk to the playground: a Host and Origin guard in front of every route.

A server on 127.0.0.1 is reachable from any web page the user opens: a page can POST to it
(a "simple" cross-site request needs no preflight), and a name that the attacker's DNS points
at 127.0.0.1 (DNS rebinding) makes the browser treat the server as the page's own origin. So,
as Ollama does (OLLAMA_ORIGINS), every HTTP request is checked before any route sees it:

    Host    must be a loopback name (localhost, *.localhost, 127.0.0.0/8, ::1); a request
            without one (HTTP/1.0, not a browser) passes. Anything else: 403. Bound to an
            address other machines reach (--allow-remote), any Host passes (hosts=None), as
            they name the machine as they know it.
    Origin  absent (curl, a same-origin GET) passes; http(s) on a loopback host (any port)
            passes; so does one matching `origins` (--allow-origin, LAMINA_ORIGINS; `*` is a
            wildcard, e.g. "https://*.example.com"). Anything else, "null" included: 403.

An allowed foreign origin gets Access-Control-Allow-Origin on its answers and a 204 to its
preflight (OPTIONS), so a page there can read them.

    Guard(app, origins=(), any_host=False)  ASGI middleware
    origins_from_env(environ)             LAMINA_ORIGINS split on commas

Deliberately unaware of the routes, the engine and uvicorn.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

ENV = "LAMINA_ORIGINS"
Scope = dict[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Any]


def origins_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    raw = (os.environ if environ is None else environ).get(ENV, "")
    return tuple(o.strip() for o in raw.split(",") if o.strip())


def split_host(host: str) -> str:
    """'name:port', '[::1]:port' or 'name' -> the lower-cased name without brackets or port."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """ASGI middleware: 403 for a foreign Host or Origin (see the module docstring)."""

    def __init__(self, app: ASGI, origins: Iterable[str] = (), any_host: bool = False) -> None:
        self.app = app
        self.origins = tuple(o.rstrip("/").lower() for o in origins)
        self.any_host = any_host

    def host_ok(self, host: str | None) -> bool:
        return host is None or self.any_host or is_loopback_name(split_host(host))

    def origin_ok(self, origin: str) -> tuple[bool, bool]:
        """(allowed, foreign): a loopback origin is allowed and not foreign."""
        o = origin.strip().rstrip("/").lower()
        parts = urlsplit(o)
        if (
            parts.scheme in ("http", "https")
            and parts.hostname
            and is_loopback_name(parts.hostname)
        ):
            return True, False
        return any(fnmatch.fnmatchcase(o, pat) for pat in self.origins), True

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        allowed, foreign = self.origin_ok(origin) if origin is not None else (True, False)
        if not self.host_ok(headers.get("host")) or not allowed:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
        if not self.host_ok(headers.get("host")):
            await _refuse(send, f"Host {headers['host']!r} is not this server's (DNS rebinding?)")
            return
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not allowed:
            await _refuse(
                send, f"Origin {origin!r} may not use this server (see lamina serve --allow-origin)"
            )
            return
        if not foreign:
            await self.app(scope, receive, send)
            return
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS":  # a preflight
            cors += [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", b"Content-Type"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": cors})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _refuse(send: Any, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": body})
