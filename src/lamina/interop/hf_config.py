"""Typed shapes of Hugging Face config.json and PEFT adapter_config.json (lamina.schema's).

    check_hf_config(data, where) -> dict       a config.json whose every known field has its
                                               type and range; else one LaminaError naming it
    check_peft_config(data, where) -> dict     the same for a PEFT LoRA adapter_config.json

The family reader (hf_family, through the family records) then reads plain, checked values: a boolean is a JSON
boolean (``"false"`` is refused, never read as True), a number is a JSON number (``"64"`` is not
coerced), a size is an integer within `LIMITS` (refused before anything is allocated: a
vocab_size of 1e20 is a float, 10**20 is over the limit), a float is finite (an rms_norm_eps of
Infinity is refused). Fields are checked wherever they appear, whatever the model_type, so a new
family gets the same checks. Conflicting fields are refused by name: a ``rope_scaling`` beside a
``rope_parameters`` that says otherwise (transformers 4 reads one, 5 the other).

What this module deliberately does not know: what the fields mean for a model (the family
readers' business) and which settings lamina can run.
"""

from __future__ import annotations

from typing import Any

from lamina.errors import LaminaError
from lamina.schema import Any_, Arr, Bool, Int, Maybe, Num, Obj, Str, check

__all__ = ["LIMITS", "check_hf_config", "check_peft_config"]

# the largest sizes read (far above any released model: Llama 3.1 405B has width 16,384,
# 126 layers, 128 heads; Gemma 3 a 262,144-token vocabulary; Llama 4 Scout a 10M context)
LIMITS = dict(vocab=2**24, width=2**17, ff=2**21, layers=2**12, heads=2**12, context=2**31)

_size = {k: Int(1, v) for k, v in LIMITS.items()}
_ROPE = Maybe(
    Obj(
        {},
        optional={
            "rope_type": Str(), "type": Str(), "factor": Num(0), "rope_theta": Num(0),
            "low_freq_factor": Num(0), "high_freq_factor": Num(0),
            "original_max_position_embeddings": _size["context"], "partial_rotary_factor": Num(0, 1),
        },
    )
)  # fmt: skip
_FIELDS = {
    "model_type": Str(nonempty=True),
    "vocab_size": _size["vocab"],
    # Llama family
    "hidden_size": _size["width"],
    "intermediate_size": _size["ff"],
    "num_hidden_layers": _size["layers"],
    "num_attention_heads": _size["heads"],
    "num_key_value_heads": Maybe(_size["heads"]),
    "head_dim": Maybe(_size["width"]),
    "max_position_embeddings": _size["context"],
    "rms_norm_eps": Num(0, 1),
    "rope_theta": Num(0),
    "rope_scaling": _ROPE,
    "rope_parameters": _ROPE,
    "partial_rotary_factor": Num(0, 1),
    "attention_bias": Bool(),
    "mlp_bias": Bool(),
    "attention_dropout": Num(0, 1),
    "hidden_act": Str(nonempty=True),
    "sliding_window": Maybe(_size["context"]),
    "use_sliding_window": Bool(),
    # GPT-2
    "n_embd": _size["width"],
    "n_head": _size["heads"],
    "n_layer": _size["layers"],
    "n_positions": _size["context"],
    "n_inner": Maybe(_size["ff"]),
    "resid_pdrop": Num(0, 1),
    "embd_pdrop": Num(0, 1),
    "attn_pdrop": Num(0, 1),
    "layer_norm_epsilon": Num(0, 1),
    "activation_function": Str(nonempty=True),
    "scale_attn_weights": Bool(),
    "scale_attn_by_inverse_layer_idx": Bool(),
    "add_cross_attention": Bool(),
    # every family
    "tie_word_embeddings": Bool(),
    "initializer_range": Num(0),
}
HF_CONFIG = Obj({"model_type": _FIELDS["model_type"]}, optional=_FIELDS)

PEFT_CONFIG = Obj(
    {"peft_type": Str()},
    optional={
        "r": Int(1, 2**16), "lora_alpha": Num(0), "lora_dropout": Num(0, 1),
        "target_modules": Any_(),  # a list (checked below) or a regex string (refused later)
        "use_rslora": Bool(), "use_dora": Bool(), "bias": Str(), "fan_in_fan_out": Bool(),
        "layers_to_transform": Maybe(Any_()), "base_model_name_or_path": Maybe(Str()),
    },
)  # fmt: skip


def check_hf_config(data: Any, where: str) -> dict[str, Any]:
    """`data` (a parsed config.json) if every field lamina reads has its type and range."""
    out = check(HF_CONFIG, data, where)
    scaling, params = out.get("rope_scaling"), out.get("rope_parameters")
    if scaling is not None and params is not None and scaling != params:
        raise LaminaError(
            f"{where}: rope_scaling {scaling!r} and rope_parameters {params!r} disagree (one "
            "transformers version reads each); keep one"
        )
    return out


def check_peft_config(data: Any, where: str) -> dict[str, Any]:
    """`data` (a parsed adapter_config.json) if its fields have their types and ranges."""
    out = check(PEFT_CONFIG, data, where)
    if isinstance(out.get("target_modules"), list):
        modules = Obj({"target_modules": Arr(Str(nonempty=True), min_len=1)})
        check(modules, {"target_modules": out["target_modules"]}, where)
    return out
