"""Weight-only quantization of a GPT's linear layers: int8 (per output row) and int4 (grouped).

    quantize(model, "int8" | "int4", group_size=None) -> the same GPT, its linears replaced
    quantized_tensors(model) -> dict of tensors to save; scheme_of(model) -> {"scheme", ...}
    quantize_structure(model, scheme) -> the modules, empty, ready for ``load_state_dict``

Its modules, by concern:
    linear.py       Int8Linear, Int4Linear, Int8Embedding and the int8/int4 math
    quantize_model.py   quantize, quantize_structure, on_read: a GPT's layers replaced
    saved.py        scheme_of, quantized_tensors, finish_loading: saving and loading
    ggml.py, from_blocks.py   GGUF's quantized blocks kept as lamina's modules
    kquant.py       BlockLinear, BlockEmbedding: K-quants (and Q8_0, Q5_0, Q5_1) as stored
Which kernel runs each call (lamina's native one, torch's packed ones, or the weights
dequantized) is lamina.cpu's choice; the figures are in BENCHMARKS.md.

Deliberately unaware of files, tokenizers and training (a quantized model is for inference:
it has no gradients).
"""

from __future__ import annotations

from lamina.quant.linear import (
    INT4_GROUP_SIZES,
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    quantize_int4,
    quantize_int8,
)
from lamina.quant.quantize_model import on_read, quantize, quantize_structure
from lamina.quant.saved import SCHEMES, finish_loading, quantized_tensors, scheme_of

__all__ = [
    "INT4_GROUP_SIZES",
    "SCHEMES",
    "Int4Linear",
    "Int8Embedding",
    "Int8Linear",
    "finish_loading",
    "on_read",
    "quantize",
    "quantize_int4",
    "quantize_int8",
    "quantize_structure",
    "quantized_tensors",
    "scheme_of",
]
