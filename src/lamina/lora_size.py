"""LoRA sizes by formula, for the memory check before a run builds anything.

    count_lora_params(config, lora) -> adapter parameters: r (in + width) per adapted segment
    fit_bytes(config, lora) -> bytes of weights and optimizer state training needs

Pure arithmetic over a GPTConfig and a LoRAConfig (lamina.lora): no model is built, so a run
that would not fit is refused in a millisecond. Tests check both against a built model.
"""

from __future__ import annotations

from lamina.lora import LoRAConfig
from lamina.models.config import GPTConfig
from lamina.models.params import count_params


def _segment_inputs(config: GPTConfig) -> list[tuple[str, int, int]]:
    """(target, input width, output width) of every segment of one layer, then the head."""
    c = config
    hd, f, d = c.head_dim, c.ff_width, c.d_model
    fc = [("gate", d, f), ("up", d, f)] if c.gated else [("fc", d, f)]
    layer = [("q", d, c.n_heads * hd), ("k", d, c.kv_heads * hd), ("v", d, c.kv_heads * hd)]
    layer += [("o", c.n_heads * hd, d), *fc, ("down", f, d)]  # o reads the H hd heads
    return layer * c.n_layers + [("head", d, c.vocab_size)]


def count_lora_params(config: GPTConfig, lora: LoRAConfig) -> int:
    """Adapter parameters by formula: r (in + width) for every adapted segment."""
    wanted = set(lora.targets)
    return sum(lora.r * (i + o) for t, i, o in _segment_inputs(config) if t in wanted)


def fit_bytes(
    config: GPTConfig, lora: LoRAConfig | None = None, *, base_bytes_per_param: float = 4.0
) -> int:
    """Bytes of weights and optimizer state that training needs (activations not counted).

    Full training: 16 bytes a parameter (fp32 weight, gradient, AdamW's two moments). With LoRA
    the frozen base costs only its weights (`base_bytes_per_param`: 4 for fp32, about 1 for
    int8) and each adapter parameter 16 bytes: the base never has gradients or moments.
    """
    n = count_params(config)
    if lora is None:
        return n * 16
    return int(n * base_bytes_per_param) + count_lora_params(config, lora) * 16
