"""Generation speed: lamina vs Hugging Face `GPT2LMHeadModel.generate`, side by side.

    .venv/bin/python bench/generate.py [--quick] [--shapes char-cpu gpt2-small] [--rounds 3]

Greedy decoding from a 16-token prompt, 256 new tokens (random weights, cache on; Hugging Face
with `min_new_tokens = max_new_tokens` so it cannot stop early), at batch 1 and batch 8.
Rounds interleave every variant, and the median of each is reported with its ratio to
Hugging Face fp32 at the same batch size, so a machine shared with other work still gives fair
ratios. Tokens/s counts new tokens (rows x steps) over the whole call, prefill included.

The `char-cpu` shape has block_size 64, so lamina's 272 tokens cross it and its window rule
re-prefills a few times (counted); Hugging Face gets n_positions 272 (it has no window rule).
The quantized variants (`--quant int8 int4`, weight-only, see lamina/quant.py) load the fp32
model's weights and quantize them; their tokens may differ from fp32 (random weights give flat
logits), so only their speed is compared here (their quality is tested in tests/test_quant.py).
Before timing, the compiled variant is checked to give the same greedy tokens as the eager one.
OpenMP threads wait passively (set before torch loads): spinning threads on two shared cores
made multi-threaded steps many times slower whenever another process was busy.
"""

from __future__ import annotations

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

from lamina import GPT, GPTConfig  # noqa: E402
from lamina.cpu import native_bf16  # noqa: E402
from lamina.generation import generate  # noqa: E402
from lamina.quant import quantize  # noqa: E402

SHAPES = {
    "char-cpu": GPTConfig.preset("char-cpu"),
    "gpt2-small": GPTConfig.preset("gpt2-small", dropout=0.0),
}


def hf_model(config: GPTConfig, n_positions: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    hf_config = GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=n_positions,
        n_embd=config.d_model,
        n_layer=config.n_layers,
        n_head=config.n_heads,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(hf_config).to(dtype).eval()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_shape(
    name: str, batch: int, new: int, rounds: int, compile_: bool, quant_schemes: list[str]
) -> list[str]:
    config = SHAPES[name]
    torch.manual_seed(0)
    prompt = torch.randint(0, config.vocab_size, (batch, 16))
    model32 = GPT(config).eval()
    model16 = GPT(config).eval().to(torch.bfloat16)
    model16.load_state_dict(model32.state_dict())
    n_pos = max(config.block_size, 16 + new)
    hf32 = hf_model(config, n_pos, torch.float32)

    def hf_run() -> None:
        with torch.inference_mode():
            hf32.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                use_cache=True,
            )

    variants: dict[str, Callable[[], object]] = {"hf fp32": hf_run}
    variants["lamina fp32"] = lambda: generate(model32, prompt, new)
    variants["lamina bf16"] = lambda: generate(model16, prompt, new)
    quantized = {}
    for scheme in quant_schemes:
        q = GPT(config).eval()
        q.load_state_dict(model32.state_dict())
        quantized[scheme] = quantize(q, scheme, group_size=128)
        variants[f"lamina {scheme}"] = lambda q=quantized[scheme]: generate(q, prompt, new)
    if compile_:
        variants["lamina fp32 compiled"] = lambda: generate(model32, prompt, new, compile=True)
        variants["lamina bf16 compiled"] = lambda: generate(model16, prompt, new, compile=True)
        ref = generate(model32, prompt, new)
        if not torch.equal(generate(model32, prompt, new, compile=True), ref):
            raise SystemExit(f"{name}: compiled fp32 tokens differ from eager")
        for scheme, q in quantized.items():
            variants[f"lamina {scheme} compiled"] = lambda q=q: generate(
                q, prompt, new, compile=True
            )
    for fn in variants.values():  # warm up (and compile)
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            times[key].append(timed(fn))
    base = batch * new / statistics.median(times["hf fp32"])
    lines = []
    for key, ts in times.items():
        rate = batch * new / statistics.median(ts)
        lines.append(f"| {name} | {batch} | {key} | {rate:,.1f} | {rate / base:.2f}x |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="32 new tokens, 1 round, no compile")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument(
        "--quant", nargs="*", default=["int8", "int4"], help="quantized variants (default: both)"
    )
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    new, rounds = (32, 1) if args.quick else (args.new_tokens, args.rounds)
    compile_ = not (args.quick or args.no_compile)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {new} new tokens, "
        f"median of {rounds}; cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"native bf16 {native_bf16()}"
    )
    print("| shape | batch | variant | tokens/s | vs HF fp32 |")
    print("|---|---|---|---|---|")
    for name in args.shapes:
        for batch in args.batches:
            for line in bench_shape(name, batch, new, rounds, compile_, args.quant):
                print(line, flush=True)


if __name__ == "__main__":
    main()
