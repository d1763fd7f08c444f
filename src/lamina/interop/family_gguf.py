"""A family record's GGUF metadata, read and written, and the family a model is written as.

    from_gguf(families, metadata, present, tied, fetch, where) -> (Family, GPTConfig, consumed)
        `present`: tensor name -> shape; `fetch(name)` reads a small tensor (rope factors);
        `consumed`: the tensors that were config, not weights (rope_freqs, rope_factors_*)
    to_gguf(family, config) -> (metadata, tensors)     `{arch}.` keys, rope-scaling tensors
    expressing(config, fmt) -> Family     the first family, in table order, that writes `config`
                                          in fmt "hf" or "gguf" exactly (a read-back check); for
                                          GGUF its HF family first (a Qwen2 stays qwen2)

Keys: each record `Key`'s GGUF name, plus `rope.freq_base` -> rope_theta, `attention.key_length`
/ `value_length` -> d_head, `rope.dimension_count` -> rotary_dim (partial-rotary families only),
`rope.scaling.type` "linear" + `.factor`, `attention.sliding_window` (0: none) and
`attention.sliding_window_pattern` (a period, or one bool per layer: true = sliding) ->
sliding_window / layer_types, `rope.freq_base_swa` -> rope_local_theta, `attention.scale` ->
attn_scale, soft caps. Tensors that are config: `rope_freqs.weight` (a Llama 3.x llama3
scaling, see family_rope), `rope_factors_long/short.weight` with
`rope.scaling.original_context_length` and `.attn_factor` (Phi-3 longrope). Where llama.cpp
hard-codes a rule the record says it: Gemma 2 alternates sliding and global layers, Gemma 3
has five sliding per global one and a sliding-layer base of 10000, and the 27B Gemmas scale
queries by (d / heads)^-1/2. Any other `{arch}.` key is refused in one line naming it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lamina.attention import RopeScaling
from lamina.errors import LaminaError
from lamina.interop.families import FAMILIES
from lamina.interop.family import Family
from lamina.interop.family_config import (
    build_config,
    canonical,
    differences,
    from_hf,
    period_types,
    to_hf,
    windows,
)
from lamina.interop.family_rope import freq_factors, llama3_from_factors
from lamina.models.config import GPTConfig
from lamina.native.gguf_read import shown

_ROPE_FREQS, _LONG, _SHORT = (
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
)
_ALWAYS = {"tensor_data_layout", "attention.causal", "attention.scale"}
_ROTARY = {"rope.freq_base", "rope.dimension_count", "attention.key_length",
           "attention.value_length"}  # fmt: skip
_WINDOW = {"attention.sliding_window", "attention.sliding_window_pattern"}
_FLOATS = {f.name for f in dataclasses.fields(GPTConfig) if "float" in str(f.type)}
_ZERO_OK = {"expert_count", "expert_used_count", "expert_shared_count"}  # present as 0: none
_NONE_OK = {"rope.scaling.type": ("none",), "rope.scaling.factor": (1.0, 0.0)}


def _known(family: Family) -> set[str]:
    known = {k.gguf for k in family.keys if k.gguf} | _ALWAYS
    if family.fixed.get("positions") == "rope":
        known |= _ROTARY
    if family.window != "none":
        known |= _WINDOW
    if "linear" in family.rope_kinds:
        known |= {"rope.scaling.type", "rope.scaling.factor"}
    if "longrope" in family.rope_kinds:
        known |= {"rope.scaling.attn_factor", "rope.scaling.original_context_length"}
    if family.local_rope:
        known.add("rope.freq_base_swa")
    return known


def _unknown(family: Family, metadata: Mapping[str, Any]) -> str | None:
    a = family.gguf_arch + "."
    known = _known(family)
    for key, value in metadata.items():
        k = key[len(a) :] if key.startswith(a) else None
        if k is None or k in known or (k in _ZERO_OK and value == 0):
            continue
        if k in _NONE_OK and value in _NONE_OK[k]:
            continue
        return f"GGUF key {shown(key)} = {shown(repr(value))} is one lamina cannot honour"
    return None


def _number(metadata: Mapping[str, Any], key: str, where: str, default: Any, kind: type) -> Any:
    value = metadata.get(key, default)
    if value is None:
        raise LaminaError(f"{where}: GGUF metadata lacks {key}")
    ok = not isinstance(value, bool) and isinstance(value, int if kind is int else (int, float))
    if not ok or value < 0:
        what = "a non-negative integer" if kind is int else "a number"
        raise LaminaError(f"{where}: GGUF key {key} must be {what}, got {shown(repr(value))}")
    return kind(value)


def _read(
    family: Family,
    metadata: Mapping[str, Any],
    present: Mapping[str, tuple[int, ...]],
    tied: bool,
    fetch: Callable[[str], np.ndarray],
    where: str,
) -> tuple[GPTConfig, set[str]]:
    a = family.gguf_arch + "."
    # a GGUF architecture has one activation: the record's first (GPT-2 files are gelu)
    fields: dict[str, Any] = {"activation": next(iter(family.activations.values()))}
    fields |= family.fixed
    for k in family.keys:
        if not k.gguf or k.field == "vocab_size":
            continue
        if k.optional and metadata.get(a + k.gguf) in (None, 0):
            continue
        kind = float if k.field in _FLOATS else int
        fields[k.field] = _number(metadata, a + k.gguf, where, k.gguf_default, kind)
    d, heads = fields["d_model"], fields["n_heads"]
    if "token_embd.weight" in present:
        fields["vocab_size"] = present["token_embd.weight"][0]
    else:
        tokens = metadata.get("tokenizer.ggml.tokens")
        default = len(tokens) if isinstance(tokens, list) else None
        fields["vocab_size"] = _number(metadata, a + "vocab_size", where, default, int)
    fields["tie_weights"] = tied
    for field_name, lamina in (("qkv_bias", "attn.qkv.bias"), ("bias", "attn.proj.bias")):
        spec = family.block.get(lamina, (None, None))[1]
        fields[field_name] = bool(spec) and any(
            "blk.0." + p.partition(":")[0] in present for p in spec.split("|")
        )
    consumed: set[str] = set()
    if fields.get("positions") == "rope":
        natural = d // heads if heads and d % heads == 0 else None
        width = _number(metadata, a + "attention.key_length", where, natural or 0, int)
        if metadata.get(a + "attention.value_length", width) != width or not width:
            raise LaminaError(
                f"{where}: GGUF keys {a}attention.key_length / value_length = {width!r} / "
                f"{metadata.get(a + 'attention.value_length')!r}: lamina's heads are one width"
            )
        fields["d_head"] = None if width == natural else width
        rotary = _number(metadata, a + "rope.dimension_count", where, width, int)
        if rotary != width:
            if not family.partial_rotary:
                raise LaminaError(
                    f"{where}: GGUF key {a}rope.dimension_count = {rotary!r}: lamina's rotary "
                    f"tables are as wide as its heads ({width}) in a {family.title} model"
                )
            fields["rotary_dim"] = rotary
        theta = _number(metadata, a + "rope.freq_base", where, 10000.0, float)
        fields["rope_theta"] = theta
        kind = metadata.get(a + "rope.scaling.type", "none")
        if kind not in ("none", "linear"):
            raise LaminaError(
                f"{where}: GGUF key {a}rope.scaling.type = {shown(repr(kind))} is one lamina "
                "cannot honour"
            )
        if kind == "linear":
            factor = _number(metadata, a + "rope.scaling.factor", where, None, float)
            fields["rope_scaling"] = RopeScaling("linear", factor)
        if _ROPE_FREQS in present and "llama3" in family.rope_kinds:
            factors = fetch(_ROPE_FREQS)
            scaling = llama3_from_factors(factors, rotary, theta)
            if scaling is None and not np.allclose(factors, 1.0):
                raise LaminaError(
                    f"{where}: {_ROPE_FREQS} holds frequency factors that are not a llama3 "
                    "scaling lamina can express"
                )
            fields["rope_scaling"] = fields.get("rope_scaling") or scaling
            consumed.add(_ROPE_FREQS)
        if _LONG in present and "longrope" in family.rope_kinds:
            original = _number(
                metadata, a + "rope.scaling.original_context_length", where, None, int
            )
            attn = metadata.get(a + "rope.scaling.attn_factor")
            scaling = RopeScaling(
                "longrope", fields["block_size"] / original, original_max_positions=original,
                short_factor=fetch(_SHORT).tolist(), long_factor=fetch(_LONG).tolist(),
                attention_factor=None if attn is None else float(attn),
            )  # fmt: skip
            default = dataclasses.replace(scaling, attention_factor=None)
            if attn is not None and math.isclose(default.magnitude, attn, rel_tol=1e-6):
                scaling = default  # llama.cpp's converter writes the formula's value
            fields["rope_scaling"] = scaling
            consumed |= {_LONG, _SHORT}
    window = metadata.get(a + "attention.sliding_window") or None
    n = fields["n_layers"]
    types: list[str] | None = None
    pattern = metadata.get(a + "attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == n:
        types = ["sliding" if p else "full" for p in pattern]
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        types = period_types(n, pattern)
    elif pattern is not None:
        raise LaminaError(f"{where}: GGUF key {a}attention.sliding_window_pattern = {pattern!r}")
    elif family.window_period:
        types = period_types(n, family.window_period)
    if window is not None:
        fields |= windows(types, window, n)
    if family.local_rope:
        local = metadata.get(a + "rope.freq_base_swa", family.gguf_local_theta)
        fields["rope_local_theta"] = float(local) if local is not None else None
    scale = metadata.get(a + "attention.scale")
    if scale is not None:
        fields["attn_scale"] = float(scale)
    elif family.attn_scalar and n == family.gguf_big_scale_layers and natural != width:
        fields["attn_scale"] = float(natural) ** -0.5
    if family.embed_sqrt_d:
        fields["embed_scale"] = d**0.5
    return build_config(fields, where), consumed


def from_gguf(
    arch: str,
    metadata: Mapping[str, Any],
    present: Mapping[str, tuple[int, ...]],
    tied: bool,
    fetch: Callable[[str], np.ndarray],
    where: str = "GGUF file",
) -> tuple[Family, GPTConfig, set[str]]:
    """(family, config, tensors consumed as config) of a GGUF file of architecture `arch`: the
    first family of that architecture whose keys cover the file's (llama: Llama, then Mistral)."""
    candidates = [f for f in FAMILIES.values() if f.gguf_arch == arch]
    if not candidates:
        runs = ", ".join(dict.fromkeys(f.gguf_arch for f in FAMILIES.values() if f.gguf_arch))
        raise LaminaError(
            f"{where}: GGUF architecture {shown(repr(arch))} is not one lamina runs (it runs {runs})"
        )
    problem = None
    for family in candidates:
        problem = problem or _unknown(family, metadata)
        if _unknown(family, metadata) is None:
            config, consumed = _read(family, metadata, present, tied, fetch, where)
            return family, config, consumed
    raise LaminaError(f"{where}: {problem}")


def to_gguf(family: Family, config: GPTConfig) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The `{arch}.` metadata and the rope-scaling tensors of `config` written as `family`."""
    c, a = config, family.gguf_arch + "."
    meta: dict[str, Any] = {}
    for k in family.keys:
        value = {"d_ff": c.ff_width, "n_kv_heads": c.kv_heads}.get(k.field, getattr(c, k.field))
        if k.gguf and value is not None:
            meta[a + k.gguf] = float(value) if isinstance(value, float) else value
    tensors: dict[str, np.ndarray] = {}
    if c.positions == "rope":
        rotary = c.rotary_dim or c.head_dim
        meta |= {a + "rope.freq_base": float(c.rope_theta), a + "rope.dimension_count": rotary,
                 a + "attention.key_length": c.head_dim, a + "attention.value_length": c.head_dim}  # fmt: skip
        s = c.rope_scaling
        if s is not None and s.kind == "linear":
            meta |= {a + "rope.scaling.type": "linear", a + "rope.scaling.factor": s.factor}
        elif s is not None and s.kind == "llama3":
            tensors[_ROPE_FREQS] = freq_factors(s, rotary, c.rope_theta)
        elif s is not None:
            meta[a + "rope.scaling.original_context_length"] = s.original_max_positions
            meta[a + "rope.scaling.attn_factor"] = float(s.magnitude)
            tensors[_LONG] = np.asarray(s.long_factor, dtype=np.float32)
            tensors[_SHORT] = np.asarray(s.short_factor, dtype=np.float32)
    window, types = c.sliding_window, c.layer_types
    if window is not None or family.name == "phi3":
        meta[a + "attention.sliding_window"] = window or 0  # phi3: 0 is none (llama.cpp's)
    kinds = list(types) if types else ["sliding"] * c.n_layers
    if window is not None and kinds != period_types(c.n_layers, family.window_period or 10**9):
        meta[a + "attention.sliding_window_pattern"] = [t == "sliding" for t in kinds]
    if family.local_rope and c.rope_local_theta not in (None, family.gguf_local_theta):
        meta[a + "rope.freq_base_swa"] = float(c.rope_local_theta)
    if c.attn_scale is not None:
        meta[a + "attention.scale"] = float(c.attn_scale)
    return meta, tensors


def _read_back(family: Family, config: GPTConfig, fmt: str) -> GPTConfig:
    if fmt == "hf":
        return from_hf(family, to_hf(family, config), f"{family.title} config")
    if family.gguf_arch is None:
        raise LaminaError(f"the {family.title} family has no GGUF form")
    from lamina.interop import tensor_map  # the tensor names the file would hold

    meta, tensors = to_gguf(family, config)
    shapes = tensor_map.foreign_shapes(family, config, "gguf")
    present = {**shapes, **{n: t.shape for n, t in tensors.items()}}
    _, back, _ = from_gguf(
        family.gguf_arch, meta, present, config.tie_weights, tensors.__getitem__, family.title
    )
    return back


def expressing(config: GPTConfig, fmt: str) -> Family:
    """The family `config` is written as in `fmt` ("hf" or "gguf"): the first in table order
    that reads back the same config; else a LaminaError naming what the nearest family lacks."""
    want = canonical(config, fmt)
    nearest: tuple[int, str, list[str]] | None = None
    order = list(FAMILIES.values())
    if fmt == "gguf":  # the family it is written as in HF first (a Qwen2 stays qwen2)
        try:
            order.insert(0, expressing(config, "hf"))
        except LaminaError:
            pass
    for family in order:
        if fmt == "gguf" and family.gguf_arch is None:
            continue
        diff = [f"{k}={getattr(config, k)!r}" for k, v in family.fixed.items()
                if getattr(config, k) != v]  # fmt: skip
        if (
            "activation" not in family.fixed
            and config.activation not in family.activations.values()
        ):
            diff.append(f"activation={config.activation!r}")
        if not diff:
            try:
                diff = differences(want, canonical(_read_back(family, config, fmt), fmt))
            except LaminaError as e:
                diff = [str(e).split(": ", 1)[-1]]
            if not diff:
                return family
        if nearest is None or len(diff) < nearest[0]:
            nearest = (len(diff), family.title, diff)
    if nearest is None:
        raise LaminaError(f"no family lamina writes has a {fmt} form")
    what = "Hugging Face" if fmt == "hf" else "GGUF"
    raise LaminaError(
        f"cannot save as {what} {nearest[1]}: {', '.join(nearest[2][:3])} "
        f"(no family lamina writes has {'it' if len(nearest[2]) == 1 else 'them'})"
    )
