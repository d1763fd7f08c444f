"""`lamina serve MODEL [--port 8000]`: the local playground (see `lamina.serve` for the API).

MODEL is anything `lamina.open` reads: a lamina run or model folder, a Hugging Face folder, a
.gguf file.

Binds 127.0.0.1 by default; a host that is not a loopback address is refused unless
--allow-remote is given (the page has no authentication). Requests from web pages of other
origins, and Host names that are not loopback (DNS rebinding), are refused with 403 unless
--allow-origin (or LAMINA_ORIGINS, comma-separated) names the origin (`lamina.serve.guard`).

The OpenAI-compatible API decodes up to --slots requests together, each in a KV-cache row of
--context tokens, allocated at start (slots x context that cannot fit is refused here, naming
the size); a request that finds no slot within --wait seconds gets 503. A model whose weights
are not finite is refused, as chat, sample and eval refuse it. Needs the `serve` extra
(starlette, uvicorn, llguidance): `pip install 'lamina[serve]'`.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys

from lamina.cli import open_for
from lamina.cli.flags import add_keep_quantized
from lamina.errors import LaminaError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a local web playground and an OpenAI-compatible API (batched, JSON schemas, tools)",
        description="Serve a web page and a small HTTP API over a trained model (generate with "
        "sampling controls, click a token to see each head's attention and the top-k "
        "alternatives), a chat page, and an OpenAI-compatible /v1 API whose requests decode "
        "together in one batch (--slots), with response_format JSON schemas, tool calls, "
        "logprobs and n choices. Stop with Ctrl-C.",
    )
    p.add_argument(
        "run",
        metavar="MODEL",
        help="a lamina run or model folder, a Hugging Face folder, or a .gguf file",
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0 = any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host that other machines can reach (no authentication: careful)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also answer web pages from ORIGIN, e.g. https://app.example.com (* wildcards; "
        "repeatable; LAMINA_ORIGINS adds more, comma-separated)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=400, help="most tokens per generation (default: 400)"
    )
    p.add_argument(
        "--max-prompt", type=int, default=2000, help="longest prompt in characters (default: 2000)"
    )
    p.add_argument(
        "--queue", type=int, default=32, help="requests running or waiting at once (default: 32)"
    )
    p.add_argument(
        "--slots",
        type=int,
        default=8,
        help="sequences decoding together in one batch, each with its own KV cache "
        "(default: 8); memory is slots x context tokens of KV cache",
    )
    p.add_argument(
        "--context",
        type=int,
        default=2048,
        help="tokens of KV cache per slot, at most the model's block size (default: 2048); "
        "longer chats drop their oldest turns",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=30.0,
        help="seconds a request may wait for a free slot before a 503 (default: 30)",
    )
    p.add_argument(
        "--max-connections", type=int, default=64, help="open connections at once (default: 64)"
    )
    p.add_argument(
        "--kv-cache",
        choices=("f16", "f32"),
        default="f16",
        help="the slots' KV caches where the native step runs: f16 (default: half the memory "
        "and the bytes each step's attention reads) or f32",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        metavar="N",
        help="a streamed reply's text goes out every N tokens, merged into one chunk (1: every "
        "token); a choice's first token always goes at once and the rest at its end. Default: 1 "
        "while one request decodes, 4 while several share the batch (each chunk wakes its client "
        "and the server's event loop: fewer wake-ups leave the cores to decoding)",
    )
    add_keep_quantized(p)
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_args(args: argparse.Namespace) -> None:
    if not is_loopback(args.host) and not args.allow_remote:
        raise LaminaError(
            f"--host {args.host} is not a loopback address: other machines could reach the "
            "playground, which has no authentication; add --allow-remote if you mean it"
        )
    if not 0 <= args.port <= 65535:
        raise LaminaError(f"--port must be in 0..65535, got {args.port}")
    for name in ("max_tokens", "max_prompt", "queue", "max_connections", "slots", "context"):
        if getattr(args, name) <= 0:
            flag = "--" + name.replace("_", "-")
            raise LaminaError(f"{flag} must be positive, got {getattr(args, name)}")
    if args.stream_interval is not None and args.stream_interval < 1:
        raise LaminaError(
            f"--stream-interval must be an integer >= 1 (1: every token), got {args.stream_interval}"
        )
    if not args.wait > 0:
        raise LaminaError(f"--wait must be a positive number of seconds, got {args.wait}")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise LaminaError(
            f"lamina serve needs the serve extra ({exc.name} is missing): "
            "pip install 'lamina[serve]'"
        ) from exc
    from lamina.serve import Engine, Limits, server

    bundle = open_for(args.run, "serve", quantized=args.keep_quantized)
    model, tokenizer = bundle.model, bundle.tokenizer
    limits = Limits(
        max_tokens=args.max_tokens,
        max_prompt_chars=args.max_prompt,
        queue=args.queue,
        max_connections=args.max_connections,
        slots=args.slots,
        context=args.context,
        wait=args.wait,
        kv16=args.kv_cache == "f16",
        stream_interval=args.stream_interval,
    )
    engine = Engine(model, tokenizer, limits)
    _ = engine.batcher  # the slots' KV caches, allocated now: one that cannot fit is refused here
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise LaminaError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    c = model.config
    width = engine.batcher.caches[0].k.element_size()
    kv_mb = 2 * c.n_layers * c.kv_heads * c.head_dim * width * engine.context * args.slots / 2**20
    print(
        f"lamina serve: http://{shown}:{port}/  (Ctrl-C to stop; {args.slots} slots x "
        f"{engine.context} tokens, KV cache {kv_mb:,.0f} MB)",
        flush=True,
    )
    from lamina.serve.guard import origins_from_env

    srv = server(engine, host, port, origins=(*args.allow_origin, *origins_from_env()))
    try:
        srv.run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
    print("lamina serve: stopped", file=sys.stderr)
    return 0
