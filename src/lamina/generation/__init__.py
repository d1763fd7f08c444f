"""Generation: sampling, KV-cached decoding with a window rule past block_size, stops, streaming.

    sampling.py  pure functions: temperature, top-k, top-p, seeded draws       (knows no model)
    stops.py     stop token ids, id sequences and strings                       (knows no model)
    decoder.py   prefill + decode steps with KV caches, left padding, windows   (knows no sampling)
    generate.py  `generate` and `stream`, which tie the three together
    prompts.py   `encode_prompt` and `TextStream`: text in and out, written once   (knows no model)

Import `generate` and `stream` from here (the package root re-exports `generate`).
"""

from lamina.generation.decoder import Decoder, default_keep, slide
from lamina.generation.generate import Step, generate, stream
from lamina.generation.prompts import TextStream, encode_prompt, start_id
from lamina.generation.sampling import (
    check_sampling,
    filter_logits,
    probabilities,
    sample,
    top_k_filter,
    top_p_filter,
)
from lamina.generation.stops import Stops, cut_text

__all__ = [
    "Decoder",
    "Step",
    "Stops",
    "TextStream",
    "check_sampling",
    "cut_text",
    "default_keep",
    "encode_prompt",
    "filter_logits",
    "generate",
    "probabilities",
    "sample",
    "slide",
    "start_id",
    "stream",
    "top_k_filter",
    "top_p_filter",
]
