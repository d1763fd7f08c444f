"""The playground under measurement: first token, streamed tokens/s vs `lamina sample`, a flood.

    PYTHONPATH=src python bench/serve.py RUN [--tokens 200] [--clients 50] [--queue 8]

Starts `lamina serve RUN` as a subprocess on a free 127.0.0.1 port, then prints:
  1. page load to first streamed token: GET / and its static files and /api/info, then
     POST /api/generate until the first token event (plain HTTP); and the same in headless
     Chromium (goto -> click Generate -> first token span) where Playwright and Chromium exist;
  2. tokens/s: as streamed to a client over SSE, against `lamina sample` in this process
     (same model, length and sampling; its model-loading time, measured with one token,
     subtracted);
  3. --clients concurrent generations: how many were served (200 and done), refused at once
     (503), failed otherwise; the server's RSS before, at its peak and after; whether it still
     answers and whether its log has a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SAMPLING = {"temperature": 0.8, "top_k": 50, "seed": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def generate(port: int, body: dict, first: list | None = None) -> tuple[int, int, float]:
    """(status, tokens received, seconds from request to the last event)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    tokens = 0
    try:
        conn.request("POST", "/api/generate", body=json.dumps(body).encode())
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return r.status, 0, time.perf_counter() - t0
        for _ in range(1_000_000):
            line = r.readline()
            if not line:
                break
            if line.startswith(b"event: token"):
                tokens += 1
                if first is not None and not first:
                    first.append(time.perf_counter() - t0)
            elif line.startswith(b"event: done"):
                r.readline()
                return 200, tokens, time.perf_counter() - t0
        return -1, tokens, time.perf_counter() - t0
    finally:
        conn.close()


def first_token_http(port: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    for path in ("/", "/static/app.js", "/static/style.css", "/api/info"):
        assert get(port, path)[0] == 200, path
    page = time.perf_counter() - t0
    first: list[float] = []
    generate(port, {"prompt": "ROMEO:", "max_tokens": 5, **SAMPLING}, first)
    return page, page + first[0]


def first_token_browser(port: int) -> float | None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if exe is None:
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('model-info').textContent.length > 0")
            page.click("#generate")
            page.wait_for_selector("#output .tok.gen", timeout=60_000)
            return time.perf_counter() - t0
        finally:
            browser.close()


def sample_rate(run: str, tokens: int) -> float:
    from lamina.cli import main

    def timed(n: int) -> float:
        argv = ["sample", run, "--prompt", "ROMEO:", "--max-new-tokens", str(n)]
        argv += ["--temperature", "0.8", "--top-k", "50", "--seed", "1"]
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(argv) == 0
        return time.perf_counter() - t0

    overhead = min(timed(1) for _ in range(2))
    best = min(timed(tokens) for _ in range(2))
    return (tokens - 1) / max(best - overhead, 1e-9)


def flood(port: int, pid: int, clients: int, tokens: int) -> dict:
    results: list[tuple[int, int, float]] = []
    lock = threading.Lock()
    peak = [rss_mb(pid)]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.02)

    def client() -> None:
        try:
            res = generate(port, {"prompt": "ROMEO:", "max_tokens": tokens, **SAMPLING})
        except OSError as exc:
            res = (-2, 0, 0.0)
            print(f"  client error: {exc}", file=sys.stderr)
        with lock:
            results.append(res)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    served = [r for r in results if r[0] == 200]
    return {
        "served": len(served),
        "served_complete": sum(1 for r in served if r[1] == tokens),
        "refused_503": sum(1 for r in results if r[0] == 503),
        "other": [r[0] for r in results if r[0] not in (200, 503)],
        "wall_s": wall,
        "slowest_served_s": max((r[2] for r in served), default=0.0),
        "slowest_refusal_s": max((r[2] for r in results if r[0] == 503), default=0.0),
        "peak_rss_mb": peak[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--queue", type=int, default=8)
    args = ap.parse_args()
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"lamina-serve-bench-{port}.log"
    cmd = [sys.executable, "-m", "lamina", "serve", args.run, "--port", str(port)]
    cmd += ["--queue", str(args.queue), "--max-tokens", str(max(args.tokens, 400))]
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                if get(port, "/api/info")[0] == 200:
                    break
            time.sleep(0.05)
        print(f"server pid {proc.pid} on port {port}, RSS {rss_mb(proc.pid):.0f} MB after start")
        page, first = first_token_http(port)
        print(
            f"1. HTTP: page + assets + info {page * 1000:.0f} ms; first token {first * 1000:.0f} ms"
        )
        browser = first_token_browser(port)
        if browser is None:
            print("   browser: skipped (no Playwright or Chromium)")
        else:
            print(f"   Chromium: goto -> first streamed token on the page {browser * 1000:.0f} ms")
        status, n, secs = generate(
            port, {"prompt": "ROMEO:", "max_tokens": args.tokens, **SAMPLING}
        )
        streamed = n / secs
        sampled = sample_rate(args.run, args.tokens)
        print(
            f"2. tokens/s: streamed over SSE {streamed:.0f} (client-side, {n} tokens), "
            f"lamina sample {sampled:.0f} in-process; ratio {streamed / sampled:.2f}"
        )
        before = rss_mb(proc.pid)
        res = flood(port, proc.pid, args.clients, args.tokens)
        after = rss_mb(proc.pid)
        alive = get(port, "/api/info")[0] == 200
        traceback = "Traceback" in log.read_text()
        print(
            f"3. {args.clients} concurrent generations of {args.tokens} tokens (queue {args.queue}): "
            f"served {res['served']} ({res['served_complete']} complete), refused 503 "
            f"{res['refused_503']}, other {res['other'] or 0}; wall {res['wall_s']:.1f} s, slowest "
            f"served {res['slowest_served_s']:.1f} s, slowest refusal "
            f"{res['slowest_refusal_s'] * 1000:.0f} ms"
        )
        print(
            f"   RSS before {before:.0f} MB, peak {res['peak_rss_mb']:.0f} MB, after {after:.0f} MB; "
            f"still serving: {alive}; traceback in the log: {traceback}"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
