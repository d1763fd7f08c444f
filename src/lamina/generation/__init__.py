"""Generation: sampling, KV-cached decoding with a window rule past block_size, stops, streaming.

    pick.py      sampling's rule on NumPy rows: the one implementation          (knows no torch)
    sampling.py  the same on torch tensors: temperature, top-k, top-p, seeded draws
    stops.py     stop token ids, id sequences and strings                       (knows no model)
    decoder.py   prefill + decode steps with KV caches, left padding, windows   (knows no sampling)
    generate.py  `generate` and `stream`, which tie the three together
    prompts.py   `encode_prompt` and `TextStream`: text in and out, written once   (knows no model)
    conversation.py / prefix.py   a chat's turns over an engine: the torch model's prefix cache
                 (prefix.py) or the torch-free native runtime

Import `generate` and `stream` from here (the package root re-exports `generate`). The names
load on first use (PEP 562), so the torch-free modules (pick, prompts, stops, conversation)
import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lamina.lazy import lazy_names

if TYPE_CHECKING:
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

lazy_names(
    __name__,
    {
        "Decoder": "lamina.generation.decoder",
        "default_keep": "lamina.generation.decoder",
        "slide": "lamina.generation.decoder",
        "Step": "lamina.generation.generate",
        "generate": "lamina.generation.generate",
        "stream": "lamina.generation.generate",
        "TextStream": "lamina.generation.prompts",
        "encode_prompt": "lamina.generation.prompts",
        "start_id": "lamina.generation.prompts",
        "check_sampling": "lamina.generation.sampling",
        "filter_logits": "lamina.generation.sampling",
        "probabilities": "lamina.generation.sampling",
        "sample": "lamina.generation.sampling",
        "top_k_filter": "lamina.generation.sampling",
        "top_p_filter": "lamina.generation.sampling",
        "Stops": "lamina.generation.stops",
        "cut_text": "lamina.generation.stops",
    },
)


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
