"""Optimizers: AdamW with decay on matrices only (or Muon for the blocks), their pickle-free state.

    param_groups(model, weight_decay, embed_lr_scale, head_lr_scale, muon)
        -> [{"params", "weight_decay", "lr_scale"(, "kind")}]: decay on >= 2-D weights only;
        the embedding tables and an untied head carry their lr multipliers ("lr_scale", which
        the loop applies); with muon, the blocks' matrices are kind "muon", the rest "adamw".
    Parameters come from `model.parameters()`, which yields a shared (tied) tensor once, so the
    token table that is also the LM head is decayed, and stepped, exactly once (as embedding).

    build_optimizer(model, lr, weight_decay, betas, optimizer="adamw"|"muon", ...) ->
    torch.optim.AdamW (fused where the installed torch supports it for the parameters'
    device, else the foreach/for-loop one), or `muon.MuonAdamW` over the groups above.

    optimizer_tensors(opt) -> (tensors, meta): per-parameter state as named tensors
    ("state.<i>.<name>") and the JSON-able rest (hyperparameters of each group, which state
    entries are tensors). `load_optimizer_tensors(opt, tensors, meta)` inverts it.

    make_optimizer(model, cfg, fused=None) -> the optimizer a resolved TrainConfig names

The learning-rate schedule and the time budget are in schedule.py.

Deliberately unaware of data, models beyond their parameters, and files.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lamina.cpu import fused_adamw
from lamina.errors import LaminaError
from lamina.training.config import TrainConfig

OPTIMIZERS = ("adamw", "muon")
OUTPUT_LAYERS = ("head", "classifier")  # a model's output projection, by attribute name


def _roles(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> "embed" (nn.Embedding tables) or "head" (an untied output layer)."""
    roles: dict[int, str] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            for p in module.parameters():
                roles[id(p)] = "embed"
    for name in OUTPUT_LAYERS:
        out = getattr(model, name, None)
        if isinstance(out, nn.Module):
            for p in out.parameters():
                roles.setdefault(id(p), "head")  # a tied head is the token table: "embed"
    return roles


def param_groups(
    model: nn.Module,
    weight_decay: float,
    *,
    embed_lr_scale: float = 1.0,
    head_lr_scale: float = 1.0,
    muon: bool = False,
) -> list[dict[str, Any]]:
    """Groups of (kind, weight decay, lr_scale); each tensor once, groups in first-seen order.

    Weight decay on >= 2-D tensors only. The embedding tables get `embed_lr_scale`, an untied
    output layer (`model.head` / `model.classifier`) `head_lr_scale`. With muon, the other 2-D
    matrices (the blocks' linears) are kind "muon", everything else kind "adamw"; without it
    there is no "kind" and, with both scales 1, the groups are the historical two.
    """
    roles = _roles(model)
    groups: dict[tuple[str, bool, float], list[nn.Parameter]] = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        role = roles.get(id(p), "body")
        scale = {"embed": embed_lr_scale, "head": head_lr_scale}.get(role, 1.0)
        kind = "muon" if muon and role == "body" and p.dim() == 2 else "adamw"
        groups.setdefault((kind, p.dim() >= 2, float(scale)), []).append(p)
    out = []
    for (kind, decayed, scale), params in groups.items():
        decay = weight_decay if decayed else 0.0
        g: dict[str, Any] = {"params": params, "weight_decay": decay, "lr_scale": scale}
        if muon:
            g["kind"] = kind
        out.append(g)
    return out


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    fused: bool | None = None,
    *,
    optimizer: str = "adamw",
    embed_lr_scale: float = 1.0,
    head_lr_scale: float = 1.0,
    ns_dtype: str = "fp32",
) -> torch.optim.Optimizer:
    """AdamW (fused=None tries the fused kernel, falls back quietly) or MuonAdamW."""
    if optimizer not in OPTIMIZERS:
        raise LaminaError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    scales = dict(embed_lr_scale=embed_lr_scale, head_lr_scale=head_lr_scale)
    if optimizer == "muon":
        from lamina.training.muon import MuonAdamW

        groups = param_groups(model, weight_decay, muon=True, **scales)
        if not any(g["kind"] == "muon" for g in groups):
            raise LaminaError(
                f"--optimizer muon: {type(model).__name__} has no 2-D weight matrices in its "
                "blocks for Muon to orthogonalize; use --optimizer adamw"
            )
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(ns_dtype)
        if dtype is None:
            raise LaminaError(f"muon_ns_dtype must be fp32 or bf16, got {ns_dtype!r}")
        return MuonAdamW(groups, lr=lr, betas=betas, ns_dtype=dtype)
    groups = param_groups(model, weight_decay, **scales)
    device = next((p.device.type for p in model.parameters()), "cpu")
    if fused or (fused is None and fused_adamw(device)):
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


def make_optimizer(
    model: nn.Module, cfg: TrainConfig, fused: bool | None = None
) -> torch.optim.Optimizer:
    """AdamW or MuonAdamW as `cfg` (resolved) says, with its per-group lr multipliers."""
    return build_optimizer(
        model,
        cfg.lr,
        cfg.weight_decay,
        (cfg.beta1, cfg.beta2),
        fused=fused,
        optimizer=cfg.optimizer or "adamw",
        embed_lr_scale=1.0 if cfg.embed_lr_scale is None else cfg.embed_lr_scale,
        head_lr_scale=1.0 if cfg.head_lr_scale is None else cfg.head_lr_scale,
        ns_dtype=cfg.muon_ns_dtype,
    )
