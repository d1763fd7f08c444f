"""AdamW with weight decay on matrices only, and its state as safetensors + JSON (no pickle).

    param_groups(model, weight_decay) -> [{"params": >= 2-D weights, "weight_decay": wd},
                                          {"params": biases, norms (1-D), "weight_decay": 0}]
    Parameters come from `model.parameters()`, which yields a shared (tied) tensor once, so the
    token table that is also the LM head is decayed, and stepped, exactly once.

    build_optimizer(model, lr, weight_decay, betas) -> torch.optim.AdamW (fused where the
    installed torch supports it for the parameters' device, else the foreach/for-loop one).

    optimizer_tensors(opt) -> (tensors, meta): per-parameter state as named tensors
    ("state.<i>.<name>") and the JSON-able rest (hyperparameters of each group, which state
    entries are tensors). `load_optimizer_tensors(opt, tensors, meta)` inverts it.

Deliberately unaware of schedules, data and files.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lamina.errors import LaminaError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed (dim >= 2) and not decayed (dim < 2); each tensor appears once."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over `param_groups`; fused=None tries the fused kernel and falls back quietly."""
    groups = param_groups(model, weight_decay)
    if fused is not False:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError, ValueError):
            if fused:
                raise
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split `opt.state_dict()` into safetensors-ready tensors and JSON-able metadata."""
    sd = opt.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(index), {})[name] = value
    groups = []
    for g in sd["param_groups"]:
        groups.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()})
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict[str, Any]
) -> None:
    """Restore what `optimizer_tensors` wrote; a mismatch in shape or count is a LaminaError."""
    if not isinstance(meta, dict) or "param_groups" not in meta:
        raise LaminaError("optimizer metadata has no 'param_groups'")
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise LaminaError(f"unexpected optimizer tensor {key!r}")
        state.setdefault(int(parts[1]), {})[parts[2]] = value
    for index, extra in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(extra)
    groups = []
    for g in meta["param_groups"]:
        groups.append({k: (tuple(v) if k == "betas" else v) for k, v in g.items()})
    current = opt.state_dict()["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in current]:
        raise LaminaError("saved optimizer state does not match the model's parameter groups")
    params = [p for g in opt.param_groups for p in g["params"]]
    for index, st in state.items():
        if index >= len(params):
            raise LaminaError(f"optimizer state for parameter {index}, the model has {len(params)}")
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st and tuple(st[name].shape) != tuple(params[index].shape):
                raise LaminaError(
                    f"optimizer state {name} of parameter {index} has shape "
                    f"{tuple(st[name].shape)}, the parameter {tuple(params[index].shape)}"
                )
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as exc:
        raise LaminaError(f"cannot restore the optimizer state: {exc}") from exc
