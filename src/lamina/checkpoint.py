"""Model directories: `config.json` + `model.safetensors` (+ `tokenizer.json`), written atomically.

    save_model(dir, model, tokenizer=None)   -> dir/config.json, dir/model.safetensors, ...
    load_model(dir, device, dtype) -> (model, tokenizer or None)   (also exported as `lamina.load`)
    assign_state(meta_model, state, where)   the one way a stored model gets its tensors
    check_device(name) -> torch.device                   a device this machine can compute on

A SequenceClassifier's label names (`model.labels`, class id = index) go to `labels.json`
with the classifier's id convention (`lamina.data.labelled.CLASSIFIER_IDS`) and come back as
`model.labels` (None where the file is absent).

Loading builds the model on the meta device and assigns the stored tensors (read one by one
into their own memory, `lamina.tensorfile`): no random weights are made first and no second
copy is held, so opening a model costs about its weight bytes. Buffers that are computed rather
than stored (the sinusoidal table) are computed after the assignment. Tied weights are stored
once (the head is re-tied on load); the `_orig_mod.` prefix that
`torch.compile` adds is stripped on save and on load. Loading never unpickles: safetensors and
JSON only. A missing, unexpected or wrongly shaped tensor is an error naming the key. Saving
onto a file, or a device name this machine cannot use, is a `LaminaError` before anything is
written or loaded.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor, nn

import lamina.quant as quant
from lamina.data.labelled import CLASSIFIER_IDS
from lamina.errors import LaminaError
from lamina.files import atomic_write, read_json, write_json
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.models.encoder import Encoder, SequenceClassifier
from lamina.models.gpt import GPT
from lamina.tensorfile import TensorFile, read_tensors
from lamina.tokenizers.kinds import Tokenizer, load_tokenizer, save_tokenizer

FORMAT_VERSION = 1
COMPILED_PREFIX = "_orig_mod."


def strip_compiled_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove `torch.compile`'s `_orig_mod.` prefix from every key (wherever it appears)."""
    return {k.replace(COMPILED_PREFIX, ""): v for k, v in state.items()}


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind torch.compile / DDP / FSDP wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not isinstance(inner, nn.Module):
            return model
        model = inner


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """State dict for saving: prefixes stripped, tied head dropped, contiguous CPU tensors."""
    model = unwrap(model)
    if quant.scheme_of(model) is not None:
        return quant.quantized_tensors(model)
    state = strip_compiled_prefix(model.state_dict())
    config = getattr(model, "config", None)
    if isinstance(config, GPTConfig) and config.tie_weights:
        state.pop("head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_tensors(
    path: str | os.PathLike[str], tensors: dict[str, Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Atomic safetensors write."""
    blob = st_save(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(blob))


def load_tensors(
    path: str | os.PathLike[str], dtype: torch.dtype | None = None
) -> dict[str, Tensor]:
    """Read a safetensors file (floating tensors cast to `dtype` if given); a truncated or
    corrupt file is a LaminaError naming it."""
    return read_tensors(path, dtype)


def model_to_json(model: nn.Module) -> dict[str, Any]:
    """The config.json of a GPT, an Encoder or a SequenceClassifier."""
    config = getattr(model, "config", None)
    if isinstance(model, SequenceClassifier):
        return {
            "format": FORMAT_VERSION,
            "kind": "classifier",
            "model": config.to_dict(),
            "n_classes": model.classifier.out_features,
            "pooling": model.pooling,
        }
    if isinstance(config, (GPTConfig, EncoderConfig)):
        kind = "gpt" if isinstance(config, GPTConfig) else "encoder"
        data = {"format": FORMAT_VERSION, "kind": kind, "model": config.to_dict()}
        scheme = quant.scheme_of(model)
        return data | ({"quantization": scheme} if scheme is not None else {})
    raise LaminaError("save_model needs a lamina GPT, Encoder or SequenceClassifier")


def config_from_json(data: Any, where: str = "config.json") -> tuple[str, Any]:
    """(kind, GPTConfig or EncoderConfig) of a config.json, checked; nothing is built."""
    if not isinstance(data, dict) or "model" not in data or "kind" not in data:
        raise LaminaError(f"{where} is not a lamina model config (no 'kind' and 'model' fields)")
    fmt = data.get("format", 1)
    if isinstance(fmt, bool) or not isinstance(fmt, int):
        raise LaminaError(f"{where}: 'format' must be an integer, got {fmt!r}")
    if fmt > FORMAT_VERSION:
        raise LaminaError(f"{where} has format {fmt}; this lamina reads up to {FORMAT_VERSION}")
    kind = data["kind"]
    if kind not in ("gpt", "encoder", "classifier"):
        raise LaminaError(f"{where}: unknown model kind {kind!r}")
    cls = GPTConfig if kind == "gpt" else EncoderConfig
    try:
        return kind, cls.from_dict(data["model"])
    except TypeError as e:  # a required field missing: the dataclass's own words
        raise LaminaError(f"{where}: 'model' is not a valid {cls.__name__} ({e})") from None


def model_from_json(data: Any, where: str = "config.json") -> nn.Module:
    """Build the (untrained) model that a config.json describes."""
    kind, config = config_from_json(data, where)
    if kind == "gpt" and "quantization" in data:
        return _quantized_gpt(config, data["quantization"], where)
    if kind == "gpt":
        return GPT(config)
    if kind == "encoder":
        return Encoder(config)
    return SequenceClassifier(config, data.get("n_classes", 2), data.get("pooling", "first"))


def _check_param_count(config: Any, data: dict[str, Any], stored: int, where: Path) -> None:
    """Refuse a config.json that describes far more parameters than the weights hold, before
    building the model: a corrupt or foreign config.json must not allocate terabytes (what is
    built stays within 64x the tensors' bytes). Smaller mismatches are named tensor by tensor by
    `load_state`."""
    from lamina.models.params import count_params

    try:
        n = count_params(config)
    except Exception:  # a config kind the formula does not cover: the shapes are checked later
        return
    n_classes = data.get("n_classes", 0)
    if isinstance(n_classes, int) and not isinstance(n_classes, bool) and n_classes > 0:
        n += n_classes * (config.d_model + 1)
    if n > 16 * stored + 4096:  # 16 parameters per byte: room for any packing (int4 is 2)
        raise LaminaError(
            f"{where / 'config.json'} describes a model of {n:,} parameters, but "
            f"{where / 'model.safetensors'} holds only {stored:,} bytes of tensors: they do not "
            "belong together"
        )


def _quantized_gpt(config: GPTConfig, scheme: Any, where: str) -> GPT:
    """An empty quantized GPT on the meta device: no float weights are ever allocated."""
    if not isinstance(scheme, dict) or not isinstance(scheme.get("scheme"), str):
        raise LaminaError(f"{where}: 'quantization' must be an object with a 'scheme' field")
    with torch.device("meta"):
        model = GPT(config)
    return quant.quantize_structure(model, scheme["scheme"], scheme.get("group_size", 128))


def _checked(
    model: nn.Module, state: dict[str, Tensor], where: str
) -> tuple[nn.Module, dict[str, Tensor], dict[str, Tensor], bool]:
    """(plain model, state, expected tensors, quantized): keys and shapes checked strictly, a
    tied head left out of both."""
    state = strip_compiled_prefix(state)
    model = unwrap(model)
    expected = model.state_dict()
    config = getattr(model, "config", None)
    scheme = quant.scheme_of(model)
    quantized = scheme is not None
    if isinstance(config, GPTConfig) and config.tie_weights:
        # a tied head is stored once, as the token table (an int4 head is a copy of its own)
        tied = {None: ("head.weight",), "int8": ("head.qweight", "head.scale"), "int4": ()}[
            scheme and scheme["scheme"]
        ]
        expected = {k: v for k, v in expected.items() if k not in tied}
        state = {k: v for k, v in state.items() if k not in tied}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        raise LaminaError(f"{where} does not match the model: {'; '.join(parts)}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise LaminaError(
                f"{where}: tensor {k} has shape {tuple(v.shape)}, the model expects {tuple(expected[k].shape)}"
            )
        if quantized and v.dtype != expected[k].dtype:
            raise LaminaError(
                f"{where}: tensor {k} is {v.dtype}, the quantized model expects {expected[k].dtype}"
            )
    return model, state, expected, quantized


def load_state(model: nn.Module, state: dict[str, Tensor], where: str = "checkpoint") -> None:
    """Copy `state` into `model` strictly: missing, unexpected or misshapen keys are errors.
    (A model on the meta device, or a quantized one, gets the tensors assigned instead.)"""
    inner, state, expected, quantized = _checked(model, state, where)
    if quantized or any(t.is_meta for t in expected.values()):
        assign_state(inner, state, where)
        return
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(state[name])


def assign_state(model: nn.Module, state: dict[str, Tensor], where: str = "checkpoint") -> None:
    """Give a model built on the meta device the tensors of `state`, taken as they are (no
    copy): keys and shapes checked as `load_state` does, a tied head re-tied, computed buffers
    (sinusoidal tables, quantized kernels' tensors) computed."""
    model, state, _, quantized = _checked(model, state, where)
    model.load_state_dict(state, strict=False, assign=True)
    config = getattr(model, "config", None)
    if quantized:
        quant.finish_loading(model)
    elif isinstance(config, GPTConfig) and config.tie_weights:
        model.embed.tie_lm_head(model.head)
    for module in model.modules():
        init = getattr(module, "init_buffers", None)
        if callable(init):
            init()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise LaminaError(f"{where} left tensors without data: {', '.join(left[:8])}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip() or type(e).__name__).splitlines()[0]


def check_device(device: str | torch.device) -> torch.device:
    """The torch device named `device`, if this machine can put tensors on it; else LaminaError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise LaminaError(
            f"unknown device {str(device)!r}: expected cpu, cuda, cuda:N or mps"
        ) from None
    if dev.type == "meta":
        raise LaminaError("device 'meta' holds no data: choose cpu, cuda, cuda:N or mps")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise LaminaError(
                f"device {str(device)!r}: CUDA is not available here (a CPU-only torch, or no "
                "GPU); use cpu"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise LaminaError(f"device {str(device)!r}: this machine has {count} CUDA device(s)")
    try:
        torch.empty(0, device=dev)
    except Exception as e:  # each backend fails its own way (AssertionError, NotImplementedError)
        raise LaminaError(f"device {str(device)!r} is not usable here ({_first_line(e)})") from None
    return dev


def torch_load_refusal(path: str | os.PathLike[str], error: BaseException) -> str:
    """One line saying why `torch.load(path, weights_only=True)` failed, without torch's advice
    to retry with weights_only=False (that would run whatever code the pickle names)."""
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in text:
        _, _, detail = text.partition("WeightsUnpickler error:")
        detail = next((ln.strip() for ln in detail.splitlines() if ln.strip()), "")
        detail = detail.split(". ")[0].rstrip(".") or "an object that is not a tensor"
        return (
            f"{path} refused: a pickle that does not hold plain tensors only ({detail}); "
            "lamina never runs code from a pickle. If you trust its source, re-save it as "
            "safetensors in a separate, disposable environment (e.g. transformers' "
            "save_pretrained(dir, safe_serialization=True)) and convert that folder"
        )
    first = _first_line(error).split(". ")[0].rstrip(".")
    return f"{path} refused: not a readable PyTorch weights file ({first})"


def _make_folder(d: Path) -> None:
    if d.exists() and not d.is_dir():
        raise LaminaError(f"cannot save a model to {d}: it is a file, not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LaminaError(f"cannot create the folder {d}: {e.strerror or e}") from None


def save_model(
    directory: str | os.PathLike[str], model: nn.Module, tokenizer: Tokenizer | None = None
) -> Path:
    """Write config.json, model.safetensors and (if given) tokenizer.json into `directory`."""
    d = Path(directory)
    inner = unwrap(model)
    if getattr(inner, "lora", None) is not None:  # lamina.lora records its config there
        raise LaminaError(
            "this model has LoRA adapters: merge them first (lamina.lora.merge_lora, or "
            "`lamina merge`), or save the adapters alone (interop.adapters.save_lora_folder)"
        )
    config_json = model_to_json(inner)  # not a lamina model: refused before any folder is made
    _make_folder(d)
    try:
        save_tensors(d / "model.safetensors", model_tensors(inner), {"format": "pt"})
        if tokenizer is not None:
            save_tokenizer(tokenizer, d / "tokenizer.json")
        if isinstance(inner, SequenceClassifier) and inner.labels is not None:
            write_json(d / "labels.json", {"labels": list(inner.labels), **CLASSIFIER_IDS})
        write_json(d / "config.json", config_json)  # last: its presence marks a complete model
    except OSError as e:  # a full disk, a read-only folder: the temp file is already removed
        raise LaminaError(f"cannot write the model into {d}: {e.strerror or e}") from None
    return d


def load_model(
    directory: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[nn.Module, Tokenizer | None]:
    """Rebuild the model (and its tokenizer, if saved) from a directory written by `save_model`:
    built on the meta device, its tensors assigned as read; a float model's tensors are cast
    to `dtype` (default float32) as they are read (a quantized model keeps its own)."""
    d = Path(directory)
    device = check_device(device)
    if d.exists() and not d.is_dir():
        raise LaminaError(f"{d} is a file; a model is a folder (config.json, model.safetensors)")
    if not d.is_dir():
        raise LaminaError(f"no such model directory: {d}")
    if not (d / "config.json").is_file():
        raise LaminaError(f"{d} is not a lamina model or run directory (no config.json)")
    data = read_json(d / "config.json")
    _, config = config_from_json(data, str(d / "config.json"))
    weights = TensorFile(d / "model.safetensors")
    _check_param_count(config, data, weights.nbytes(), d)
    with torch.device("meta"):
        model = model_from_json(data, str(d / "config.json"))
    cast = None if quant.scheme_of(model) is not None else (dtype or torch.float32)
    assign_state(model, read_tensors(weights.path, cast), str(weights.path))
    tokenizer = load_tokenizer(d / "tokenizer.json") if (d / "tokenizer.json").is_file() else None
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise LaminaError(
            f"{d / 'tokenizer.json'} has {tokenizer.vocab_size:,} ids, more than the model's "
            f"vocab_size {config.vocab_size:,}: they do not belong together"
        )
    if isinstance(model, SequenceClassifier) and (d / "labels.json").is_file():
        model.labels = _labels(read_json(d / "labels.json"), model, d / "labels.json")
    model.eval()
    return model.to(device), tokenizer


def _labels(data: Any, model: SequenceClassifier, where: Path) -> list[str]:
    """The label names of a labels.json, checked against the classifier's classes."""
    labels = data.get("labels") if isinstance(data, dict) else None
    n = model.classifier.out_features
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise LaminaError(f"{where} has no 'labels' list of strings")
    if len(labels) != n:
        raise LaminaError(f"{where} names {len(labels)} labels; the classifier has {n} classes")
    return labels
