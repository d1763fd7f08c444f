"""A family record's config.json, read and written: config.json dicts <-> GPTConfig.

    from_hf(family, config_json, where) -> GPTConfig     to_hf(family, config, dtype) -> dict
    canonical(config, fmt), differences(a, b)     what a round trip compares (see family_gguf's
                                        `expressing`, which picks the family a model is written as)
    build_config, windows, period_types            shared with family_gguf (GGUF metadata)

One mapper for every family: the record (see `family`) says which names and options apply.
Reading fills what a config.json leaves out with the config class's defaults, as transformers
does (the GGUF side, family_gguf, takes the record's GGUF defaults, and the tensors present say
the biases, the tie and a rope scaling stored as tensors). Writing is checked by
reading back: a model is written as a family only if reading what was written gives the same
config (fields a format does not carry, such as init_std in GGUF, aside), so nothing a model
computes is silently lost, and a refusal names the fields that differ. Anything read that
lamina cannot compute is refused in one line naming the setting.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lamina.attention import RopeScaling
from lamina.errors import LaminaError
from lamina.interop.family import Family
from lamina.interop.family_rope import freq_factors
from lamina.models.config import GPTConfig

_FIELDS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
NOT_IN = {
    "hf": {"zero_init_proj", "attn_dropout"},
    "gguf": {"zero_init_proj", "init_std", "dropout", "attn_dropout"},
}


def _refuse(where: str, setting: str) -> LaminaError:
    return LaminaError(f"{where}: lamina's GPT cannot express {setting}")


def build_config(fields: dict[str, Any], where: str) -> GPTConfig:
    """GPTConfig(**fields), its refusal prefixed with where the fields came from."""
    try:
        return GPTConfig(**fields)
    except (LaminaError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: {e}") from e


def windows(types: list[str] | None, window: int | None, n: int) -> dict[str, Any]:
    """sliding_window / layer_types in lamina's canonical form (None where all alike)."""
    if window is None or (types is not None and "sliding" not in types):
        return {"sliding_window": None, "layer_types": None}
    if types is None or all(t == "sliding" for t in types):
        return {"sliding_window": window, "layer_types": None}
    return {"sliding_window": window, "layer_types": tuple(types)}


def period_types(n: int, period: int) -> list[str]:
    return ["sliding" if (i + 1) % period else "full" for i in range(n)]


def _rope_hf(family: Family, c: dict[str, Any], head_dim: int, where: str) -> dict[str, Any]:
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise LaminaError(f"{where}: rope_scaling must be an object or null, got {params!r}")
    local = None
    if "full_attention" in params or "sliding_attention" in params:  # per layer type (v5)
        local, params = params.get("sliding_attention") or {}, params.get("full_attention") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {"rope_theta": float(params.get("rope_theta", c.get("rope_theta")))}
    partial = params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        if not family.partial_rotary:
            raise _refuse(where, f"partial_rotary_factor={partial} in a {family.title} model")
        out["rotary_dim"] = int(head_dim * partial)
    if family.local_rope:
        local = local or {"rope_theta": c.get("rope_local_base_freq")}
        if local.get("rope_type", "default") != "default":
            raise _refuse(where, f"sliding layers' rope_type {local.get('rope_type')!r}")
        out["rope_local_theta"] = float(local["rope_theta"])
    if kind == "default":
        return out
    if kind == "su":
        kind = "longrope"
    if kind not in family.rope_kinds:
        runs = ", ".join(map(repr, ("default", *family.rope_kinds)))
        raise _refuse(where, f"rope_scaling type {kind!r} (the {family.title} family runs {runs})")
    try:
        if kind == "linear":
            out["rope_scaling"] = RopeScaling("linear", float(params["factor"]))
        elif kind == "llama3":
            out["rope_scaling"] = RopeScaling(
                "llama3", float(params["factor"]), float(params["low_freq_factor"]),
                float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]),
            )  # fmt: skip
        else:  # longrope: the factor transformers takes is max_position / original
            original = int(
                c.get("original_max_position_embeddings")
                or params["original_max_position_embeddings"]
            )
            out["rope_scaling"] = RopeScaling(
                "longrope", c["max_position_embeddings"] / original,
                original_max_positions=original, short_factor=params["short_factor"],
                long_factor=params["long_factor"], attention_factor=params.get("attention_factor"),
            )  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: rope_scaling of type {kind!r} lacks or mangles {e}") from None
    return out


def from_hf(family: Family, hf: Mapping[str, Any], where: str = "config.json") -> GPTConfig:
    """A GPTConfig from a config.json dict of this family; refuses what lamina cannot run."""
    c = {**family.hf_defaults, **hf}
    for key, want in family.hf_required.items():
        if c.get(key) != want:
            raise _refuse(where, f"{key}={c.get(key)!r}")
    fields: dict[str, Any] = dict(family.fixed)
    for k in family.keys:
        if k.hf and k.hf[0] in c:
            fields[k.field] = c[k.hf[0]]
    act = c.get(family.act_key)
    if act not in family.activations:
        runs = ", ".join(map(repr, family.activations))
        raise _refuse(where, f"{family.act_key}={act!r} (the {family.title} family runs {runs})")
    fields["activation"] = family.activations[act]
    qkv, o, mlp = (c.get(b, False) if isinstance(b, str) else b for b in family.biases)
    if bool(o) != bool(mlp):
        raise _refuse(
            where,
            f"a bias on {'o_proj' if o else 'the MLP'} only (lamina's `bias` covers o_proj and "
            "the MLP together)",
        )
    fields |= {"qkv_bias": bool(qkv), "bias": bool(o), "tie_weights": bool(fields["tie_weights"])}
    width, heads = c.get("hidden_size"), c.get("num_attention_heads")
    natural = width // heads if isinstance(width, int) and isinstance(heads, int) and heads else 0
    head_dim = c.get("head_dim") or natural
    if "positions" in family.fixed and family.fixed["positions"] == "rope":
        fields |= {"d_head": None if head_dim == natural else head_dim}
        fields |= _rope_hf(family, c, head_dim, where)
    n = c.get("num_hidden_layers", 0)
    if family.window == "gated" and c.get("use_sliding_window"):
        raise _refuse(where, "use_sliding_window=true (Qwen's windowed upper layers)")
    if family.window == "all":
        fields |= windows(None, c.get("sliding_window"), n)
    elif family.window == "layers":
        types = c.get("layer_types")
        if types is None:
            period = c.get("sliding_window_pattern", c.get("_sliding_window_pattern"))
            types = period_types(n, period or family.window_period or 1)
        else:
            bad = [t for t in types if t not in _TYPES]
            if bad or len(types) != n:
                raise _refuse(where, f"layer_types={types!r}")
            types = [_TYPES[t] for t in types]
        fields |= windows(types, c.get("sliding_window"), n)
    if family.attn_scalar:
        scalar = c.get("query_pre_attn_scalar")
        fields["attn_scale"] = None if scalar in (None, head_dim) else float(scalar) ** -0.5
    if family.embed_sqrt_d and isinstance(width, int):
        fields["embed_scale"] = width**0.5
    fields["dropout"] = float(fields.get("dropout", 0.0))
    return build_config(fields, where)


def to_hf(family: Family, config: GPTConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The config.json of `family` for `config` (unchecked: see `expressing`)."""
    c = config
    out: dict[str, Any] = {"architectures": [family.hf_class], "model_type": family.hf_types[0]}
    for k in family.keys:
        value = c.kv_heads if k.field == "n_kv_heads" else getattr(c, k.field)
        for name in k.hf:
            out[name] = value
    out |= dict(family.hf_required)
    out[family.act_key] = next(
        (h for h, ours in family.activations.items() if ours == c.activation), c.activation
    )
    for name, want in zip(family.biases, (c.qkv_bias, c.bias, c.bias), strict=True):
        if isinstance(name, str):
            out[name] = bool(out.get(name, False) or want)
    if c.positions == "rope":
        out["head_dim"] = c.head_dim
        params: dict[str, Any] = {"rope_type": "default", "rope_theta": c.rope_theta}
        s = c.rope_scaling
        if s is not None:
            params["rope_type"] = s.kind
            if s.kind in ("linear", "llama3"):
                params["factor"] = s.factor
            if s.kind == "llama3":
                params |= dict(low_freq_factor=s.low_freq_factor,
                               high_freq_factor=s.high_freq_factor,
                               original_max_position_embeddings=s.original_max_positions)  # fmt: skip
            if s.kind == "longrope":
                params |= dict(short_factor=list(s.short_factor), long_factor=list(s.long_factor))
                if s.attention_factor is not None:
                    params["attention_factor"] = s.attention_factor
                out["original_max_position_embeddings"] = s.original_max_positions
        if c.rotary_dim not in (None, c.head_dim):
            params["partial_rotary_factor"] = out["partial_rotary_factor"] = (
                c.rotary_dim / c.head_dim
            )
        if family.local_rope:
            local = c.rope_local_theta or c.rope_theta
            out["rope_local_base_freq"] = local
            params = {"full_attention": params,
                      "sliding_attention": {"rope_type": "default", "rope_theta": local}}  # fmt: skip
        out["rope_theta"] = c.rope_theta
        out["rope_parameters"] = params
    window, types = c.sliding_window, c.layer_types
    if family.window == "gated":
        out |= {"use_sliding_window": False, "sliding_window": None}
    elif family.window == "all":
        out["sliding_window"] = window
    elif family.window == "layers":
        kinds = types or ["sliding" if window else "full"] * c.n_layers
        out["layer_types"] = [f"{t}_attention" for t in kinds]
        out["sliding_window"] = window or c.block_size
    if family.attn_scalar:
        scale = c.attn_scale
        scalar = c.head_dim if scale is None else scale**-2
        out["query_pre_attn_scalar"] = (
            round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar
        )
    out |= {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    out["dtype"] = str(dtype).removeprefix("torch.")
    return out


def canonical(config: GPTConfig, fmt: str) -> GPTConfig:
    """`config` with the derived defaults spelled out and the fields `fmt` does not carry reset."""
    c = config.replace(d_ff=config.ff_width, n_kv_heads=config.kv_heads)
    reset = {k: _FIELDS[k] for k in NOT_IN[fmt] if k in _FIELDS}
    return c.replace(**reset)


def differences(a: GPTConfig, b: GPTConfig) -> list[str]:
    """Fields where `a` and `b` differ, as "field=a" (floats equal to float32's precision: GGUF
    stores them so)."""
    out = []
    for k in _FIELDS:
        x, y = getattr(a, k), getattr(b, k)
        if not _close(x, y) and not (k == "rope_scaling" and _same_llama3(a, b)):
            out.append(f"{k}={x!r}")
    return out


def _close(x: Any, y: Any) -> bool:
    """Equal, floats to float32's precision (a GGUF file stores them so), also inside tuples
    and rope scalings."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-6)
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(map(_close, x, y))
    if isinstance(x, RopeScaling) and isinstance(y, RopeScaling):
        return all(_close(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
    return x == y


def _same_llama3(a: GPTConfig, b: GPTConfig) -> bool:
    """Two llama3 scalings that stretch every frequency alike (a GGUF file keeps the factors,
    not the parameters: equivalent parameters read back from it are the same model)."""
    x, y = a.rope_scaling, b.rope_scaling
    if not (x and y and x.kind == y.kind == "llama3"):
        return False
    width = a.rotary_dim or a.head_dim
    fx, fy = (freq_factors(s, width, a.rope_theta) for s in (x, y))
    return bool(np.allclose(fx, fy, rtol=1e-5, atol=0))
