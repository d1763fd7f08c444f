"""lamina serve: the HTTP API streams tokens, explains tokens, refuses bad input and floods."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import torch  # noqa: E402
from serving import events, live_server, request, tiny_model  # noqa: E402

from lamina import generate  # noqa: E402
from lamina.cli import main  # noqa: E402
from lamina.cli.serve import is_loopback  # noqa: E402
from lamina.inspect import attention_maps  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402


@pytest.fixture(scope="module")
def served():
    model, tok = tiny_model()
    engine = Engine(model, tok, Limits(max_tokens=50, max_prompt_chars=40, queue=3))
    with live_server(engine) as addr:
        yield addr, engine, model, tok


def test_generate_streams_one_event_per_token_then_done(served):
    addr, _, model, tok = served
    got = events(addr, {"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0})
    names = [n for n, _ in got]
    assert names == ["start"] + ["token"] * 12 + ["done"]
    done = got[-1][1]
    assert done["reason"] == "length" and done["tokens"] == 12
    assert "".join(d["text"] for n, d in got if n == "token") == done["text"]
    greedy = generate(model, torch.tensor([tok.encode("ROMEO:")]), 12)[0, 6:].tolist()
    assert [d["id"] for n, d in got if n == "token"] == greedy


def test_the_same_seed_gives_the_same_text(served):
    addr = served[0]
    body = {"prompt": "JULIET:", "max_tokens": 15, "temperature": 1.0, "top_k": 5, "seed": 7}
    a, b = events(addr, body)[-1][1]["text"], events(addr, body)[-1][1]["text"]
    assert a == b


def test_attention_returns_the_causal_rows_of_every_head(served):
    addr, _, model, tok = served
    status, _, data = request(addr, "POST", "/api/attention", {"text": "ROMEO: But"})
    assert status == 200
    assert data["tokens"] == list("ROMEO: But") and data["cut"] == 0
    L, H = model.config.n_layers, model.config.n_heads
    assert (data["layers"], data["heads"]) == (L, H)
    ref = attention_maps(model, tok.encode("ROMEO: But"))
    for q in (0, 4, 9):
        assert len(data["maps"][1][2][q]) == q + 1
        assert data["maps"][1][2][q] == pytest.approx(ref[1, 2, q, : q + 1].tolist(), abs=1e-4)
    assert len(data["table"]) == 10 and data["table"][0]["actual"] == "O"
    assert len(data["patterns"]) == L and len(data["patterns"][0]) == H


def test_a_long_text_is_cut_to_the_last_block(served):
    addr, _, model, _ = served
    text = "ROMEO: " * 10
    status, _, data = request(addr, "POST", "/api/attention", {"text": text})
    assert status == 200 and data["cut"] == len(text) - model.config.block_size
    assert "".join(data["tokens"]) == text[-model.config.block_size :]


@pytest.mark.parametrize(
    "path, body, raw, message",
    [
        ("/api/generate", None, b"{bad json", "not valid JSON"),
        ("/api/generate", {"prompt": "R" * 41}, None, "limit is 40"),
        ("/api/generate", {"prompt": "RO", "temperature": -0.5}, None, "temperature"),
        ("/api/generate", {"prompt": "RO", "max_tokens": 51}, None, "at most 50"),
        ("/api/generate", {"prompt": "RO", "max_tokens": "5"}, None, "max_tokens"),
        ("/api/generate", {"prompt": "RO", "top_p": 1.5}, None, "top_p"),
        ("/api/generate", {"prompt": "RO", "colour": 1}, None, "unknown field(s): colour"),
        ("/api/generate", [1, 2], None, "JSON object"),
        ("/api/generate", {"prompt": "RO~"}, None, "'~' at position 2"),
        ("/api/attention", {"text": ""}, None, "empty"),
        ("/api/attention", {"txt": "RO"}, None, "unknown field"),
    ],
)
def test_bad_requests_get_400_with_a_json_error(served, path, body, raw, message):
    addr = served[0]
    status, _, data = request(addr, "POST", path, body, raw=raw)
    assert status == 400 and message in data["error"]
    assert request(addr, "GET", "/api/info")[0] == 200  # still serving


def test_unknown_paths_and_methods_are_json_errors(served):
    addr = served[0]
    assert request(addr, "GET", "/nope")[0] == 404
    status, _, data = request(addr, "GET", "/api/generate")
    assert status == 405 and "error" in data


def test_a_full_queue_answers_503_at_once_and_recovers(served):
    addr, engine, _, _ = served
    release = threading.Event()
    held = [engine.submit(release.wait, 10) for _ in range(engine.limits.queue)]
    try:
        t0 = time.perf_counter()
        status, resp, data = request(addr, "POST", "/api/generate", {"prompt": "RO"})
        assert status == 503 and "busy" in data["error"] and resp.getheader("retry-after") == "1"
        status, _, _ = request(addr, "POST", "/api/attention", {"text": "RO"})
        assert status == 503 and time.perf_counter() - t0 < 5
    finally:
        release.set()
        for f in held:
            f.result(timeout=10)
    assert events(addr, {"prompt": "RO", "max_tokens": 3})[-1][0] == "done"


class SlowEngine(Engine):
    """Records each generation's done event; a few ms per token so a client can leave first."""

    def run_generation(self, req, cancel, emit):
        def slow_emit(name, data):
            if name == "token":
                time.sleep(0.005)
            self.finished = data if name == "done" else getattr(self, "finished", None)
            emit(name, data)

        super().run_generation(req, cancel, slow_emit)


def test_a_client_that_disconnects_stops_its_generation():
    model, tok = tiny_model()
    engine = SlowEngine(model, tok, Limits(max_tokens=400))
    with live_server(engine) as addr:
        got = events(addr, {"prompt": "ROMEO:", "max_tokens": 400}, stop_after=3)
        assert [n for n, _ in got][-1] == "token"
        for _ in range(200):  # bounded wait for the worker to notice
            if engine.admitted == 0 and getattr(engine, "finished", None):
                break
            time.sleep(0.02)
        assert engine.finished["reason"] == "cancelled"
        assert engine.finished["tokens"] < 400


def test_loopback_rule_and_cli_refusals(tmp_path, capsys):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert main(["serve", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--port", "0"]) == 2
    assert "not a lamina model" in capsys.readouterr().err
    assert main(["serve", str(tmp_path), "--max-tokens", "0"]) == 2
