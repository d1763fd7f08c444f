"""A prompt's causal attention: lamina.native's kernel against torch's SDPA, and a whole prefill.

    .venv/bin/python bench/prefill_attention.py [--threads 1,2] [--shape 9,3,512,64] [--calls 20]
        [--prefill FILE.gguf] [--prompt 512] [--best 3]

The attention: one layer's q (B=1, H, T, hd) as a view of a fused projection's output and k, v
the first T positions of a longer cache (the layout a prefill hands it), causal; the median of
--calls calls of torch's flash SDPA (`is_causal`, `enable_gqa`) and of
lamina.native.prefill.causal_attention, in each of its vector forms this CPU runs (AVX-512 /
AVX2: decode.c lm_patt_wide), their largest difference printed beside them.

The bf16 form (decode.c lm_prefill_attention_bf16: what a prompt's chunks take in the
runtime, lm_patt_bf16) is timed beside them where the CPU has AVX-512 BF16.

With --prefill, a whole prompt instead: `lamina.open(FILE).model` (the default path) and the
best of --best warm `lamina.generation.stream(model, ids, 1)` over --prompt random ids (ms).
Run it under two PYTHONPATHs (two trees) in turn for an A/B; it changes no environment.

With --runtime, the torch-free runtime's prefill (`Runtime.open(FILE, threads=T)`, `forget(0)`,
`generate(ids, 1)` over --prompt random ids) with the chunk attention in float and in bf16
(lm_patt_bf16 0 / 1) alternated in one process, --best rounds: best and median tok/s of each.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F


def timed(fn, calls: int) -> float:
    """Median ms of `calls` calls after one warm-up."""
    fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def attention(shape: tuple[int, int, int, int], threads: int, calls: int) -> None:
    from lamina.native.build import library
    from lamina.native.prefill import causal_attention

    H, Hkv, T, hd = shape
    torch.set_num_threads(threads)
    fused = torch.randn(1, T, (H + 2 * Hkv) * hd)
    q = fused[..., : H * hd].view(1, T, H, hd).transpose(1, 2)
    cache = torch.randn(2, 1, Hkv, T + 64, hd)
    k, v = cache[0, :, :, :T], cache[1, :, :, :T]
    scale = hd**-0.5

    def sdpa():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, T, H * hd)

    want = sdpa()
    line = f"threads {threads}, H {H} over {Hkv}, T {T}, hd {hd}: sdpa {timed(sdpa, calls):.2f} ms"
    lib = library()
    before = lib.lm_patt_wide(-1)
    try:
        for form, name in ((1, "avx512"), (0, "avx2")):
            if lib.lm_patt_wide(form) != form:
                continue
            diff = (causal_attention(q, k, v, scale) - want).abs().max().item()
            ms = timed(lambda: causal_attention(q, k, v, scale), calls)
            line += f", native {name} {ms:.2f} ms (max diff {diff:.1e})"
    finally:
        lib.lm_patt_wide(before)
    if lib.lm_patt_bf16(-1):
        out = torch.empty(1, T, H * hd)
        st = torch.tensor([*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]], dtype=torch.int64)

        def bf16():
            args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 1, H, Hkv, T, T, hd)
            lib.lm_prefill_attention_bf16(*args, scale, st.data_ptr(), threads)
            return out

        diff = (bf16() - want).abs().max().item()
        line += f", native bf16 {timed(bf16, calls):.2f} ms (max diff {diff:.1e})"
    print(line)


def runtime_ab(path: str, threads: int, prompt: int, rounds: int) -> None:
    from lamina.native.runtime import Runtime

    rt = Runtime.open(path, threads=threads)
    ids = random.Random(0).choices(range(1000, 40000), k=prompt)
    rates: dict[int, list[float]] = {0: [], 1: []}
    before = rt.lib.lm_patt_bf16(-1)
    try:
        for r in range(rounds):
            for form in (0, 1) if r % 2 == 0 else (1, 0):
                rt.lib.lm_patt_bf16(form)
                rt.forget(0)
                t0 = time.perf_counter()
                for _ in rt.generate(ids, 1):
                    pass
                rates[form].append(prompt / (time.perf_counter() - t0))
    finally:
        rt.lib.lm_patt_bf16(before)
    f, b = rates[0], rates[1]
    print(
        f"{path.rsplit('/', 1)[-1]}, threads {threads}, prompt {prompt}: float best {max(f):.0f} "
        f"median {statistics.median(f):.0f} | bf16 best {max(b):.0f} median "
        f"{statistics.median(b):.0f} tok/s | bf16/float best {max(b) / max(f):.3f} median "
        f"{statistics.median(b) / statistics.median(f):.3f}"
    )


def prefill(path: str, threads: int, prompt: int, best: int) -> None:
    import lamina
    from lamina.generation import stream

    torch.set_num_threads(threads)
    model = lamina.open(path).model
    ids = torch.tensor(random.Random(0).choices(range(100, 40000), k=prompt))

    def once():
        for _ in stream(model, ids, 1):
            pass

    once()
    ts = []
    for _ in range(best):
        t0 = time.perf_counter()
        once()
        ts.append((time.perf_counter() - t0) * 1e3)
    print(
        f"{path.rsplit('/', 1)[-1]}, threads {threads}: prefill ms {sorted(round(t, 1) for t in ts)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--shape", default="9,3,512,64", help="H,H_kv,T,hd (SmolLM2's at 512)")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per variant")
    ap.add_argument("--prefill", default=None, help="a GGUF file: time its whole prefill")
    ap.add_argument("--runtime", default=None, help="a GGUF file: the runtime's A/B (above)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt length for --prefill/--runtime")
    ap.add_argument("--best", type=int, default=3, help="timed prefills (best reported), rounds")
    a = ap.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    for t in (int(x) for x in a.threads.split(",")):
        if a.runtime:
            runtime_ab(a.runtime, t, a.prompt, a.best)
        elif a.prefill:
            prefill(a.prefill, t, a.prompt, a.best)
        else:
            attention(shape, t, a.calls)


if __name__ == "__main__":
    main()
