"""Helpers for the playground tests: a tiny char model and a live server on a free port."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from lamina import GPT, GPTConfig
from lamina.data import CharTokenizer

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET: ay me!\n"


def tiny_model() -> tuple[GPT, CharTokenizer]:
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    config = GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=32, init_std=0.1)
    return GPT(config).eval(), tok


@contextlib.contextmanager
def live_server(engine: Any, **options: Any) -> Iterator[tuple[str, int]]:
    """Serve `engine` on 127.0.0.1 at a free port; always shut down (and the engine closed).
    `options` go to `lamina.serve.server` (e.g. origins=...)."""
    from lamina.serve import server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = server(engine, "127.0.0.1", port, **options)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # bounded: 10 s at most
            if srv.started:
                break
            time.sleep(0.05)
        assert srv.started, "the server did not start"
        yield "127.0.0.1", port
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        engine.close()
        sock.close()


def request(
    addr: tuple[str, int], method: str, path: str, body: Any = None, raw: bytes | None = None
):
    """(status, headers, parsed JSON or text)."""
    conn = http.client.HTTPConnection(*addr, timeout=20)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        kind = resp.getheader("content-type", "")
        return resp.status, resp, json.loads(text) if "json" in kind else text
    finally:
        conn.close()


def events(
    addr: tuple[str, int], body: dict, *, stop_after: int | None = None
) -> list[tuple[str, dict]]:
    """POST /api/generate and parse its server-sent events (closing early after `stop_after`
    token events, as a client that goes away)."""
    conn = http.client.HTTPConnection(*addr, timeout=20)
    out: list[tuple[str, dict]] = []
    try:
        conn.request("POST", "/api/generate", body=json.dumps(body).encode())
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.getheader("content-type").startswith("text/event-stream")
        name = None
        for _ in range(100_000):  # bounded
            line = resp.readline()
            if not line:
                break
            line = line.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                tokens = sum(1 for n, _ in out if n == "token")
                if stop_after is not None and tokens >= stop_after:
                    break
    finally:
        conn.close()
    return out
