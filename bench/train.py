"""Training-step throughput: lamina vs Hugging Face GPT2LMHeadModel at the same shapes.

    python bench/train.py [--quick] [--shapes A,B] [--steps N] [--compile] [--threads N]

Shape A: 4 layers, 4 heads, 128 wide, block 64, batch 12, vocab 65, dropout 0.
Shape B: 6 layers, 6 heads, 384 wide, block 256, batch 64, vocab 65, dropout 0.2.

Both models get random weights, the same batches, the same loss (mean cross-entropy over every
position, computed from logits in fp32) and the same optimizer (torch AdamW, fused, weight
decay on matrices); a step is forward + backward + clip + optimizer step. Each side runs its
warm-up steps, then the timed steps, alternating lamina and HF per step, so machine noise hits
both alike; the median step time is reported. lamina runs as `lamina train` would (its
`--dtype auto` choice, `--compile` if asked); HF runs in fp32 with attn_implementation "sdpa"
(its fastest CPU path). The ratio is tokens/s of lamina over HF.

Every engine runs under its own default OpenMP settings (no OMP_* variable is set here).
"""

from __future__ import annotations

import argparse  # noqa: E402
import os
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lamina import GPT, GPTConfig  # noqa: E402
from lamina.training.device import use_bf16  # noqa: E402
from lamina.training.loop import autocast, maybe_compile  # noqa: E402
from lamina.training.optim import build_optimizer  # noqa: E402

SHAPES = {
    "A": dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch=12, dropout=0.0),
    "B": dict(n_layers=6, n_heads=6, d_model=384, block_size=256, batch=64, dropout=0.2),
}


def hf_model(s: dict, vocab: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab, n_positions=s["block_size"], n_embd=s["d_model"], n_layer=s["n_layers"],
        n_head=s["n_heads"], resid_pdrop=s["dropout"], embd_pdrop=s["dropout"],
        attn_pdrop=s["dropout"], activation_function="gelu_new", use_cache=False,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(cfg)
    return model


def make_step(model, logits_of, bf16: bool):
    opt = build_optimizer(model, lr=1e-4, weight_decay=0.1)
    dev = torch.device("cpu")

    def step(x, y):
        with autocast(dev, bf16):
            logits = logits_of(model, x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def bench_shape(
    name: str, steps: int, warmup: int, compile_: bool, attn_dropout: float | None = None
) -> dict:
    s = SHAPES[name]
    vocab = 65
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, block_size=s["block_size"], d_model=s["d_model"],
                    n_heads=s["n_heads"], n_layers=s["n_layers"], dropout=s["dropout"])  # fmt: skip
    lam = GPT(cfg).train()
    if attn_dropout is not None:
        for block in lam.blocks:
            block.attn.dropout = attn_dropout
    bf16 = use_bf16("auto", torch.device("cpu"), s["d_model"])
    lam_fwd = maybe_compile(lam, compile_, print)
    hf = hf_model(s, vocab).train()
    steps_fn = {
        "lamina": make_step(lam_fwd, lambda m, x: m(x), bf16),
        "hf": make_step(hf, lambda m, x: m(input_ids=x).logits, False),
    }
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randint(0, vocab, (s["batch"], s["block_size"]), generator=g),) * 2
        for _ in range(warmup + steps)
    ]
    times: dict[str, list[float]] = {"lamina": [], "hf": []}
    for i, (x, y) in enumerate(batches):
        for who, fn in steps_fn.items():
            t0 = time.perf_counter()
            fn(x, y)
            if i >= warmup:
                times[who].append(time.perf_counter() - t0)
    tokens = s["batch"] * s["block_size"]
    out = {"shape": name, "bf16": bf16, "compile": compile_, "tokens_per_step": tokens}
    for who, ts in times.items():
        med = statistics.median(ts)
        out[who] = {"step_ms": med * 1000, "tok_per_s": tokens / med}
    out["ratio"] = out["lamina"]["tok_per_s"] / out["hf"]["tok_per_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (A: 10, B: 2)")
    p.add_argument("--shapes", default="A,B", help="comma-separated shapes (default: A,B)")
    p.add_argument("--steps", type=int, help="timed steps per side (default: A 30, B 4)")
    p.add_argument("--compile", action="store_true", help="torch.compile lamina's model")
    p.add_argument("--attn-dropout", type=float, help="override lamina's attention dropout")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name in args.shapes.split(","):
        steps = args.steps or ({"A": 10, "B": 2} if args.quick else {"A": 30, "B": 4})[name]
        warm = 3 if name == "A" else 1
        r = bench_shape(name, steps, warm, args.compile, args.attn_dropout)
        print(
            f"shape {name}: lamina {r['lamina']['step_ms']:8.1f} ms/step "
            f"{r['lamina']['tok_per_s']:9,.0f} tok/s ({'bf16' if r['bf16'] else 'fp32'}"
            f"{', compiled' if r['compile'] else ''}) | HF sdpa fp32 {r['hf']['step_ms']:8.1f} ms/step "
            f"{r['hf']['tok_per_s']:9,.0f} tok/s | lamina/HF {r['ratio']:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
