"""LoRA adapters on disk: lamina's own adapter file, and Hugging Face PEFT adapter folders.

    save_adapters(model, path)            one safetensors file: lora_state_dict(model), with the
                                          LoRAConfig as JSON in its metadata ("lora")
    load_adapters(model, path) -> model   apply_lora with the saved config, then the tensors
    export_peft(model, folder, base)      adapter_config.json + adapter_model.safetensors, what
                                          peft.PeftModel.from_pretrained(hf_base, folder) loads
    import_peft(model, folder) -> model   the reverse: a PEFT LoRA folder onto a lamina GPT

A LoRA folder (what a LoRA run saves: the adapters and a reference to the base, never the
base's weights):

    save_lora_folder(folder, model, base)  config.json {"kind": "lora", "lora": {...}, "base":
                                          {"kind", "path", "sha256"}, "model": the base's
                                          config} + adapters.safetensors
    read_lora_folder(folder) -> (LoRAConfig, base record, tensors);  is_lora_folder(path)
    base_path(record, folder) -> Path     the base it names (a relative path: beside folder)
    check_base(record, origin)            refused where its sha256 (the bundle Origin's content
                                          hash: bytes only, so a renamed copy passes) changed
                                          since the adapters were trained
The base record is the base bundle's `Origin.to_dict()` ({"kind", "path", "sha256"});
`lamina.open(folder)` (interop.bundle) opens the base, checks it and applies the adapters.

PEFT names come from the family table (hf_family.hf_rows: the family the base is written as):
lamina's fused
`attn.qkv` adapters "q", "k", "v" are PEFT's separate `self_attn.{q,k,v}_proj` adapters, and
`ff.fc`'s "gate", "up" are `mlp.{gate,up}_proj`; a key reads
`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (A is (r, in), B (out, r),
both sides nn.Linear, so nothing is transposed). PEFT's scaling is lora_alpha / r as lamina's.
Only families that keep q, k, v and gate, up apart export (Llama, Mistral, Qwen, Gemma; not
Phi-3's fused qkv_proj, nor GPT-2); the rest is refused, naming why. Refused on
import, in one line: rsLoRA, DoRA, per-layer rank or alpha patterns, layer subsets, biases,
regex target_modules, modules_to_save, and targets lamina has no segment for.
Deliberately unaware of training and of the peft package (never imported).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lamina.checkpoint import load_tensors, save_tensors, unwrap
from lamina.errors import LaminaError
from lamina.files import loads_json, read_json, write_json
from lamina.interop.hf_config import check_peft_config
from lamina.interop.hf_family import hf_rows
from lamina.lora import LoRAConfig, apply_lora, load_lora_state, lora_config, lora_state_dict
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT

PEFT_PREFIX = "base_model.model."
# lamina target -> the module name PEFT's target_modules uses for it in a Llama
HF_MODULES = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
    "head": "lm_head",
}
# lamina linear (inside a block, or the head) -> its segments in output order
_SEGMENTS: dict[str, tuple[str, ...]] = {
    "attn.qkv": ("q", "k", "v"),
    "attn.proj": ("o",),
    "ff.fc": ("gate", "up"),
    "ff.proj": ("down",),
    "head": ("head",),
}


def _gpt(model: nn.Module, what: str) -> GPT:
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"{what} needs a lamina GPT, got {type(inner).__name__}")
    return inner


def peft_names(config: GPTConfig) -> dict[str, str]:
    """lamina adapter key ("blocks.0.attn.qkv.lora_A.q") -> PEFT key, for every segment."""
    family, table = hf_rows(config)
    qkv = next((r for r in table if r.lamina.endswith("attn.qkv.weight")), None)
    if family.name == "gpt2" or qkv is None or len(qkv.parts) != 3:
        raise LaminaError(
            f"PEFT adapters of a {family.title} model: lamina writes them for families that keep "
            "q_proj, k_proj and v_proj apart (Llama, Mistral, Qwen, Gemma)"
        )
    out = {}
    for row in table:
        ours, hf_names = row.lamina, [p.foreign for p in row.parts]
        path, _, kind = ours.rpartition(".")
        if kind != "weight" or path in ("embed.wte", "norm_f") or "norm" in path:
            continue
        segments = _SEGMENTS[path if path == "head" else path.split(".", 2)[2]]
        for seg, hf in zip(segments, hf_names, strict=True):
            module = PEFT_PREFIX + hf.removesuffix(".weight")
            for ab in ("lora_A", "lora_B"):
                out[f"{path}.{ab}.{seg}"] = f"{module}.{ab}.weight"
    return out


def save_adapters(model: nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write the adapters (only) and their LoRAConfig to one safetensors file, atomically."""
    inner = _gpt(model, "save_adapters")
    config = lora_config(inner)
    if config is None:
        raise LaminaError("this model has no LoRA adapters to save")
    meta = {"format": "pt", "lora": json.dumps(config.to_dict())}
    save_tensors(path, lora_state_dict(inner), meta)
    return Path(path)


def read_adapters(path: str | os.PathLike[str]) -> tuple[LoRAConfig, dict[str, Tensor]]:
    """The LoRAConfig and tensors of an adapter file written by save_adapters."""
    from safetensors import safe_open

    p = Path(path)
    tensors = load_tensors(p)
    with safe_open(str(p), framework="pt") as f:
        meta = f.metadata() or {}
    if "lora" not in meta:
        raise LaminaError(f"{p} holds no LoRA config (metadata 'lora'): not a lamina adapter file")
    try:
        data = loads_json(meta["lora"], f"{p} LoRA config")
    except json.JSONDecodeError as e:
        raise LaminaError(f"{p}: its LoRA config is not valid JSON ({e})") from e
    return LoRAConfig.from_dict(data, f"{p} LoRA config"), tensors


def load_adapters(model: nn.Module, path: str | os.PathLike[str]) -> GPT:
    """Apply the saved LoRA config to `model` and load the saved adapters into it."""
    inner = _gpt(model, "load_adapters")
    config, tensors = read_adapters(path)
    apply_lora(inner, config)
    load_lora_state(inner, tensors, str(path))
    return inner


def _peft_config(config: LoRAConfig, base: str, targets: list[str]) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }


def export_peft(model: nn.Module, folder: str | os.PathLike[str], base_name_or_path: str) -> Path:
    """Write a Hugging Face PEFT LoRA adapter folder for the transformers Llama of `model`'s base.

    base_name_or_path: what adapter_config.json names as the base (a hub id or a folder).
    """
    inner = _gpt(model, "export_peft")
    config = lora_config(inner)
    if config is None:
        raise LaminaError("this model has no LoRA adapters to export")
    names = peft_names(inner.config)  # refuses families PEFT names cannot reach
    state = lora_state_dict(inner)
    tensors = {names[k]: v for k, v in state.items()}
    adapted = {k.rsplit(".", 1)[1] for k in state}
    targets = [HF_MODULES[t] for t in config.targets if t in adapted]
    d = Path(folder)
    if d.exists() and not d.is_dir():
        raise LaminaError(f"{d} is a file; a PEFT adapter is a folder")
    d.mkdir(parents=True, exist_ok=True)
    save_tensors(d / "adapter_model.safetensors", tensors, {"format": "pt"})
    write_json(d / "adapter_config.json", _peft_config(config, base_name_or_path, targets))
    return d


def _lora_config_from_peft(data: Any, where: str) -> LoRAConfig:
    if not isinstance(data, dict) or data.get("peft_type") != "LORA":
        got = data.get("peft_type") if isinstance(data, dict) else type(data).__name__
        raise LaminaError(f"{where}: peft_type is {got!r}; lamina reads LORA adapters only")
    data = check_peft_config(data, where)  # every field its type and range
    refused = [
        (data.get("use_rslora", False), "use_rslora=true"),
        (data.get("use_dora", False), "use_dora=true"),
        (data.get("rank_pattern") or data.get("alpha_pattern"), "rank or alpha patterns"),
        (data.get("layers_to_transform") is not None, "layers_to_transform"),
        (data.get("bias", "none") != "none", f"bias={data.get('bias')!r}"),
        (data.get("fan_in_fan_out", False), "fan_in_fan_out=true"),
        (data.get("modules_to_save"), "modules_to_save"),
        (not isinstance(data.get("target_modules"), list), "target_modules that is not a list"),
    ]
    for bad, what in refused:
        if bad:
            raise LaminaError(f"{where}: lamina's LoRA cannot express {what}")
    back = {hf: ours for ours, hf in HF_MODULES.items()}
    unknown = [t for t in data["target_modules"] if t not in back]
    if unknown:
        raise LaminaError(f"{where}: target_modules {unknown} have no lamina LoRA target")
    return LoRAConfig(
        r=data.get("r", 8),
        alpha=data.get("lora_alpha", 8),
        dropout=data.get("lora_dropout", 0.0),
        targets=tuple(back[t] for t in data["target_modules"]),
    )


def import_peft(model: nn.Module, folder: str | os.PathLike[str]) -> GPT:
    """Apply a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors)."""
    inner = _gpt(model, "import_peft")
    d = Path(folder)
    config = _lora_config_from_peft(read_json(d / "adapter_config.json"), str(d))
    tensors = load_tensors(d / "adapter_model.safetensors")
    back = {hf: ours for ours, hf in peft_names(inner.config).items()}
    # PEFT files may keep the adapter name in the key ("lora_A.default.weight")
    tensors = {k.replace(".default.weight", ".weight"): v for k, v in tensors.items()}
    unknown = sorted(set(tensors) - set(back))
    if unknown:
        raise LaminaError(f"{d}: adapter tensors lamina does not know: {', '.join(unknown[:3])}")
    apply_lora(inner, config)
    load_lora_state(inner, {back[k]: v for k, v in tensors.items()}, str(d))
    return inner


LORA_KIND = "lora"
LORA_FORMAT = 1
ADAPTERS_FILE = "adapters.safetensors"


def check_base(record: Any, origin: Any, where: str = "LoRA folder") -> None:
    """Refuse a base whose bytes changed since the adapters were trained.

    record: the folder's "base" ({"kind", "path", "sha256"}: a bundle Origin's to_dict());
    origin: the Origin of the base as opened now.
    """
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        raise LaminaError(f"{where}: 'base' must be an object with 'path' and 'sha256'")
    if record["sha256"] not in (origin.content_hash, origin.legacy_hash):  # names: older runs
        raise LaminaError(
            f"{where}: its base model {record.get('path')} changed since the adapters were "
            f"trained (sha256 {origin.content_hash[:12]}... != {record['sha256'][:12]}...); "
            "the adapters fit only the original"
        )


def base_path(record: Any, folder: str | os.PathLike[str] = "LoRA folder") -> Path:
    """The base model a LoRA folder's record names (it must still exist); a relative path is
    taken beside the folder, never against the working directory."""
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        raise LaminaError(f"{folder}: 'base' must be an object with 'path' and 'sha256'")
    p = Path(folder) / Path(record["path"]).expanduser()  # an absolute path stays as it is
    if not p.exists():
        raise LaminaError(f"{folder}: its base model {record['path']} is missing (looked for {p})")
    return p


def is_lora_folder(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / ADAPTERS_FILE).is_file():
        return False
    try:
        data = loads_json((p / "config.json").read_text(encoding="utf-8"), str(p))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == LORA_KIND


def save_lora_folder(
    folder: str | os.PathLike[str], model: nn.Module, base: dict[str, Any]
) -> Path:
    """Write the adapters and the base reference into `folder` (each file atomically)."""
    inner = _gpt(model, "save_lora_folder")
    config = lora_config(inner)
    if config is None:
        raise LaminaError("this model has no LoRA adapters to save")
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    save_adapters(inner, d / ADAPTERS_FILE)
    write_json(
        d / "config.json",
        {
            "format": LORA_FORMAT,
            "kind": LORA_KIND,
            "lora": config.to_dict(),
            "base": base,
            "model": inner.config.to_dict(),  # the base's shape, for reading (and resumes)
        },
    )
    return d


def read_lora_folder(
    folder: str | os.PathLike[str],
) -> tuple[LoRAConfig, dict[str, str], dict[str, Tensor]]:
    """The adapters' config, the base record (not yet checked: see check_base), the tensors."""
    d = Path(folder)
    data = read_json(d / "config.json")
    if not isinstance(data, dict) or data.get("kind") != LORA_KIND:
        raise LaminaError(f"{d} is not a LoRA folder (config.json kind is not 'lora')")
    if data.get("format") != LORA_FORMAT:
        raise LaminaError(f"{d}: LoRA folder format {data.get('format')!r} is not {LORA_FORMAT}")
    config, tensors = read_adapters(d / ADAPTERS_FILE)
    if LoRAConfig.from_dict(data.get("lora"), f"{d / 'config.json'} lora") != config:
        raise LaminaError(f"{d}: config.json and {ADAPTERS_FILE} disagree about the LoRA config")
    return config, data.get("base"), tensors
