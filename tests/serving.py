"""Helpers for the playground tests: a tiny char model and a live server on a free port."""

from __future__ import annotations

import contextlib
import functools
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


# A Qwen2.5-style chat template that renders tools and <tool_call> blocks (written for these
# tests after the shape of Qwen2.5's: tools listed in the system turn, calls as JSON in tags,
# tool results as <tool_response> in a user turn).
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@functools.lru_cache(maxsize=4)
def bpe_chat_model(template: str = QWEN_TOOLS, block_size: int = 2048):
    """A tiny random llama-style GPT over a byte-level BPE tokenizer (every byte spellable,
    so any JSON can be written) with `template`; its end-of-turn logit zeroed."""
    from chat_fixtures import talkative
    from tiny_tokenizers import byte_level_bpe

    from lamina.tokenizers.pretrained import PretrainedTokenizer

    hf = byte_level_bpe()
    hf.add_tokens(["<tool_call>", "</tool_call>"])
    end = hf.token_to_id("<|im_end|>")
    tok = PretrainedTokenizer(hf.to_str(), eos_id=end, eot_ids=[end], chat_template=template)
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=block_size)
    return talkative(GPT(config).eval(), tok), tok
