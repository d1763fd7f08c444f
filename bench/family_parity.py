"""Every family's GGUF file, as lamina writes it, run by llama.cpp: top-1 agreement and the
largest logit difference against lamina on the same file.

    python bench/family_parity.py [--tokens 48]

For each family a tiny model with random weights is built by transformers (as the tests build
them: the reference is the family's own implementation), opened by lamina, written as an f32
GGUF file by `lamina.save_gguf`, and evaluated by llama.cpp (llama-cpp-python, fp32 KV cache)
over random token ids. Shapes keep to what llama.cpp assumes where GGUF stores nothing: Gemma's
query_pre_attn_scalar equal to head_dim (as in Gemma 2 2B/9B and Gemma 3 below 27B), Gemma 3's
five sliding layers per global one, Phi-3's original context (256) at least llama.cpp's
context (llama-cpp-python pads n_ctx to 256; llama.cpp chooses the long or short factors by
the context size, transformers and lamina by the sequence). A row with a second line shows
what llama.cpp computes instead: Mistral's window is not read from arch llama (llama.cpp equals
lamina without the window). Needs `make bench-deps` (llama-cpp-python); a family llama.cpp
refuses prints its refusal.
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

import lamina  # noqa: E402
from lamina.interop.gguf import save_gguf  # noqa: E402

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
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


def build(config_cls: str, model_cls: str, extra: dict) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_cls)(**{**SHAPE, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base, scale = (1.0, 0.2) if "norm" in name else (0.0, 0.15)
            if "norm" in name and config_cls.startswith("Gemma"):
                base = 0.0  # Gemma's gains are 1 + weight
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model


def llama_cpp_logits(path: Path, ids: list[int], n_ctx: int) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False,
        n_threads=os.cpu_count(), type_k=0, type_v=0,
    )  # fmt: skip
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48)
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
            ours = model(torch.tensor([ids]))[0].numpy()
            try:
                theirs = llama_cpp_logits(path, ids, n_ctx=64)
            except Exception as e:  # llama.cpp's refusal is the result here
                print(f"{name:34s} llama.cpp refused the file: {str(e).splitlines()[0]}")
                continue
            top1 = (ours.argmax(-1) == theirs.argmax(-1)).mean()
            diff = np.abs(ours - theirs).max()
            print(
                f"{name:34s} top-1 {top1:7.2%}   max |diff| {diff:8.4f}   "
                f"logit scale {np.abs(ours).max():6.2f}   ({len(ids)} positions)"
            )
            for change in instead:
                other = lamina.GPT(model.config.replace(**change))
                other.load_state_dict(model.state_dict())
                alt = other.eval()(torch.tensor([ids]))[0].numpy()
                print(
                    f"{'':34s} vs lamina with {change}: max |diff| {np.abs(alt - theirs).max():.4f}"
                )


if __name__ == "__main__":
    main()
