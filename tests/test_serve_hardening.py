"""lamina serve never blocks its event loop and never answers a failure with an empty 200
(issue 35.9): deep JSON is a 400, trimming a long chat is a few renders, a hanging template
stalls no other route and does not hold Ctrl-C, a failed generation is a 500 (or an error
chunk), and a model with NaN weights is refused."""

from __future__ import annotations

import math
import signal
import threading
import time

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from chat_fixtures import ChatMLChars, chat_engine  # noqa: E402
from serving import TEXT, live_server, request  # noqa: E402

from lamina import GPT, GPTConfig  # noqa: E402
from lamina.cli import main  # noqa: E402
from lamina.generation.conversation import fit_messages  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402
from lamina.tokenizers import CharTokenizer  # noqa: E402


def chat(content: str = "hi", **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}


def test_deeply_nested_json_is_a_400_error_object():
    engine = chat_engine()
    with live_server(engine) as addr:
        raw = b"[" * 30_000
        status, _, body = request(addr, "POST", "/v1/chat/completions", raw=raw)
        assert status == 400 and "nests deeper" in body["error"]["message"], body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        status, _, body = request(addr, "POST", "/v1/chat/completions", raw=b"[" * 100 + b"]" * 100)
        assert status == 400 and "nests deeper" in body["error"]["message"]
        status, _, body = request(addr, "POST", "/api/generate", raw=raw)
        assert status == 400 and "nests deeper" in body["error"]


def naive_fit(render, messages, context, room):
    """The old rule, one render per dropped turn: the reference for the bisection."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    turns, dropped = messages[len(head) :], 0
    while True:
        ids = render([*head, *turns])
        if len(ids) + room <= context or len(turns) <= 1:
            return ids, dropped
        cut = next((i for i in range(1, len(turns)) if turns[i]["role"] == "user"), len(turns) - 1)
        dropped, turns = dropped + cut, turns[cut:]


def test_trimming_a_long_chat_takes_a_logarithmic_number_of_renders():
    tok = ChatMLChars()
    roles = ["user", "assistant", "assistant", "user", "assistant"]
    messages = [{"role": "system", "content": "be brief"}] + [
        {"role": roles[i % 5], "content": f"message {i}"} for i in range(1900)
    ]
    ids, dropped = fit_messages(tok.render_chat, messages, 600, 64)
    assert tok.calls <= 2 + math.ceil(math.log2(1900)), tok.calls
    assert len(ids) + 64 <= 600 and messages[-1]["content"] in tok.decode(ids)
    for n in (7, 30, 61):  # the same turns dropped as one at a time
        part = messages[: n + 1]
        for context in (120, 300):
            assert fit_messages(tok.render_chat, part, context, 64) == naive_fit(
                tok.render_chat, part, context, 64
            )


class Hanging(ChatMLChars):
    """A chat template that does not return until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def render_chat(self, messages, add_generation_prompt=True, **kw):
        self.release.wait(30)
        return super().render_chat(messages, add_generation_prompt)


def test_a_hanging_template_stalls_no_other_route():
    tok = Hanging()
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=64)).eval()
    engine = Engine(model, tok, Limits(max_tokens=8, prep_seconds=0.5))
    with live_server(engine) as addr:
        got = {}
        t = threading.Thread(
            target=lambda: got.update(r=request(addr, "POST", "/v1/chat/completions", chat()))
        )
        t.start()
        time.sleep(0.1)
        t0 = time.perf_counter()
        assert request(addr, "GET", "/v1/models")[0] == 200
        assert request(addr, "GET", "/api/info")[0] == 200
        assert time.perf_counter() - t0 < 1.0
        t.join(timeout=10)
        status, _, body = got["r"]
        assert status == 500 and "took over 0.5 s" in body["error"]["message"]
        tok.release.set()


def test_ctrl_c_stops_the_server_while_a_template_hangs():
    """What SIGINT calls (the server's handle_exit), sent while a render hangs: the loop is
    free, so the request ends (503) and the server stops at once."""
    import socket

    from lamina.serve import server

    tok = Hanging()
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=64)).eval()
    engine = Engine(model, tok, Limits(max_tokens=8, prep_seconds=30))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    addr = sock.getsockname()
    srv = server(engine, *addr)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if srv.started:
                break
            time.sleep(0.05)
        got = {}
        asking = threading.Thread(
            target=lambda: got.update(r=request(addr, "POST", "/v1/chat/completions", chat()))
        )
        asking.start()
        time.sleep(0.3)  # the render is under way
        t0 = time.perf_counter()
        srv.handle_exit(signal.SIGINT, None)
        thread.join(timeout=10)
        assert not thread.is_alive() and time.perf_counter() - t0 < 4
        asking.join(timeout=5)
        status, _, body = got["r"]
        assert status == 503 and "shutting down" in body["error"]["message"]
    finally:
        tok.release.set()
        srv.should_exit = True
        engine.close()
        sock.close()


def nan_engine() -> Engine:
    engine = chat_engine()
    with torch.no_grad():
        engine.model.head.weight.fill_(float("nan"))
    return engine


def test_a_failed_generation_is_a_500_never_an_empty_200():
    with live_server(nan_engine()) as addr:
        status, _, body = request(addr, "POST", "/v1/chat/completions", chat())
        assert status == 500 and "non-finite" in body["error"]["message"], body
        assert body["error"]["type"] == "server_error"
        status, _, body = request(addr, "POST", "/v1/chat/completions", chat(stream=True))
        assert status == 500 and "non-finite" in body["error"]["message"]
        status, _, body = request(addr, "POST", "/v1/completions", {"prompt": "hi"})
        assert status == 500


def test_an_error_mid_stream_is_an_error_chunk():
    engine = chat_engine()
    with live_server(engine) as addr:
        batcher, calls = engine.batcher, []
        real = batcher._step

        def failing(*args):  # the third step after the first token (prompts may ride steps)
            if batcher.decoding:
                calls.append(1)
            if len(calls) > 2:
                raise RuntimeError("the step broke")
            return real(*args)

        batcher._step = failing
        client = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        got = []
        with pytest.raises(openai.APIError, match="the step broke"):
            for c in client.chat.completions.create(
                model="x", messages=chat()["messages"], max_tokens=20, stream=True, temperature=0
            ):
                got.append(c)
        assert got  # it had started
        batcher._step = real
        r = client.chat.completions.create(model="x", messages=chat()["messages"], max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length")  # still serving


def test_serve_refuses_a_model_with_nan_weights(tmp_path, capsys, monkeypatch):
    import lamina.serve.app

    def started(*a, **k):
        raise AssertionError("the server started")

    monkeypatch.setattr(lamina.serve.app, "server", started)
    tok = CharTokenizer.from_text(TEXT)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=32))
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    lamina.save(tmp_path / "m", model, tok)
    assert main(["serve", str(tmp_path / "m"), "--port", "0"]) == 2
    assert "not finite" in capsys.readouterr().err
