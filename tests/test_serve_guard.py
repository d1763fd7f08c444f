"""lamina serve's guard: foreign Host names and Origins get 403 (DNS rebinding, cross-site
requests), --allow-origin lets one in; Ctrl-C ends open streams with a final event."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import torch  # noqa: E402
from serving import TEXT, live_server, tiny_model  # noqa: E402

import lamina  # noqa: E402
from lamina import GPT, GPTConfig  # noqa: E402
from lamina.data import CharTokenizer  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402
from lamina.serve.guard import origins_from_env  # noqa: E402

BODY = json.dumps({"prompt": "R", "max_tokens": 3}).encode()


def post(addr, headers: dict[str, str], method: str = "POST") -> http.client.HTTPResponse:
    # generous: a first request in a fresh session may build the native library (~15 s)
    conn = http.client.HTTPConnection(*addr, timeout=120)
    conn.putrequest(method, "/api/generate", skip_host="Host" in headers)
    for k, v in {"Content-Type": "text/plain", **headers}.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(BODY)))
    conn.endheaders(BODY)
    resp = conn.getresponse()
    resp.body = resp.read()
    conn.close()
    return resp


@pytest.fixture(scope="module")
def served():
    model, tok = tiny_model()
    engine = Engine(model, tok, Limits(max_tokens=10))
    with live_server(engine) as addr:
        yield addr


def test_foreign_host_and_origin_are_refused(served):
    """The issue's curl: Host and Origin evil.example.com -> 403, a JSON error, no stream."""
    for headers in (
        {"Host": "evil.example.com", "Origin": "http://evil.example.com"},
        {"Host": "evil.example.com:8000"},
        {"Origin": "http://evil.example.com"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1.evil.example.com"},
    ):
        resp = post(served, headers)
        assert resp.status == 403, headers
        assert "error" in json.loads(resp.body)


def test_loopback_names_and_origins_pass(served):
    port = served[1]
    for headers in (
        {},
        {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
        {"Host": f"[::1]:{port}", "Origin": "http://127.0.0.1:5173"},
    ):
        resp = post(served, headers)
        assert resp.status == 200, (headers, resp.body)
        assert b"event: done" in resp.body


def test_allow_origin_lets_one_origin_in_with_cors_headers(monkeypatch):
    monkeypatch.setenv("LAMINA_ORIGINS", "https://b.example.org, https://*.example.com")
    assert origins_from_env() == ("https://b.example.org", "https://*.example.com")
    model, tok = tiny_model()
    from lamina.serve import server

    assert "origins" in server.__kwdefaults__
    engine = Engine(model, tok, Limits(max_tokens=10))
    with live_server(engine, origins=origins_from_env()) as addr:
        ok = post(addr, {"Origin": "https://app.example.com"})
        assert ok.status == 200
        assert ok.getheader("access-control-allow-origin") == "https://app.example.com"
        pre = post(addr, {"Origin": "https://b.example.org"}, method="OPTIONS")
        assert pre.status == 204 and "POST" in pre.getheader("access-control-allow-methods")
        assert post(addr, {"Origin": "https://example.net"}).status == 403


def test_ctrl_c_mid_stream_ends_with_a_final_event_and_no_traceback(tmp_path):
    """SIGINT while a generation streams: the stream's last event is "done" (cancelled) or an
    error, and `lamina serve` exits (0, or 130 as for any Ctrl-C) with no traceback."""
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=4096, d_model=128, n_heads=4, n_layers=4)
    lamina.save(tmp_path / "m", GPT(cfg), tok)
    env = {**os.environ, "PYTHONPATH": str(Path(lamina.__file__).parent.parent)}
    cmd = [sys.executable, "-m", "lamina", "serve", str(tmp_path / "m"), "--port", "0"]
    cmd += ["--max-tokens", "4000", "--context", "4096"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        line = proc.stdout.readline().decode()
        assert "http://127.0.0.1:" in line, line + proc.stderr.read().decode()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        # Long enough that the Ctrl-C lands mid-stream: this tiny model makes 400 tokens in
        # about the 0.1 s uvicorn takes to see a signal, so a short stream could end first.
        body = json.dumps({"prompt": "R", "max_tokens": 4000, "temperature": 1.0})
        for _ in range(200):  # bounded: the socket is bound before uvicorn listens on it
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", "/api/generate", body=body)
                break
            except ConnectionRefusedError:
                conn.close()
                time.sleep(0.05)
        resp = conn.getresponse()
        names: list[str] = []
        while len(names) < 10000:
            raw = resp.readline()
            if not raw:
                break
            text = raw.decode().strip()
            if text.startswith("event: "):
                names.append(text[7:])
                if names[-1] == "token" and names.count("token") == 2:
                    proc.send_signal(signal.SIGINT)  # once: a second Ctrl-C forces the exit
        conn.close()
        assert names[-1] in ("done", "error") and names.count("token") < 4000, names[-5:]
        code = proc.wait(timeout=30)
        err = proc.stderr.read().decode()
        assert code in (0, 130) and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
