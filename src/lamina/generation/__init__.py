"""Generation: sampling, KV-cached decoding with a window rule past block_size, stops, streaming.

    sampling.py  pure functions: temperature, top-k, top-p, seeded draws       (knows no model)
    stops.py     stop token ids, id sequences and strings                       (knows no model)
    decoder.py   prefill + decode steps with KV caches, left padding, windows   (knows no sampling)
    generate.py  `generate` and `stream`, which tie the three together

Import `generate` and `stream` from here (the package root re-exports `generate`).
"""

from lamina.generation.decoder import Decoder, default_keep, slide
from lamina.generation.generate import Step, generate, stream
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
    "check_sampling",
    "cut_text",
    "default_keep",
    "filter_logits",
    "generate",
    "probabilities",
    "sample",
    "slide",
    "stream",
    "top_k_filter",
    "top_p_filter",
]
