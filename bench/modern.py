"""Training-step throughput of the modern layers: llama-tiny vs char-cpu at equal width.

    python bench/modern.py [--steps N] [--warmup N] [--batch N] [--bf16] [--threads N] [--no-hf]

Both presets are 4 layers, 4 heads, 128 wide, block 64, vocab 65: char-cpu is GPT-2's layout
(learned positions, LayerNorm, GELU 4d, biases, tied head); llama-tiny is RoPE, RMSNorm, SwiGLU
(d_ff 352, so about the same feed-forward size), 2 key/value heads, no biases, untied head.
Optionally (with transformers installed) Hugging Face's LlamaForCausalLM at llama-tiny's shape
runs too, as a yardstick for the lamina Llama.

A step is forward + backward + clip + AdamW step on random tokens, loss in fp32. The models
alternate step by step, so machine noise hits all alike; the median step time is reported as
tokens/s, with ratios against char-cpu. fp32 unless --bf16 (autocast). The training code's own
helpers are not used, so the bench measures the layers alone.

Every engine runs under its own default OpenMP settings (no OMP_* variable is set here).
"""

from __future__ import annotations

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lamina import GPT, GPTConfig  # noqa: E402


def hf_llama(config: GPTConfig) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from lamina.interop import hf_config

    fields = hf_config(config)
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "model_type", "dtype")}
    cfg = LlamaConfig(**fields, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def make_step(
    model: torch.nn.Module, logits_of: Callable, device: torch.device, bf16: bool
) -> Callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = logits_of(model, x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default fp32)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face's LlamaForCausalLM")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    configs = {
        "char-cpu": GPTConfig.preset("char-cpu"),
        "llama-tiny": GPTConfig.preset("llama-tiny"),
    }
    runs: dict[str, tuple[torch.nn.Module, Callable]] = {}
    for name, cfg in configs.items():
        model = GPT(cfg).to(device).train()
        runs[name] = (model, make_step(model, lambda m, x: m(x), device, args.bf16))
    if not args.no_hf:
        try:
            model = hf_llama(configs["llama-tiny"]).to(device).train()
            runs["HF Llama (llama-tiny shape)"] = (
                model,
                make_step(model, lambda m, x: m(input_ids=x).logits, device, args.bf16),
            )
        except ImportError:
            print("transformers is not installed: HF Llama skipped")
    block, vocab = configs["char-cpu"].block_size, configs["char-cpu"].vocab_size
    tokens = args.batch * block
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(args.warmup + args.steps):
        x = torch.randint(0, vocab, (args.batch, block + 1), device=device)
        for name, (_, step) in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(x[:, :-1], x[:, 1:])
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    print(
        f"device {device}, {'bf16 autocast' if args.bf16 else 'fp32'}, batch {args.batch} x "
        f"block {block} = {tokens} tokens/step, {torch.get_num_threads()} threads, "
        f"median of {args.steps} steps"
    )
    base = tokens / statistics.median(times["char-cpu"])
    print(f"{'model':<30}{'parameters':>12}{'ms/step':>10}{'tokens/s':>12}{'vs char-cpu':>13}")
    for name, (model, _) in runs.items():
        med = statistics.median(times[name])
        n = sum(p.numel() for p in model.parameters())
        rate = tokens / med
        print(f"{name:<30}{n:>12,}{med * 1e3:>10.2f}{rate:>12,.0f}{rate / base:>12.2f}x")


if __name__ == "__main__":
    main()
