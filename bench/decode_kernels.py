"""Probe: time per token of batch-1 decoding's linear layers under each kernel on this CPU.

    python bench/decode_kernels.py [--rounds 3] [--threads 2] [--only NAME,NAME]

Shapes are SmolLM2-135M's (d 576, fused qkv 960 rows, MLP 2 x 1536 gated, 30 layers; a tied
49,152 x 576 head), with random weights, one distinct weight per layer so that the weights stream
from memory as in a real model. Each variant runs all 30 layers' linears (the "blocks" column)
and the head separately; rounds alternate the variants, so a shared CPU's noise lands on all of
them alike, and the best round is reported. Prints the CPU flags that choose kernels.
OpenMP threads wait passively (set before torch loads), as in bench/generate.py: spinning
threads on shared cores make every small multi-threaded kernel many times slower.
"""

from __future__ import annotations

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import cpu_flags  # noqa: E402
from torch import nn  # noqa: E402

warnings.filterwarnings("ignore")

D, FF, V, L, QKV = 576, 1536, 49152, 30, 960
SHAPES = [(QKV, D), (D, D), (2 * FF, D), (D, FF)]


def bench(fn: Callable[[], object], seconds: float = 0.6) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def q8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = (w.abs().amax(1) / 127).clamp(min=1e-12)
    return (w / s[:, None]).round().clamp(-127, 127).to(torch.int8), s


def q4_groups(w: torch.Tensor, gs: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) -> (int4 packed for the CPU kernel, scales_and_zeros (K//gs, N, 2) fp32)."""
    n, k = w.shape
    g = w.reshape(n, k // gs, gs)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo) / s).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    sz = torch.stack([s.reshape(n, -1), (lo + 8 * s).reshape(n, -1)], -1).transpose(0, 1)
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), sz.contiguous()


def build(only: set[str] | None) -> dict[str, tuple[Callable, Callable]]:
    torch.manual_seed(0)
    ws = [torch.randn(n, k) * 0.02 for _ in range(L) for n, k in SHAPES]
    head = torch.randn(V, D) * 0.02
    xs = {k: torch.randn(1, k) for k in (D, FF)}
    xb = {k: v.bfloat16() for k, v in xs.items()}
    out: dict[str, tuple[Callable, Callable]] = {}

    def want(name: str) -> bool:
        return only is None or any(o in name for o in only)

    def add(name: str, make: Callable[[], tuple[Callable, Callable]]) -> None:
        if want(name):
            try:
                out[name] = make()
            except Exception as e:  # a kernel this build or CPU lacks
                print(f"  {name}: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:90]})")

    def fp32():
        return (lambda: [F.linear(xs[w.shape[1]], w) for w in ws], lambda: F.linear(xs[D], head))

    def int8_fp32():
        q = [q8_rows(w) for w in ws]
        qh = q8_rows(head)
        return (
            lambda: [torch._weight_int8pack_mm(xs[a.shape[1]], a, s) for a, s in q],
            lambda: torch._weight_int8pack_mm(xs[D], *qh),
        )

    def int8_bf16():
        q = [(a, s.bfloat16()) for a, s in map(q8_rows, ws)]
        qh = q8_rows(head)
        qh = (qh[0], qh[1].bfloat16())
        return (
            lambda: [torch._weight_int8pack_mm(xb[a.shape[1]], a, s) for a, s in q],
            lambda: torch._weight_int8pack_mm(xb[D], *qh),
        )

    def int4_fp32():
        q = [(w.shape[1], *q4_groups(w)) for w in ws]
        qh = q4_groups(head)
        return (
            lambda: [torch._weight_int4pack_mm_for_cpu(xs[k], p, 32, sz) for k, p, sz in q],
            lambda: torch._weight_int4pack_mm_for_cpu(xs[D], qh[0], 32, qh[1]),
        )

    def int4_bf16():
        q = [(w.shape[1], p, sz.bfloat16()) for w in ws for p, sz in [q4_groups(w)]]
        qh = q4_groups(head)
        qh = (qh[0], qh[1].bfloat16())
        return (
            lambda: [torch._weight_int4pack_mm_for_cpu(xb[k], p, 32, sz) for k, p, sz in q],
            lambda: torch._weight_int4pack_mm_for_cpu(xb[D], qh[0], 32, qh[1]),
        )

    def dynamic(engine: str):
        def make():
            torch.backends.quantized.engine = engine
            lins = []
            for w in [*ws, head]:
                lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
                lin.weight.data = w
                lins.append(lin)
            mods = torch.ao.quantization.quantize_dynamic(
                nn.ModuleList(lins), {nn.Linear}, dtype=torch.qint8
            )
            blocks, hd = list(mods)[:-1], list(mods)[-1]
            return (
                lambda: [m(xs[m.in_features]) for m in blocks],
                lambda: hd(xs[D]),
            )

        return make

    def dequant_per_call():  # what lamina does on AVX2 today
        q = [q8_rows(w) for w in ws]
        qh = q8_rows(head)
        return (
            lambda: [xs[a.shape[1]] @ (a.float() * s[:, None]).T for a, s in q],
            lambda: xs[D] @ (qh[0].float() * qh[1][:, None]).T,
        )

    def compiled_woq(freezing: bool):
        def make():
            import torch._inductor.config as cfg

            cfg.freezing = freezing

            class Woq(nn.Module):
                def __init__(self, w):
                    super().__init__()
                    q, s = q8_rows(w)
                    self.register_buffer("q", q)
                    self.register_buffer("s", s)

                def forward(self, x):
                    return F.linear(x, self.q.to(x.dtype)) * self.s

            class Stack(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.m = nn.ModuleList(Woq(w) for w in ws)

                def forward(self, a, b):
                    return [m(a if m.q.shape[1] == D else b) for m in self.m]

            st, hd = Stack().eval(), Woq(head).eval()
            with torch.no_grad():
                cs = torch.compile(st, dynamic=False)
                ch = torch.compile(hd, dynamic=False)
                cs(xs[D], xs[FF]), ch(xs[D])
            return (lambda: cs(xs[D], xs[FF]), lambda: ch(xs[D]))

        return make

    def torchao_int8():
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        lins = nn.ModuleList(nn.Linear(w.shape[1], w.shape[0], bias=False) for w in [*ws, head])
        for lin, w in zip(lins, [*ws, head], strict=True):
            lin.weight.data = w
        quantize_(lins, Int8WeightOnlyConfig())
        blocks, hd = list(lins)[:-1], list(lins)[-1]
        return (lambda: [m(xs[m.in_features]) for m in blocks], lambda: hd(xs[D]))

    def torchao_da8w8():
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        lins = nn.ModuleList(nn.Linear(w.shape[1], w.shape[0], bias=False) for w in [*ws, head])
        for lin, w in zip(lins, [*ws, head], strict=True):
            lin.weight.data = w
        quantize_(lins, Int8DynamicActivationInt8WeightConfig())
        blocks, hd = list(lins)[:-1], list(lins)[-1]
        return (lambda: [m(xs[m.in_features]) for m in blocks], lambda: hd(xs[D]))

    def native(kind: str):  # lamina.native's AVX2 kernels (int16 inputs per 32), lamina's layouts
        def make():
            from lamina.native import available, reason
            from lamina.native.step import linear
            from lamina.quant import Int4Linear, Int8Linear

            if not available():
                raise RuntimeError(reason())

            def module(w: torch.Tensor) -> nn.Module:
                lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
                lin.weight.data = w
                if kind == "int4":
                    return Int4Linear.from_linear(lin, 32)
                m = Int8Linear.from_linear(lin)
                if kind == "int8-g32":  # GGUF's Q8_0 layout: a scale per 32 inputs
                    n, k = w.shape
                    m = Int8Linear(k, n, False, group_size=32)
                    q, sc = q8_rows(w.reshape(-1, 32))
                    m.qweight, m.scale = q.reshape(n, k), sc.reshape(n, k // 32)
                return m.prepare()

            mods = [module(w) for w in ws]
            hd = module(head)
            return (lambda: [linear(m, xs[m.in_features]) for m in mods], lambda: linear(hd, xs[D]))

        return make

    add("fp32 F.linear", fp32)
    add("native int4 g32 (lamina.native)", native("int4"))
    add("native int8 per row (lamina.native)", native("int8"))
    add("native int8 g32 = Q8_0 (lamina.native)", native("int8-g32"))
    add("int8 dequantized per call (lamina AVX2 today)", dequant_per_call)
    add("int8 _weight_int8pack_mm, fp32 act", int8_fp32)
    add("int8 _weight_int8pack_mm, bf16 act", int8_bf16)
    add("int4 g32 _weight_int4pack_mm_for_cpu, fp32 act", int4_fp32)
    add("int4 g32 _weight_int4pack_mm_for_cpu, bf16 act", int4_bf16)
    add("dynamic int8 act (fbgemm)", dynamic("fbgemm"))
    add("dynamic int8 act (onednn)", dynamic("onednn"))
    add("dynamic int8 act (x86)", dynamic("x86"))
    add("compiled int8 dequant+mm (inductor)", compiled_woq(False))
    add("compiled int8 dequant+mm (inductor, freezing)", compiled_woq(True))
    add("torchao int8 weight-only", torchao_int8)
    add("torchao int8 dyn act + int8 weight", torchao_da8w8)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated substrings of variant names")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(
        f"torch {torch.__version__}, {a.threads} threads, capability "
        f"{torch.backends.cpu.get_cpu_capability()}; cpu flags: {cpu_flags()}"
    )
    variants = build(set(a.only.split(",")) if a.only else None)
    best: dict[str, list[float]] = {k: [1e9, 1e9] for k in variants}
    with torch.no_grad():
        for _ in range(a.rounds):
            for name, (blocks, head) in variants.items():
                best[name][0] = min(best[name][0], bench(blocks))
                best[name][1] = min(best[name][1], bench(head))
    print(
        f"{'variant':52s} {'blocks ms':>9s} {'head ms':>8s} {'head %':>6s} {'ceiling tok/s':>13s}"
    )
    for name, (b, h) in best.items():
        print(
            f"{name:52s} {b * 1e3:9.2f} {h * 1e3:8.2f} {100 * h / (b + h):6.0f} {1 / (b + h):13.0f}"
        )


if __name__ == "__main__":
    main()
