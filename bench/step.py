"""The training step, option by option: lamina's step with each lever against nanoGPT's and HF's.

    python bench/step.py [--shapes A] [--steps N] [--rounds R] [--only a,b] [--no-compile]
    python bench/step.py --processes P [--only a,b] ...   each variant in processes of its own

Shape A (nanoGPT's CPU char recipe): 4 layers, 4 heads, 128 wide, block 64, batch 12, vocab 65.
Shape B (GPT-2-small-like): 6 layers, 6 heads, 384 wide, block 256, batch 64 (--batch-b to
shrink it on a slow machine), vocab 65. Dropout 0 everywhere (nanoGPT's CPU recipe).

A step is forward + loss + backward + clip(1.0) + optimizer step + zero_grad. Variants:
  nanogpt        a re-implementation of nanoGPT's model.py (pre-LN, c_attn, SDPA is_causal,
                 exact GELU, tied head, bias=False as in its CPU recipe) and its optimizer
                 config (AdamW betas (0.9, 0.99), decay on >= 2-D, fused only on CUDA, so
                 torch's foreach AdamW on a CPU)
  hf             transformers GPT2LMHeadModel, sdpa, fp32, lamina's optimizer builder
  lamina         lamina's GPT as nanoGPT's network (no biases, exact GELU: activation
                 "gelu_exact") with what `lamina train` adds: fused AdamW and --dtype auto
                 (bf16 autocast where bf16 is native, with fused attention in fp32 while
                 training: lamina.cpu.upcast_attention)
  +fp32          lamina without autocast (the same as lamina where --dtype auto picks fp32)
  +gelu-tanh     lamina with its default activation, GELU's tanh form (GPT-2's)
  +foreach       lamina with torch's foreach AdamW (to isolate the fused kernel)
  +muon          lamina with MuonAdamW (Newton-Schulz in bf16 where bf16 is native)
  +bf16          lamina under bf16 autocast (only where lamina.cpu.native_bf16())
  +bf16-attn     lamina under bf16 autocast with attention in bf16 too (what upcast_attention
                 avoids)
  +math-attn     lamina with SDPA forced to its math backend (what the default's pick beats)
  +sdpa-attn     lamina with its training attention in torch's SDPA (fp32 flash kernels, the
                 step before lamina.native.train_attention; what the default's native beats)
  +chunked-ce    lamina with training.chunked_ce (the head in chunks of 256 rows)
  +compile       lamina's model under torch.compile plus a compiled optimizer step; its first
                 call (compilation; inductor caches it on disk for the next process) is timed
                 and reported apart (+compile-bf16: under bf16 autocast, so the casts fuse;
                 +compile-max: mode "max-autotune-no-cudagraphs", inductor's own CPU GEMMs)
Every variant gets the same batches; a round runs `--steps` steps of each variant in turn and
the variants' order rotates per round, so load from other processes hits all alike; the
reported time is the median over all timed steps. tok/s ratios are over nanogpt's.

In one process the variants share its caches, allocator and thread pool, and the ratio moves with
what else the process ran. `--processes P` runs each variant alone instead: P rounds, each
starting one process per variant in rotating order (the same --steps x --rounds inside), and
reports per variant the median of the processes' medians, their spread, and the ratio of
medians to nanogpt's with the range of the ratios of processes run side by side in a round.
"""

from __future__ import annotations

import argparse  # noqa: E402
import contextlib
import math  # noqa: E402
import os
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import cpu_line  # noqa: E402
from torch import nn  # noqa: E402

import lamina.attention  # noqa: E402
import lamina.native.train_attention  # noqa: E402
from lamina import GPT, GPTConfig  # noqa: E402
from lamina.cpu import native_bf16  # noqa: E402
from lamina.training.chunked_ce import lm_loss_chunked  # noqa: E402
from lamina.training.device import use_bf16  # noqa: E402
from lamina.training.optim import build_optimizer  # noqa: E402

SHAPES = {
    "A": dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch=12),
    "B": dict(n_layers=6, n_heads=6, d_model=384, block_size=256, batch=64),
}
VOCAB = 65


# --- nanoGPT's model.py, re-written small (the same modules and maths) -----------------------
class NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
        self.gelu = nn.GELU()

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, s: dict) -> None:
        super().__init__()
        d = s["d_model"]
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(s["block_size"], d)
        self.h = nn.ModuleList(NanoBlock(d, s["n_heads"]) for _ in range(s["n_layers"]))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("c_proj.weight") or n.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * s["n_layers"]))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nanogpt_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))  # fused only on CUDA


# --- the variants ----------------------------------------------------------------------------
Step = Callable[[torch.Tensor, torch.Tensor], float]


def stepper(model: nn.Module, loss_of: Callable, opt: torch.optim.Optimizer, ctx=nullcontext):
    opt_step = opt.step

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        with ctx():
            loss = loss_of(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, opt


def lamina_model(s: dict, activation: str = "gelu_exact") -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=s["block_size"], d_model=s["d_model"],
                    n_heads=s["n_heads"], n_layers=s["n_layers"], dropout=0.0, bias=False,
                    qkv_bias=False, activation=activation)  # fmt: skip
    return GPT(cfg).train()


def full_loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = m(x)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


def bf16_autocast() -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16)


@contextlib.contextmanager
def bf16_attention() -> Iterator[None]:
    """bf16 autocast with the attention left in bf16 (the forward decides; restored after)."""
    old = lamina.attention.upcast_attention
    lamina.attention.upcast_attention = lambda q: False
    try:
        with bf16_autocast():
            yield
    finally:
        lamina.attention.upcast_attention = old


@contextlib.contextmanager
def sdpa_training_attention(amp: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """amp with lamina.native's training attention off (SDPA runs; restored after)."""
    ta = lamina.native.train_attention
    old = ta.packed_causal_attention, ta.causal_attention
    ta.packed_causal_attention = ta.causal_attention = lambda *a, **k: None
    try:
        with amp():
            yield
    finally:
        ta.packed_causal_attention, ta.causal_attention = old


def build(name: str, s: dict) -> Step:
    auto_bf16 = use_bf16("auto", torch.device("cpu"), s["d_model"])
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if auto_bf16 else nullcontext
    if name == "nanogpt":
        torch.manual_seed(0)
        m = NanoGPT(s).train()
        return stepper(m, lambda m, x, y: m(x, y), nanogpt_optimizer(m))[0]
    if name == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=VOCAB, n_positions=s["block_size"], n_embd=s["d_model"],
                         n_layer=s["n_layers"], n_head=s["n_heads"], resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)  # fmt: skip
        cfg._attn_implementation = "sdpa"
        m = GPT2LMHeadModel(cfg).train()
        loss = lambda m, x, y: full_loss(lambda i: m(input_ids=i).logits, x, y)  # noqa: E731
        return stepper(m, loss, build_optimizer(m, lr=1e-3))[0]
    m = lamina_model(s, "gelu" if name == "+gelu-tanh" else "gelu_exact")
    if name in ("lamina", "+gelu-tanh"):
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3), amp)[0]
    if name == "+fp32":
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3))[0]
    if name == "+foreach":
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3, fused=False), amp)[0]
    if name == "+muon":
        opt = build_optimizer(m, lr=1e-2, optimizer="muon",
                              ns_dtype="bf16" if native_bf16() else "fp32")  # fmt: skip
        return stepper(m, full_loss, opt, amp)[0]
    if name in ("+bf16", "+bf16-attn"):
        bf16 = bf16_attention if name == "+bf16-attn" else bf16_autocast
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3), bf16)[0]
    if name == "+math-attn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        math_only = lambda: sdpa_kernel(SDPBackend.MATH)  # noqa: E731
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3), math_only)[0]
    if name == "+sdpa-attn":
        ctx = lambda: sdpa_training_attention(amp)  # noqa: E731
        return stepper(m, full_loss, build_optimizer(m, lr=1e-3), ctx)[0]
    if name == "+chunked-ce":
        loss = lambda m, x, y: lm_loss_chunked(m, x, y, chunk=256)  # noqa: E731
        return stepper(m, loss, build_optimizer(m, lr=1e-3), amp)[0]
    if name.startswith("+compile"):
        mode = "max-autotune-no-cudagraphs" if name == "+compile-max" else None
        ctx = (
            (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
            if name == "+compile-bf16"
            else amp
        )
        cm = torch.compile(m, mode=mode)
        step, opt = stepper(cm, full_loss, build_optimizer(m, lr=1e-3), ctx)
        opt.step = torch.compile(opt.step)  # the optimizer step, compiled too
        return step
    raise SystemExit(f"unknown variant {name!r}")


def variants(compile_: bool) -> list[str]:
    out = ["nanogpt", "hf", "lamina", "+fp32", "+gelu-tanh", "+foreach", "+muon"]
    if native_bf16():
        out.append("+bf16-attn")
    out += ["+math-attn", "+sdpa-attn", "+chunked-ce"]
    return out + (["+compile"] if compile_ else [])


def bench_shape(name: str, s: dict, names: list[str], steps: int, rounds: int) -> None:
    x, y = batches(s)
    fns, first = {}, {}
    for v in names:
        fns[v] = build(v, s)
        t0 = time.perf_counter()
        fns[v](x, y)  # warm-up; for +compile, the compilation
        first[v] = time.perf_counter() - t0
        fns[v](x, y)
    times: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for v in order:
            for _ in range(steps):
                t0 = time.perf_counter()
                fns[v](x, y)
                times[v].append(time.perf_counter() - t0)
    tokens = s["batch"] * s["block_size"]
    base = statistics.median(times["nanogpt"]) if "nanogpt" in times else None
    print(f"\nshape {name}: {s}, {rounds} rounds x {steps} steps, load {os.getloadavg()[0]:.1f}")
    print("| variant | ms/step (median) | tok/s | vs nanoGPT | first call s |")
    print("|---|---:|---:|---:|---:|")
    for v in names:
        med = statistics.median(times[v])
        ratio = f"{base / med:.2f}x" if base else "-"
        print(f"| {v} | {med * 1000:.1f} | {tokens / med:,.0f} | {ratio} | {first[v]:.2f} |")


def batches(s: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (s["batch"], s["block_size"]), generator=g)
    return x, torch.randint(0, VOCAB, (s["batch"], s["block_size"]), generator=g)


def profile_variant(name: str, shape: str, s: dict) -> None:
    from torch.profiler import ProfilerActivity, profile

    x, y = batches(s)
    fn = build(name, s)
    for _ in range(5):
        fn(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            fn(x, y)
    print(f"\n{name} at shape {shape}, 10 steps:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def in_processes(shape: str, names: list[str], args: argparse.Namespace) -> None:
    """Each variant in a process of its own, `args.processes` rounds in rotating order."""
    ms: dict[str, list[float]] = {v: [] for v in names}
    for r in range(args.processes):
        for v in names[r % len(names) :] + names[: r % len(names)]:
            cmd = [sys.executable, __file__, "--shapes", shape, "--only", v, "--steps",
                   str(args.steps), "--rounds", str(args.rounds), "--batch-b", str(args.batch_b)]  # fmt: skip
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            row = re.search(rf"^\| {re.escape(v)} \| ([0-9.]+) \|", out, re.MULTILINE)
            if row is None:
                raise SystemExit(f"no timing for {v} in:\n{out}")
            ms[v].append(float(row.group(1)))
    tokens = SHAPES[shape]["batch"] * SHAPES[shape]["block_size"]
    if shape == "B":
        tokens = args.batch_b * SHAPES[shape]["block_size"]
    base = ms.get("nanogpt")
    print(f"\nshape {shape}: each variant in its own process, {args.processes} rounds of "
          f"{args.rounds} x {args.steps} steps, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| variant | ms/step (median of processes) | each process | tok/s | vs nanoGPT "
          "(ratio of medians) | side by side, per round |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|")
    for v in names:
        med = statistics.median(ms[v])
        each = " / ".join(f"{t:.1f}" for t in ms[v])
        ratio = pairs = "-"
        if base:
            ratio = f"{statistics.median(base) / med:.2f}x"
            per = sorted(b / t for b, t in zip(base, ms[v], strict=True))
            pairs = f"{per[0]:.2f}-{per[-1]:.2f}x"
        print(f"| {v} | {med:.1f} | {each} | {tokens / med * 1000:,.0f} | {ratio} | {pairs} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="A")
    p.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--only", help="comma-separated variants (default: all)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--batch-b", type=int, default=64, help="shape B's batch")
    p.add_argument("--threads", type=int)
    p.add_argument("--profile", metavar="VARIANT", help="profile VARIANT's ops (first shape)")
    p.add_argument("--processes", type=int, metavar="P",
                   help="run each variant in processes of its own, P rounds (see the module)")  # fmt: skip
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"native bf16: {native_bf16()}")  # fmt: skip
    names = args.only.split(",") if args.only else variants(not args.no_compile)
    for shape in args.shapes.split(","):
        s = dict(SHAPES[shape])
        if shape == "B":
            s["batch"] = args.batch_b
        if args.profile:
            return profile_variant(args.profile, shape, s)
        if args.processes:
            in_processes(shape, names, args)
            continue
        bench_shape(shape, s, names, args.steps, args.rounds)


if __name__ == "__main__":
    main()
