"""lamina: Transformers built layer by layer, each layer proven by invariant checks.

Layers (each imports only lower ones; the numbers are tests/test_layers.py's ranks, which the
README's layer map draws; 0 and 1 are the leaves: errors, files, validation):
    2 tokenizers  text <-> ids: every kind, each format's tokenizer files (lamina.tokenizers)
    3 data        corpora, batch samplers, synthetic tasks, labelled texts  (lamina.data)
    3 embedding   token + position tables, tying, position offset          (lamina.embedding)
    3 rope        rotary tables and their scalings                          (lamina.rope)
    4 attention   multi-head self-attention, masks, KV cache                (lamina.attention)
    5 block       LayerNorm, GELU, feed-forward, residual blocks            (lamina.block)
    6 models      GPT, Encoder, SequenceClassifier, configs, counts         (lamina.models)
Above them: native, lora, quant, checkpoint, checks, generation, evals, interop, training,
serve and the `lamina` command.
"""

# Importing lamina changes no environment variable: OpenMP's wait policy is the user's (see
# BENCHMARKS.md, "Fair benches"); lamina.native's threads meet at barriers of their own.

from __future__ import annotations

from typing import TYPE_CHECKING

from lamina.errors import CheckFailed, LaminaError, LaminaWarning
from lamina.lazy import lazy_names
from lamina.version import __version__ as __version__

if TYPE_CHECKING:  # the names below load on first use (module __getattr__, PEP 562)
    from lamina.checkpoint import load_model as load
    from lamina.checkpoint import save_model as save
    from lamina.generation import generate, stream
    from lamina.interop import from_hf, save_hf
    from lamina.interop.bundle import Bundle, open_model
    from lamina.models import (
        GPT,
        Encoder,
        EncoderConfig,
        GPTConfig,
        SequenceClassifier,
        count_params,
    )
    from lamina.quant import quantize

    open = open_model

# public name -> "module:its name there": importing lamina imports none of them (nor torch), so
# the torch-free runtime (lamina.native.runtime) and the tokenizers load without torch
lazy_names(
    __name__,
    {
        "load": "lamina.checkpoint:load_model",
        "save": "lamina.checkpoint:save_model",
        "generate": "lamina.generation:generate",
        "stream": "lamina.generation:stream",
        "from_hf": "lamina.interop:from_hf",
        "save_hf": "lamina.interop:save_hf",
        "Bundle": "lamina.interop.bundle:Bundle",
        "open_model": "lamina.interop.bundle:open_model",
        # lamina.open(source): any model lamina reads (not in __all__: a star import must not
        # shadow the built-in open)
        "open": "lamina.interop.bundle:open_model",
        "GPT": "lamina.models:GPT",
        "Encoder": "lamina.models:Encoder",
        "EncoderConfig": "lamina.models:EncoderConfig",
        "GPTConfig": "lamina.models:GPTConfig",
        "SequenceClassifier": "lamina.models:SequenceClassifier",
        "count_params": "lamina.models:count_params",
        "quantize": "lamina.quant:quantize",
    },
)


__all__ = [
    "GPT",
    "Bundle",
    "CheckFailed",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "LaminaError",
    "LaminaWarning",
    "SequenceClassifier",
    "count_params",
    "from_hf",
    "generate",
    "load",
    "open_model",
    "quantize",
    "save",
    "save_hf",
    "stream",
]
