"""Layer 6: models built from the layers below (GPT decoder, encoder + classifier), their
configs and parameter counts."""

from lamina.models.config import GPT_PRESETS, EncoderConfig, GPTConfig
from lamina.models.encoder import Encoder, SequenceClassifier
from lamina.models.gpt import GPT
from lamina.models.params import count_module_params, count_params, meta_model

__all__ = [
    "GPT",
    "GPT_PRESETS",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "SequenceClassifier",
    "count_module_params",
    "count_params",
    "meta_model",
]
