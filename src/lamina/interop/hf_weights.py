"""The weights of a Hugging Face folder, read into a lamina model's layout without a second copy.

    w = HFWeights.open(dir)        model.safetensors, a sharded model.safetensors.index.json, or
                                   pytorch_model.bin (torch.load(weights_only=True) only)
    w.names, w.shape(name), w.read(name, out=None, dtype=None)
    gather(w, plan, shapes, dtype, ignore, convert) -> state dict for `checkpoint.assign_state`
    load_hf_folder(dir, read_config, plan_of, ignore_of, dtype, quantize=None) -> GPT   built on
                                   the meta device, its tensors gathered and assigned (eval
                                   mode, CPU); quantize "int8"/"int4": each linear quantized as
                                   it is read (lamina.quant.on_read), no full fp32 copy held

A plan is one row per lamina tensor: (lamina name, HF names, transposed, rows of each part). The
HF tensors are
stacked along dim 0 (q | k | v into the fused qkv, gate | up into the fused feed-forward),
each read straight into its rows of the output; a transposed one (GPT-2's Conv1D) is read, then
copied transposed. Keys and shapes are checked against the plan and the model's shapes before
anything is read: a missing, unexpected or misshapen tensor is one LaminaError naming it.

Deliberately unaware of model families: hf_family writes the plans from the family records.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lamina.checkpoint import assign_state, strip_compiled_prefix, torch_load_refusal
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.interop.hf_config import check_hf_config
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tensorfile import TensorFile

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# (lamina name, HF names stacked on dim 0, transposed, rows of each HF tensor when several)
Plan = list[tuple[str, list[str], bool, list[int] | None]]


def _read_bin(path: Path) -> dict[str, Tensor]:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any failure to read (bad pickle, truncated zip, ...) is a refusal
        raise LaminaError(torch_load_refusal(path, e)) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise LaminaError(f"{path} does not hold a flat dict of tensors")
    return state


@dataclass
class HFWeights:
    """Where each tensor of a folder lives: a safetensors file (read on demand) or a tensor."""

    source: Path  # the file named in errors (the index for a sharded folder)
    files: dict[str, TensorFile | Tensor]  # name (compile prefix stripped) -> where it lives
    keys: dict[str, str]  # name -> the name in its file

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> HFWeights:
        d = Path(directory)
        for name in WEIGHT_FILES:
            path = d / name
            if path.is_file():
                break
        else:
            raise LaminaError(f"{d} has no weights: expected one of {', '.join(WEIGHT_FILES)}")
        if name == "pytorch_model.bin":
            tensors: dict[str, TensorFile | Tensor] = dict(_read_bin(path))
        elif name == "model.safetensors":
            f = TensorFile(path)
            tensors = dict.fromkeys(f.names, f)
        else:
            index = read_json(path)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
            if not shards or not all(isinstance(s, str) and "/" not in s for s in shards):
                raise LaminaError(f"{path} has no usable weight_map")
            tensors = {}
            for shard in shards:
                f = TensorFile(d / shard)
                tensors.update(dict.fromkeys(f.names, f))
        stripped = strip_compiled_prefix(dict.fromkeys(tensors, None))  # type: ignore[arg-type]
        keys = dict(zip(stripped, tensors, strict=True))
        return cls(path, {k: tensors[keys[k]] for k in keys}, keys)

    @property
    def names(self) -> list[str]:
        return list(self.files)

    def renamed(self, rename: Callable[[str], str]) -> HFWeights:
        """The same tensors under new names (e.g. GPT-2's optional `transformer.` prefix off)."""
        new = {rename(k): k for k in self.files}
        return HFWeights(self.source, {n: self.files[k] for n, k in new.items()},
                         {n: self.keys[k] for n, k in new.items()})  # fmt: skip

    def shape(self, name: str) -> tuple[int, ...]:
        f = self.files[name]
        return tuple(f.shape) if isinstance(f, Tensor) else f.shape(self.keys[name])

    def dtype(self, name: str) -> torch.dtype:
        f = self.files[name]
        return f.dtype if isinstance(f, Tensor) else f.dtype(self.keys[name])

    def read(
        self, name: str, out: Tensor | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        f = self.files[name]
        if isinstance(f, TensorFile):
            return f.read(self.keys[name], out, dtype)
        if out is not None:
            return out.copy_(f)
        return f if dtype is None else f.to(dtype)


def _listed(keys: list[str], limit: int = 8) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _part_shapes(
    shape: tuple[int, ...], transposed: bool, rows: list[int] | None
) -> list[tuple[int, ...]]:
    """What each HF tensor of a lamina tensor of `shape` must be."""
    if transposed:
        return [shape[::-1]]
    return [shape] if rows is None else [(n, *shape[1:]) for n in rows]


def _nbytes(weights: HFWeights, name: str) -> int:
    return math.prod(weights.shape(name)) * torch.empty(0, dtype=weights.dtype(name)).element_size()


def gather(
    weights: HFWeights,
    plan: Plan,
    shapes: dict[str, tuple[int, ...]],
    dtype: torch.dtype,
    ignore: Callable[[str], bool] = lambda name: False,
    convert: Callable[[str, Tensor], dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """The lamina state of `plan`, each tensor in `dtype`, checked against the model's `shapes`;
    `convert` (name, tensor) -> tensors is applied to each as soon as it is read."""
    where = str(weights.source)
    present = {n for n in weights.names if not ignore(n)}
    wanted = [hf for _, names, _, _ in plan for hf in names]
    missing = [hf for hf in wanted if hf not in present]
    unexpected = sorted(present - set(wanted))
    if missing or unexpected:
        parts = [f"missing {_listed(missing)}"] if missing else []
        parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
        raise LaminaError(f"{where} does not match its config.json: {'; '.join(parts)}")
    for ours, names, transposed, rows in plan:
        for hf, want in zip(names, _part_shapes(shapes[ours], transposed, rows), strict=True):
            if weights.shape(hf) != want:
                raise LaminaError(
                    f"{where}: tensor {hf} has shape {weights.shape(hf)}, config.json implies {want}"
                )
    # transposed tensors are read into one scratch buffer, then copied transposed: a temporary
    # per tensor would leave the allocator's heap full of holes (the peak well above the weights)
    sizes = [_nbytes(weights, names[0]) for _, names, transposed, _ in plan if transposed]
    scratch = torch.empty(max(sizes, default=0), dtype=torch.uint8)
    # with `convert`, every tensor is read into one reused buffer and converted from there, so
    # no float copy of the model is ever held; a tensor kept as it is gets copied out of it
    item = torch.empty(0, dtype=dtype).element_size()
    most = max((math.prod(shapes[ours]) for ours, *_ in plan), default=0)
    floats = torch.empty(most * item if convert is not None else 0, dtype=torch.uint8)

    def place(ours: str) -> Tensor:
        if convert is None:
            return torch.empty(shapes[ours], dtype=dtype)
        return floats[: math.prod(shapes[ours]) * item].view(dtype).view(shapes[ours])

    state: dict[str, Tensor] = {}
    for ours, names, transposed, _ in plan:
        if transposed:
            hf = names[0]
            n = _nbytes(weights, hf)
            raw = scratch[:n].view(weights.dtype(hf)).view(weights.shape(hf))
            t = place(ours).copy_(weights.read(hf, raw).t())
        elif len(names) == 1 and convert is None:
            t = weights.read(names[0], dtype=dtype)
        else:
            t, row = place(ours), 0
            for hf in names:
                n = weights.shape(hf)[0]
                weights.read(hf, out=t[row : row + n])
                row += n
        if convert is None:
            state[ours] = t
            continue
        for k, v in convert(ours, t).items():  # out of the reused buffer
            state[k] = v.clone() if v.data_ptr() == t.data_ptr() else v
    return state


def tied_head_as_embedding(weights: HFWeights, plan: Plan) -> HFWeights:
    """A tied model's one matrix stored under the head's name only (`lm_head.weight`, as
    safetensors' `save_model` keeps it: the first of the shared names) read as the embedding,
    as transformers reads it; anything else unchanged."""
    embed = next((names[0] for ours, names, _, _ in plan if ours == "embed.wte.weight"), None)
    present = set(weights.names)
    if embed is None or embed in present or "lm_head.weight" not in present:
        return weights
    return weights.renamed(lambda n: embed if n == "lm_head.weight" else n)


def load_hf_folder(
    path: str | os.PathLike[str],
    read_config: Callable[[object, str], GPTConfig],
    plan_of: Callable[[GPTConfig], Plan],
    ignore_of: Callable[[GPTConfig], Callable[[str], bool]],
    dtype: torch.dtype | None = None,
    rename: Callable[[str], str] | None = None,
    quantize: str | None = None,
) -> GPT:
    """A lamina GPT (eval mode, CPU, float32 unless `dtype`) from a Hugging Face folder:
    `read_config` turns its config.json into a GPTConfig, `plan_of` says which tensors make
    which, `ignore_of` which stored tensors are not weights (mask buffers, a tied head)."""
    d = Path(path)
    if not d.is_dir():
        raise LaminaError(f"no such Hugging Face model folder: {d}")
    where = str(d / "config.json")
    config = read_config(check_hf_config(read_json(d / "config.json"), where), where)
    weights = HFWeights.open(d)
    weights = weights.renamed(rename) if rename is not None else weights
    with torch.device("meta"):
        model = GPT(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    plan = plan_of(config)
    if config.tie_weights:
        weights = tied_head_as_embedding(weights, plan)
    convert = None
    if quantize is not None:
        if dtype not in (None, torch.float32):
            raise LaminaError(f"quantize={quantize!r} reads float32 weights, not {dtype}")
        from lamina.quant import on_read

        convert = on_read(model, quantize)
    state = gather(weights, plan, shapes, dtype or torch.float32, ignore_of(config), convert)
    assign_state(model, state, str(weights.source))
    return model.eval()
