"""Every family's GGUF file, as lamina writes it, run by llama.cpp: top-1 agreement and the
largest logit difference against lamina on the same file.

    python bench/family_parity.py [--tokens 48] [--quant Q4_K_M]

For each family a tiny model with random weights is built by transformers (as the tests build
them: the reference is the family's own implementation), opened by lamina, written as an f32
GGUF file by `lamina.save_gguf`, and evaluated by llama.cpp (llama-cpp-python, fp32 KV cache)
over random token ids. Shapes keep to what llama.cpp assumes where GGUF stores nothing: Gemma's
query_pre_attn_scalar equal to head_dim (as in Gemma 2 2B/9B and Gemma 3 below 27B), Gemma 3's
five sliding layers per global one, Phi-3's original context (256) at least llama.cpp's
context (llama-cpp-python pads n_ctx to 256; llama.cpp chooses the long or short factors by
the context size, transformers and lamina by the sequence). A row with a second line shows
what llama.cpp computes instead: Mistral's window is not read from arch llama (llama.cpp equals
lamina without the window). With `--quant TYPE` each f32 file is also quantized by llama.cpp's
own quantizer (`llama_model_quantize`, its mixtures) at a shape whose rows divide into 256
(d_model 256, weights at 2 / sqrt(width)), and lamina reading that file, kept quantized and
dequantized, is compared with llama.cpp running it. lamina computes on the blocks' exact values
(the two lamina rows agree); llama.cpp rounds the activations to 8 bits for its K-quant dot
products, so there the logits differ by a few percent of their scale, as on SmolLM2's Q4_K_M
(bench/kquant_parity.py). Needs
`make bench-deps` (llama-cpp-python); a family llama.cpp refuses prints its refusal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lamina  # noqa: E402
from lamina.interop.gguf import load_gguf, save_gguf  # noqa: E402

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
# rows of 256 for the K-quants; Qwen3's and Gemma's heads wider than d / heads
QUANT_SHAPE = dict(hidden_size=256, intermediate_size=512, vocab_size=320)
LONGROPE = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                short_factor=[1.0, 1.2, 1.5, 2.0], long_factor=[1.5, 2.0, 4.0, 8.0])  # fmt: skip
FAMILIES = [
    ("llama 3 (llama3 scaling)", "LlamaConfig", "LlamaForCausalLM",
     dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                               low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=64))),
    ("qwen2.5", "Qwen2Config", "Qwen2ForCausalLM", {}),
    ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    ("mistral (window 16)", "MistralConfig", "MistralForCausalLM", dict(sliding_window=16),
     {"sliding_window": None}),
    ("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
     dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=16)),
    ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
     dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=16, num_hidden_layers=6)),
    ("phi3 (partial rotary, longrope)", "Phi3Config", "Phi3ForCausalLM",
     dict(original_max_position_embeddings=256, max_position_embeddings=512,
          rope_parameters=LONGROPE)),
]  # fmt: skip


def widened(extra: dict) -> dict:
    """`extra` at QUANT_SHAPE: longrope factors as many as its rotary pairs."""
    out = {**extra, **QUANT_SHAPE}
    rope = extra.get("rope_parameters", {})
    if rope.get("rope_type") == "longrope":
        pairs = int(QUANT_SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
                    * rope["partial_rotary_factor"]) // 2  # fmt: skip
        out["rope_parameters"] = dict(
            rope, short_factor=np.linspace(1.0, 2.0, pairs).tolist(),
            long_factor=np.linspace(1.5, 8.0, pairs).tolist(),
        )  # fmt: skip
    return out


def build(config_cls: str, model_cls: str, extra: dict, scale: float = 0.15) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_cls)(**{**SHAPE, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base, gain = (1.0, 0.2) if "norm" in name else (0.0, scale)
            if "norm" in name and config_cls.startswith("Gemma"):
                base = 0.0  # Gemma's gains are 1 + weight
            p.copy_(base + gain * torch.randn(p.shape, generator=gen))
    return model


class SpmVocabulary:
    """The tokenizer.ggml.* keys of a 320-token SentencePiece-style vocabulary (three specials,
    the 256 byte tokens, 61 pieces): llama.cpp's quantizer wants a vocabulary in the file."""

    def gguf_metadata(self) -> dict:
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        pieces = [f"\u2581{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(61)]
        return {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens + pieces,
            "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(61)],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * 61,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0,
        }


def quantize(source: Path, target: Path, ftype: str) -> None:
    """llama.cpp's quantizer (LLAMA_FTYPE_MOSTLY_<ftype>) from source to target."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params):
        raise RuntimeError(f"llama_model_quantize {ftype} failed")


def compare(name: str, path: Path, model: torch.nn.Module, ids: list[int]) -> np.ndarray | None:
    ours = model(torch.tensor([ids]))[0].numpy()
    try:
        theirs = llama_cpp_logits(path, ids, n_ctx=64)
    except Exception as e:  # llama.cpp's refusal is the result here
        print(f"{name:40s} llama.cpp refused the file: {str(e).splitlines()[0]}")
        return None
    top1 = (ours.argmax(-1) == theirs.argmax(-1)).mean()
    print(
        f"{name:40s} top-1 {top1:7.2%}   max |diff| {np.abs(ours - theirs).max():8.4f}   "
        f"logit scale {np.abs(ours).max():6.2f}   ({len(ids)} positions)"
    )
    return theirs


def llama_cpp_logits(path: Path, ids: list[int], n_ctx: int) -> np.ndarray:
    from llama_peer import llama  # llama.cpp under its defaults (an AMX build is refused)

    llm = llama(
        path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=os.cpu_count(),
        type_k=0, type_v=0,
    )  # fmt: skip
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--quant", default=None, help="also a llama.cpp quantization, e.g. Q4_K_M")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    import llama_cpp
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"llama-cpp-python {llama_cpp.__version__}, transformers {transformers.__version__}")
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, SHAPE["vocab_size"], args.tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        for name, config_cls, model_cls, extra, *instead in FAMILIES:
            d = Path(tmp) / name.split()[0]
            build(config_cls, model_cls, extra).save_pretrained(d)
            model = lamina.open(d).model
            path = save_gguf(model, d / "m.gguf")
            theirs = compare(f"{name} f32", path, model, ids)
            if theirs is None:
                continue
            for change in instead:
                other = lamina.GPT(model.config.replace(**change))
                other.load_state_dict(model.state_dict())
                alt = other.eval()(torch.tensor([ids]))[0].numpy()
                diff = np.abs(alt - theirs).max()
                print(f"{'':40s} vs lamina with {change}: max |diff| {diff:.4f}")
            if args.quant:
                big = Path(tmp) / f"{d.name}-big"
                # larger weights: peaked logits, so that top-1 means something (as the
                # K-quant fixtures do)
                build(config_cls, model_cls, widened(extra), 0.125).save_pretrained(big)
                source = save_gguf(lamina.open(big).model, big / "f32.gguf", SpmVocabulary())
                target = big / f"{args.quant}.gguf"
                quantize(source, target, args.quant)
                kept, _ = load_gguf(target, quantized=True)
                compare(f"{name} {args.quant} kept quantized", target, kept, ids)
                compare(
                    f"{'':{len(name)}} {args.quant} dequantized", target, load_gguf(target)[0], ids
                )


if __name__ == "__main__":
    main()
