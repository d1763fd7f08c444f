"""Layer 6 configs: `GPTConfig` and `EncoderConfig`, validated dataclasses with JSON round trips.

Each field says what it is; `__post_init__` rejects bad values with a `LaminaError` that names
the field and the rule. `GPTConfig.preset(name, **overrides)` gives the named shapes. `from_dict`
fills fields that an older checkpoint lacks with their defaults and refuses unknown ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from lamina.block import ACTIVATIONS, Activation
from lamina.errors import LaminaError
from lamina.rope import RopeScaling
from lamina.validate import boolean as _bool
from lamina.validate import choice as _choice
from lamina.validate import fraction as _dropout
from lamina.validate import positive_int as _positive_int
from lamina.validate import positive_number

CONFIG_FORMAT = 1  # bumped when a saved config.json changes meaning


class _ConfigMixin:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):  # noqa: ANN206 - returns cls
        if not isinstance(data, dict):
            raise LaminaError(f"a {cls.__name__} must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        data = {k: v for k, v in data.items() if k not in ("format", "kind")}
        unknown = sorted(set(data) - names)
        if unknown:
            raise LaminaError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
        missing = [
            f.name
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise LaminaError(f"not a valid {cls.__name__}: it lacks {', '.join(missing)}")
        return cls(**data)

    def replace(self, **changes: Any):  # noqa: ANN201 - returns the same type
        names = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        unknown = sorted(set(changes) - names)
        if unknown:
            raise LaminaError(f"unknown {type(self).__name__} field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class GPTConfig(_ConfigMixin):
    """A decoder-only GPT (GPT-2 layout by default; Llama's layers as options)."""

    vocab_size: int  # rows of the token table and columns of the head
    block_size: int  # longest context; rows of the position table
    d_model: int  # residual stream width
    n_heads: int  # attention heads; must divide d_model
    n_layers: int  # Transformer blocks
    dropout: float = 0.0  # embedding, attention, residual and feed-forward dropout
    # dropout on the attention weights alone; None: `dropout`. 0 keeps SDPA's fused CPU kernel
    # while the other dropouts train (attention dropout takes it off that kernel)
    attn_dropout: float | None = None
    tie_weights: bool = True  # the head shares the token table (GPT-2 does)
    qkv_bias: bool = True  # bias on the fused QKV projection (GPT-2 has it)
    bias: bool = True  # bias on the other linear layers and LayerNorms' shift
    d_ff: int | None = None  # feed-forward hidden width; None means 4 * d_model
    # swiglu, geglu: gated, d_ff is the width of each of their two input projections (Llama's
    # convention); geglu gates with GELU's tanh approximation (Gemma); gelu is the tanh
    # approximation (GPT-2), gelu_exact the erf form (nanoGPT, BERT)
    activation: Activation = "gelu"
    norm_first: bool = True  # pre-LN blocks (GPT-2); False gives post-LN
    # rope: rotary positions inside attention (no position table)
    positions: Literal["learned", "sinusoidal", "rope"] = "learned"
    init_std: float = 0.02  # normal init; residual projections get / sqrt(2 * n_layers)
    layer_norm_eps: float = 1e-5  # epsilon of every norm (LayerNorm, RMSNorm, qk-norm)
    rope_theta: float = 10000.0  # rotary base (used with positions="rope")
    norm: Literal["layer", "rms"] = "layer"  # LayerNorm (GPT-2) or RMSNorm (Llama)
    norm_gain: bool = True  # learnable gains on the norms (False: plain normalisation)
    n_kv_heads: int | None = None  # key/value heads (grouped-query); None means n_heads
    qk_norm: bool = False  # RMS-normalise q and k per head before the dot product
    logit_softcap: float | None = None  # logits <- cap * tanh(logits / cap); None: off
    zero_init_proj: bool = False  # residual output projections start at zero
    d_head: int | None = None  # width of each head; None means d_model / n_heads (Qwen3: set)
    # rotary frequencies stretched for long contexts ("linear", "llama3", "longrope"); None:
    # plain RoPE
    rope_scaling: RopeScaling | None = None
    # query i sees keys j with i - sliding_window < j <= i (on the layers that slide)
    sliding_window: int | None = None
    # per layer "full" or "sliding"; None: every layer slides if sliding_window is set (Mistral)
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None  # rotary base of sliding layers, without rope_scaling
    attn_softcap: float | None = None  # attention scores <- cap * tanh(scores / cap)
    attn_scale: float | None = None  # the q.k multiplier; None: 1 / sqrt(head_dim)
    embed_scale: float | None = None  # token vectors times it (Gemma: sqrt(d_model))
    norm_offset: float = 0.0  # RMSNorm gains are (norm_offset + weight), in float32 (Gemma: 1)
    sandwich_norm: bool = False  # norms on attention and feed-forward outputs (Gemma 2/3)
    rotary_dim: int | None = None  # rotate only the first rotary_dim dims of a head (Phi-3)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "d_model", "n_heads", "n_layers"):
            _positive_int(name, getattr(self, name))
        if self.d_head is not None:
            _positive_int("d_head", self.d_head)
        elif self.d_model % self.n_heads:
            raise LaminaError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if isinstance(self.rope_scaling, dict):  # from JSON: the dataclass's own fields
            try:
                object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
            except TypeError as e:
                raise LaminaError(f"rope_scaling: {e}") from None
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise LaminaError(f"rope_scaling must be an object or null, got {self.rope_scaling!r}")
        _dropout("dropout", self.dropout)
        if self.attn_dropout is not None:
            _dropout("attn_dropout", self.attn_dropout)
        for name in ("tie_weights", "qkv_bias", "bias", "norm_first"):
            _bool(name, getattr(self, name))
        if self.d_ff is not None:
            _positive_int("d_ff", self.d_ff)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("positions", self.positions, ("learned", "sinusoidal", "rope"))
        positive_number("init_std", self.init_std)
        positive_number("layer_norm_eps", self.layer_norm_eps)  # inf refused, as NaN is
        positive_number("rope_theta", self.rope_theta)
        _choice("norm", self.norm, ("layer", "rms"))
        for name in ("norm_gain", "qk_norm", "zero_init_proj"):
            _bool(name, getattr(self, name))
        if self.n_kv_heads is not None:
            _positive_int("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                raise LaminaError(
                    f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}"
                )
        if self.positions == "rope" and self.rotary_dim is None and self.head_dim % 2:
            how = (
                f"d_head = {self.d_head}"
                if self.d_head
                else f"d_model / n_heads = {self.d_model} / {self.n_heads} = {self.head_dim}"
            )
            raise LaminaError(f"positions='rope' needs an even head dimension: {how}")
        if self.logit_softcap is not None:
            positive_number("logit_softcap", self.logit_softcap)
        self._check_layer_options()

    def _check_layer_options(self) -> None:
        """The options of Gemma, Phi-3 and Mistral layers (see their field comments)."""
        rope = self.positions == "rope"
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        if self.layer_types is not None:
            if isinstance(self.layer_types, (str, bytes)) or not hasattr(
                self.layer_types, "__iter__"
            ):
                raise LaminaError(f"layer_types must be a list, got {self.layer_types!r}")
            kinds = tuple(self.layer_types)  # a JSON list becomes a tuple
            object.__setattr__(self, "layer_types", kinds)
            for kind in kinds:
                _choice("layer_types entry", kind, ("full", "sliding"))
            if len(kinds) != self.n_layers:
                raise LaminaError(
                    f"layer_types has {len(kinds)} entries for n_layers={self.n_layers}"
                )
            if "sliding" in kinds and self.sliding_window is None:
                raise LaminaError("layer_types has 'sliding' layers but sliding_window is null")
        for name in ("rope_local_theta", "rotary_dim"):
            if getattr(self, name) is not None and not rope:
                raise LaminaError(f"{name} needs positions='rope', got {self.positions!r}")
        if self.rope_local_theta is not None:
            positive_number("rope_local_theta", self.rope_local_theta)
        for name in ("attn_softcap", "attn_scale", "embed_scale"):
            if getattr(self, name) is not None:
                positive_number(name, getattr(self, name))
        offset = self.norm_offset
        if isinstance(offset, bool) or not isinstance(offset, (int, float)) or offset != offset:
            raise LaminaError(f"norm_offset must be a number, got {offset!r}")
        if offset and self.norm != "rms":
            raise LaminaError(f"norm_offset needs norm='rms', got norm={self.norm!r}")
        _bool("sandwich_norm", self.sandwich_norm)
        if self.sandwich_norm and not self.norm_first:
            raise LaminaError("sandwich_norm needs pre-LN blocks (norm_first=true)")
        if self.rotary_dim is not None:
            _positive_int("rotary_dim", self.rotary_dim)
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise LaminaError(
                    f"rotary_dim must be even and at most head_dim={self.head_dim}, "
                    f"got {self.rotary_dim}"
                )
        s = self.rope_scaling
        if s is not None and s.kind == "longrope" and 2 * len(s.short_factor) != self.rope_dim:
            raise LaminaError(
                f"rope_scaling longrope factors number {len(s.short_factor)}; a rotated width "
                f"of {self.rope_dim} needs {self.rope_dim // 2}"
            )

    @property
    def head_dim(self) -> int:
        """Width of each head: d_head, or d_model / n_heads when that is None."""
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def rope_dim(self) -> int:
        """Dims of each head that rotate: rotary_dim, or head_dim when that is None."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def attention_kinds(self) -> tuple[str, ...]:
        """Each layer's attention, "full" or "sliding": layer_types, else every layer slides
        when sliding_window is set, else none does."""
        if self.layer_types is not None:
            return self.layer_types
        return ("sliding" if self.sliding_window is not None else "full",) * self.n_layers

    @property
    def gated(self) -> bool:
        """Whether the feed-forward input is [gate | up], 2 d_ff wide (swiglu, geglu)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named shape (see `GPT_PRESETS`), with any field overridden."""
        if name not in GPT_PRESETS:
            raise LaminaError(f"unknown preset {name!r}; choose from {', '.join(GPT_PRESETS)}")
        base = cls(**GPT_PRESETS[name])
        return base.replace(**overrides) if overrides else base


GPT_PRESETS: dict[str, dict[str, Any]] = {
    # the seed notebook's TINY: for tests and checks
    "tiny": dict(vocab_size=100, block_size=32, d_model=32, n_heads=4, n_layers=2),
    # nanoGPT's CPU recipe for characters
    "char-cpu": dict(vocab_size=65, block_size=64, d_model=128, n_heads=4, n_layers=4),
    # nanoGPT's "baby GPT" for Shakespeare characters
    "baby": dict(vocab_size=65, block_size=256, d_model=384, n_heads=6, n_layers=6, dropout=0.2),
    # Llama's layers at char-cpu's width: RoPE, RMSNorm, SwiGLU (d_ff ~ 8/3 d), 2 KV heads for
    # 4 query heads, no biases, untied head
    "llama-tiny": dict(
        vocab_size=65,
        block_size=64,
        d_model=128,
        n_heads=4,
        n_layers=4,
        n_kv_heads=2,
        d_ff=352,
        positions="rope",
        norm="rms",
        activation="swiglu",
        qkv_bias=False,
        bias=False,
        tie_weights=False,
    ),
    # HuggingFaceTB/SmolLM-135M's published config.json (a Llama): 134,515,008 parameters with
    # its tied head, the "135M" of its name; transformers' LlamaForCausalLM(config)
    # .num_parameters() gives the same (a test builds both on the meta device)
    "smollm-135m": dict(
        vocab_size=49152,
        block_size=2048,
        d_model=576,
        n_heads=9,
        n_layers=30,
        n_kv_heads=3,
        d_ff=1536,
        positions="rope",
        norm="rms",
        activation="swiglu",
        qkv_bias=False,
        bias=False,
        tie_weights=True,
        rope_theta=10000.0,
    ),
    # OpenAI's GPT-2 family as Hugging Face ships it
    "gpt2-small": dict(
        vocab_size=50257, block_size=1024, d_model=768, n_heads=12, n_layers=12, dropout=0.1
    ),
    "gpt2-medium": dict(
        vocab_size=50257, block_size=1024, d_model=1024, n_heads=16, n_layers=24, dropout=0.1
    ),
    "gpt2-large": dict(
        vocab_size=50257, block_size=1024, d_model=1280, n_heads=20, n_layers=36, dropout=0.1
    ),
    "gpt2-xl": dict(
        vocab_size=50257, block_size=1024, d_model=1600, n_heads=25, n_layers=48, dropout=0.1
    ),
}


@dataclass(frozen=True)
class EncoderConfig(_ConfigMixin):
    """A Transformer encoder in the 2017 layout (post-LN by default), as in the seed encoder."""

    vocab_size: int  # token table rows; id `pad_id` is padding with a zero row
    max_len: int  # longest sequence (rows of the sinusoidal table)
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 128  # feed-forward hidden width
    n_layers: int = 2
    dropout: float = 0.1
    norm_first: bool = False  # post-LN (2017); True gives pre-LN with a final norm
    activation: Literal["gelu", "relu"] = "relu"
    pad_id: int = 0
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"  # the 2017 table, or BERT's

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_heads", "d_ff", "n_layers"):
            _positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise LaminaError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        _dropout("dropout", self.dropout)
        _bool("norm_first", self.norm_first)
        _choice("activation", self.activation, ("gelu", "relu"))
        _choice("positions", self.positions, ("sinusoidal", "learned"))
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int):
            raise LaminaError(f"pad_id must be an integer, got {self.pad_id!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise LaminaError(
                f"pad_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_id}"
            )
