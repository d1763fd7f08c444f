"""lamina: Transformers built layer by layer, each layer proven by invariant checks.

Layers (each imports only the ones below it):
    0 data       tokenizers, corpora, batch samplers, synthetic tasks   (lamina.data)
    1 embedding  token + position tables, tying, position offset         (lamina.embedding)
    2 attention  multi-head self-attention, masks, KV cache              (lamina.attention)
    3 block      LayerNorm, GELU, feed-forward, residual blocks          (lamina.block)
    4 models     GPT, Encoder, SequenceClassifier, configs, counts       (lamina.models)
Above them: checks, training, generation, interop and the `lamina` command.
"""

# Importing lamina changes no environment variable: OpenMP's wait policy is the user's (see
# BENCHMARKS.md, "Fair benches"); lamina.native's threads meet at barriers of their own.

from lamina.checkpoint import load_model as load
from lamina.checkpoint import save_model as save
from lamina.errors import CheckFailed, LaminaError, LaminaWarning
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
from lamina.version import __version__ as __version__

open = open_model  # lamina.open(source): any model lamina reads (not in __all__: a star import
# must not shadow the built-in open)

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
