"""Muon's Newton-Schulz iteration in fp32 vs bf16 on this machine, at lamina's CPU widths.

    python bench/muon_ns.py [--widths 128,256,384] [--repeats N] [--threads N]

For each width d, the matrices of one transformer block (qkv 3d x d, attention out d x d, the
feed-forward's 4d x d and d x 4d) are orthogonalized with 5 steps (what MuonAdamW does per step
per block), median of N repeats, in fp32 and in bf16 (`lamina.training.muon.orthogonalize`).
On CPUs without native bf16 matrix units (AVX2), bf16 matmuls are emulated and slower.

Every engine runs under its own default OpenMP settings (no OMP_* variable is set here).
"""

from __future__ import annotations

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from lamina.cpu import native_bf16  # noqa: E402
from lamina.training.muon import orthogonalize  # noqa: E402


def block_ms(d: int, dtype: torch.dtype, repeats: int) -> float:
    torch.manual_seed(0)
    mats = [torch.randn(3 * d, d), torch.randn(d, d), torch.randn(4 * d, d), torch.randn(d, 4 * d)]
    for m in mats:  # warm-up
        orthogonalize(m, 5, dtype)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for m in mats:
            orthogonalize(m, 5, dtype)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="128,256,384")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads, native bf16: {native_bf16()}")
    print(f"{'width':>5}  {'fp32 ms':>8}  {'bf16 ms':>8}  bf16/fp32")
    for d in (int(w) for w in a.widths.split(",")):
        f32 = block_ms(d, torch.float32, a.repeats)
        b16 = block_ms(d, torch.bfloat16, a.repeats)
        print(f"{d:>5}  {f32:8.2f}  {b16:8.2f}  {b16 / f32:9.2f}")


if __name__ == "__main__":
    main()
