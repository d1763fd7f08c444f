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

import sys
import types
from typing import TYPE_CHECKING, Any

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

_LAZY = {
    "Decoder": "decoder",
    "default_keep": "decoder",
    "slide": "decoder",
    "Step": "generate",
    "generate": "generate",
    "stream": "generate",
    "TextStream": "prompts",
    "encode_prompt": "prompts",
    "start_id": "prompts",
    "check_sampling": "sampling",
    "filter_logits": "sampling",
    "probabilities": "sampling",
    "sample": "sampling",
    "top_k_filter": "sampling",
    "top_p_filter": "sampling",
    "Stops": "stops",
    "cut_text": "stops",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"lamina.generation.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lamina.generation' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps a lazy name (`generate`, the function) from being rebound to the submodule of the
    same name when that submodule is imported (the eager imports did the same by ordering)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
