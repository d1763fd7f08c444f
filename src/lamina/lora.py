"""LoRA: low-rank adapters on a GPT's linear layers, a model transform like quantization.

    apply_lora(model, LoRAConfig(r=8, alpha=16, dropout=0.05, targets="all")) -> the same GPT,
        its targeted linears wrapped in LoRALinear, every other parameter frozen
    merge_lora(model) -> the same GPT with plain linears again, W <- W + scaling * B A
    lora_state_dict(model) -> only the adapter tensors; lora_config(model) -> what they are
    load_lora_state(model, state) -> puts saved adapters into a model that apply_lora prepared
    (sizes by formula, for the memory check: lamina.lora_size)

A LoRALinear keeps its base linear (float nn.Linear, or int8/int4 from quant: QLoRA-style, the
base stays quantized) frozen and adds, on each adapted *segment* of its output,

    y[seg] += scaling * dropout(x) @ A_seg^T @ B_seg^T    A (r, in), B (width, r), scaling = alpha / r

A starts Kaiming-uniform (as nn.Linear's weight) and B at zero, so step 0 is the base exactly.
Segments exist because lamina fuses what other libraries keep apart: `attn.qkv` is [q | k | v]
(widths H hd, H_kv hd, H_kv hd: grouped-query heads make k and v narrower than q) and, with
SwiGLU, `ff.fc` is [gate | up]. Each segment gets its own A and B, so an adapter on q alone, or
on q and v (litgpt's default), is what it would be on a separate q projection, and converts to
Hugging Face PEFT's separate q_proj / k_proj / v_proj adapters one to one.

Target names (one per segment kind): q k v o (attention out), gate up (SwiGLU) or fc (other
feed-forwards), down (feed-forward out), head (an untied LM head only: a tied head is the token
table, which merging would change too). Presets: "qv", "attn" (q k v o), "mlp" (gate up fc
down), "all" (attn + mlp). A target the model does not have (gate on a GELU model) is skipped;
a list naming nothing the model has is refused.

Over a quantized base, gradients reach the input through the dequantized matmul
(`frozen_linear`: the weights dequantized in the forward and again in the backward, never kept
in float between them); the quantized linears no adapter wraps (a tied head, an untargeted
projection) are wrapped in FrozenLinear for that, and unwrapped by merge_lora.

Deliberately unaware of files, tokenizers, optimizers and training loops (the model's
`lora_parameters` are what an optimizer gets); it never imports quant: a quantized base is
anything with `dequantized(dtype)`, rebuilt through its own `from_linear` on merge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lamina.errors import LaminaError
from lamina.frozen_linear import FrozenLinear, frozen_linear
from lamina.models.gpt import GPT
from lamina.validate import fraction, positive_int, positive_number

TARGETS = ("q", "k", "v", "o", "gate", "up", "fc", "down", "head")
PRESETS: dict[str, tuple[str, ...]] = {
    "qv": ("q", "v"),
    "attn": ("q", "k", "v", "o"),
    "mlp": ("gate", "up", "fc", "down"),
    "all": ("q", "k", "v", "o", "gate", "up", "fc", "down"),
}
DEFAULT_TARGETS = "all"


def parse_targets(spec: str | Iterable[str]) -> tuple[str, ...]:
    """A preset name, or target names (a list, or one comma-separated string), in TARGETS order."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: set[str] = set()
    for item in (str(i).strip() for i in items):
        if item in PRESETS:
            names.update(PRESETS[item])
        elif item in TARGETS:
            names.add(item)
        else:
            raise LaminaError(
                f"unknown LoRA target {item!r}; choose presets {', '.join(PRESETS)} "
                f"or names {', '.join(TARGETS)} (comma-separated)"
            )
    if not names:
        raise LaminaError("LoRA targets are empty; name a preset or at least one target")
    return tuple(t for t in TARGETS if t in names)


@dataclass(frozen=True)
class LoRAConfig:
    """What a model's adapters are; saved beside them so loading knows what it holds."""

    r: int = 8  # rank of each adapter (A is r x in, B is out x r)
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.05  # dropout on the adapters' input, training mode only
    targets: tuple[str, ...] = PRESETS[DEFAULT_TARGETS]  # segment kinds adapted (see TARGETS)

    def __post_init__(self) -> None:
        positive_int("lora r", self.r)
        positive_number("lora alpha", self.alpha)
        fraction("lora dropout", self.dropout)
        object.__setattr__(self, "targets", parse_targets(self.targets))
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "dropout", float(self.dropout))

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"targets": list(self.targets)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "LoRA config") -> LoRAConfig:
        if not isinstance(data, dict):
            raise LaminaError(f"{where} must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {"r", "alpha", "dropout", "targets"})
        if unknown:
            raise LaminaError(f"{where}: unknown field(s) {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as e:
            raise LaminaError(f"{where}: {e}") from e


def _float_reference(base: nn.Module) -> Tensor:
    weight = getattr(base, "weight", None)
    if isinstance(weight, Tensor):
        return weight
    return next(t for t in [*base.parameters(), *base.buffers()] if t.is_floating_point())


def is_quantized(base: nn.Module) -> bool:
    return not isinstance(base, nn.Linear) and hasattr(base, "dequantized")


class LoRALinear(nn.Module):
    """A frozen base linear plus a low-rank update on each adapted segment of its output.

    segments: (name, width) in output order, widths summing to the base's out_features;
    adapted: the names that get an A and a B.
    """

    def __init__(
        self,
        base: nn.Module,
        segments: Sequence[tuple[str, int]],
        adapted: Sequence[str],
        config: LoRAConfig,
    ) -> None:
        super().__init__()
        if sum(w for _, w in segments) != base.out_features:
            raise LaminaError(f"segments {segments} do not add up to {base.out_features} outputs")
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.segments = tuple((str(n), int(w)) for n, w in segments)
        self.r, self.scaling = config.r, config.scaling
        self.drop = nn.Dropout(config.dropout) if config.dropout else nn.Identity()
        ref = _float_reference(base)
        kw = {"device": ref.device, "dtype": ref.dtype}
        widths = dict(self.segments)
        self.lora_A = nn.ParameterDict(
            {n: nn.Parameter(torch.empty(config.r, self.in_features, **kw)) for n in adapted}
        )
        self.lora_B = nn.ParameterDict(
            {n: nn.Parameter(torch.zeros(widths[n], config.r, **kw)) for n in adapted}
        )
        for p in base.parameters():
            p.requires_grad_(False)
        self.reset_adapters()

    def reset_adapters(self) -> None:
        """A as nn.Linear's default init (Kaiming uniform, a = sqrt 5), B zero: no change."""
        for name, a in self.lora_A.items():
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B[name])

    @property
    def weight(self) -> Tensor:
        """The base's weight (float bases only): what code reading `.weight` expects."""
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def _base(self, x: Tensor) -> Tensor:
        if is_quantized(self.base) and torch.is_grad_enabled():
            return frozen_linear(x, self.base)
        w = getattr(self.base, "weight", x)  # a float base held in bf16 (lora_option.hold_base)
        if w.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
            return self.base(x.to(w.dtype)).to(x.dtype)
        return self.base(x)

    def _factors(self) -> tuple[Tensor, Tensor]:
        """(A, scaling B) of the whole output: the adapted segments' A stacked (n r, in), their
        B block-diagonal (out, n r), zero rows where a segment is not adapted. One matmul pair
        then updates every segment: no split of the output and no concatenation back."""
        if len(self.lora_A) == 1 and len(self.segments) == 1:
            (name,) = self.lora_A
            return self.lora_A[name], self.lora_B[name] * self.scaling
        a = torch.cat([self.lora_A[n] for n, _ in self.segments if n in self.lora_A])
        blocks = [
            self.lora_B[n] if n in self.lora_B else a.new_zeros(w, 0) for n, w in self.segments
        ]
        return a, torch.block_diag(*blocks) * self.scaling

    def _down(self, x: Tensor, a: Tensor) -> Tensor:
        return self.drop(x).to(a.dtype) @ a.T

    def forward(self, x: Tensor) -> Tensor:
        y = self._base(x)
        if not self.lora_A:
            return y
        a, b = self._factors()
        if isinstance(self.drop, nn.Dropout) and self.training and torch.is_grad_enabled():
            # the dropout and A's product recomputed in the backward (the same mask: the RNG
            # state is kept): the backward keeps x alone, not the dropped copy and its mask
            down = checkpoint(self._down, x, a, use_reentrant=False, preserve_rng_state=True)
        else:
            down = self._down(x, a)
        return y + (down @ b.T).to(y.dtype)

    def delta_weight(self) -> Tensor:
        """scaling * B A for every segment (zeros where not adapted): (out, in), float32."""
        a, b = self._factors()
        return b.float() @ a.float()

    def merged(self) -> nn.Module:
        """A module without adapters computing the same function (requantized if the base was)."""
        with torch.no_grad():
            if is_quantized(self.base):
                w = self.base.dequantized(torch.float32) + self.delta_weight()
            else:
                w = (self.base.weight.float() + self.delta_weight()).to(self.base.weight.dtype)
            bias = self.base.bias
            plain = nn.Linear(
                self.in_features, self.out_features, bias=bias is not None, device=w.device
            ).to(w.dtype)
            plain.weight.copy_(w)
            if bias is not None:
                plain.bias.copy_(bias)
        if is_quantized(self.base):
            group = getattr(self.base, "group_size", None)
            args = () if group is None else (group,)
            return type(self.base).from_linear(plain, *args)
        return plain

    def extra_repr(self) -> str:
        adapted = ",".join(self.lora_A) or "none"
        return f"r={self.r}, scaling={self.scaling:g}, adapted={adapted}"


def _segments(model: GPT) -> list[tuple[str, nn.Module, str, list[tuple[str, int]]]]:
    """(path, parent, attribute, segments) of every linear LoRA may wrap, in model order."""
    c = model.config
    hd, f = c.head_dim, c.ff_width
    qkv = [("q", c.n_heads * hd), ("k", c.kv_heads * hd), ("v", c.kv_heads * hd)]
    fc = [("gate", f), ("up", f)] if c.gated else [("fc", f)]
    out = []
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}."
        out += [
            (p + "attn.qkv", block.attn, "qkv", qkv),
            (p + "attn.proj", block.attn, "proj", [("o", c.d_model)]),
            (p + "ff.fc", block.ff, "fc", fc),
            (p + "ff.proj", block.ff, "proj", [("down", c.d_model)]),
        ]
    out.append(("head", model, "head", [("head", c.vocab_size)]))
    return out


def lora_config(model: nn.Module) -> LoRAConfig | None:
    """The LoRAConfig apply_lora recorded on the model; None for a model without adapters."""
    return getattr(model, "lora", None)


def apply_lora(model: GPT, config: LoRAConfig | None = None, **fields: Any) -> GPT:
    """Wrap the targeted linears of `model` in LoRALinear, in place, and freeze everything else.

    Pass a LoRAConfig or its fields (r=, alpha=, dropout=, targets=). Returns the model, with
    `model.lora` recording the config. Works over a float or an int8/int4 quantized GPT.
    """
    if not isinstance(model, GPT):
        raise LaminaError(f"apply_lora needs a lamina GPT, got {type(model).__name__}")
    if lora_config(model) is not None:
        raise LaminaError("this model already has LoRA adapters; merge them first")
    if config is not None and fields:
        raise LaminaError("give apply_lora a LoRAConfig or its fields, not both")
    config = config if config is not None else LoRAConfig(**fields)
    wanted = set(config.targets)
    if "head" in wanted and model.config.tie_weights:
        raise LaminaError(
            "LoRA target 'head' needs an untied head: this model's head is its token table"
        )
    plan = []
    for _, parent, attr, segs in _segments(model):
        adapted = [n for n, _ in segs if n in wanted]
        if adapted:
            plan.append((parent, attr, segs, adapted))
    if not plan:
        raise LaminaError(f"no linear of this model matches LoRA targets {','.join(wanted)}")
    for p in model.parameters():
        p.requires_grad_(False)
    for parent, attr, segs, adapted in plan:
        wrapped = LoRALinear(getattr(parent, attr), segs, adapted, config)
        setattr(parent, attr, wrapped.train(parent.training))  # the model's mode, not train()
    for _, parent, attr, _ in _segments(model):  # the other quantized linears pass gradients
        if is_quantized(getattr(parent, attr)):
            setattr(parent, attr, FrozenLinear(getattr(parent, attr)))
    model.lora = config
    return model


def _frozen(model: nn.Module) -> list[tuple[str, FrozenLinear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FrozenLinear)]


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' A and B tensors: the only parameters a LoRA run optimizes."""
    return [p for m in lora_modules(model).values() for p in m.parameters() if p.requires_grad]


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapters, by model path: "blocks.0.attn.qkv.lora_A.q" (r, in), "...lora_B.q"."""
    state = {}
    for path, m in lora_modules(model).items():
        for kind in ("lora_A", "lora_B"):
            for seg, t in getattr(m, kind).items():
                state[f"{path}.{kind}.{seg}"] = t.detach().cpu().contiguous()
    return state


def load_lora_state(model: nn.Module, state: dict[str, Tensor], where: str = "adapters") -> None:
    """Copy saved adapters into a model prepared by apply_lora (same config): keys and shapes
    must match exactly."""
    ours = lora_state_dict(model)
    missing, unexpected = sorted(set(ours) - set(state)), sorted(set(state) - set(ours))
    if missing or unexpected:
        parts = [f"missing {', '.join(missing[:3])}"] if missing else []
        parts += [f"unexpected {', '.join(unexpected[:3])}"] if unexpected else []
        raise LaminaError(f"{where} do not match the model's LoRA layout: {'; '.join(parts)}")
    modules = lora_modules(model)
    with torch.no_grad():
        for key, value in state.items():
            path, kind, seg = key.rsplit(".", 2)
            target = getattr(modules[path], kind)[seg]
            if tuple(value.shape) != tuple(target.shape):
                raise LaminaError(
                    f"{where}: {key} has shape {tuple(value.shape)}, the model expects "
                    f"{tuple(target.shape)}"
                )
            target.copy_(value)


def merge_lora(model: GPT) -> GPT:
    """Fold every adapter into its base (W + scaling B A) and give plain linears back, in place.

    A quantized base is requantized after the merge (lossy); merge into a float base where the
    result must be exact. The model's parameters become trainable again as before apply_lora
    only for float models (a quantized model has no gradients).
    """
    if lora_config(model) is None:
        raise LaminaError("this model has no LoRA adapters to merge")
    for path, m in [*lora_modules(model).items(), *_frozen(model)]:
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, attr, m.base if isinstance(m, FrozenLinear) else m.merged())
    del model.lora
    if getattr(model, "quantization", None) is None:
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
    return model
