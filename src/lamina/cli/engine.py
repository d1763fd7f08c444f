"""What runs the model of `lamina chat` and `lamina sample`: the torch-free native runtime, or the
torch path (`lamina.open`).

    add_engine(parser)                            --engine auto|runtime|torch
    open_runtime(args, verb, path, needs_torch, cache_len=None) -> Runtime | None

`--engine auto` (the default) opens a GGUF file with `lamina.native.runtime.Runtime` where it
covers the file (`Runtime.uncovered`) and no flag given needs the torch path: decode.c alone,
no torch imported in the process, so the least memory. Otherwise the torch path runs it, and a
GGUF file gets one `lamina VERB: note:` line on stderr naming why (a folder, which the runtime
never reads, gets none). `--engine runtime` makes any such reason an error; `--engine torch`
takes the torch path without a note.

The runtime is chosen for every file it covers, K-quants included: it holds the least memory,
and its prompts run as bf16 GEMMs where the CPU has AVX-512 BF16 (BENCHMARKS.md, issue 31).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from lamina.errors import LaminaError
from lamina.native.gguf_read import is_gguf_file

if TYPE_CHECKING:
    from lamina.native.runtime import Runtime

ENGINES = ("auto", "runtime", "torch")


def add_engine(p: argparse.ArgumentParser) -> None:
    """--engine, one text for chat and sample."""
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="what runs the model: 'runtime' decodes a GGUF file with lamina's native runtime "
        "alone (no torch in the process: the least memory; plain Llama "
        "files), 'torch' opens it with lamina.open (every model and every flag); 'auto' (the "
        "default) takes the runtime where it covers the file and the flags, else the torch "
        "path, with one note on stderr saying why",
    )


def why_torch(path: str | os.PathLike[str], needs_torch: dict[str, bool]) -> str | None:
    """Why the runtime cannot run `path` with these flags (None: it can). `needs_torch` maps
    each flag as typed to whether it was given in a way only the torch path serves."""
    if not is_gguf_file(path):
        return "the native runtime reads GGUF files only"
    flags = [flag for flag, given in needs_torch.items() if given]
    if flags:
        return f"{', '.join(flags)} {'needs' if len(flags) == 1 else 'need'} the torch path"
    from lamina.native.runtime import Runtime

    why = Runtime.uncovered(path)
    return None if why is None else f"the native runtime does not cover this file: {why}"


def open_runtime(
    args: argparse.Namespace,
    verb: str,
    path: str | os.PathLike[str],
    needs_torch: dict[str, bool],
    cache_len: int | None = None,
) -> Runtime | None:
    """The runtime on `path` where `args.engine` and the file allow it, else None (the torch
    path; see the module docstring for the note and the errors)."""
    engine = getattr(args, "engine", "auto")
    if engine == "torch":
        return None
    why = why_torch(path, needs_torch)
    if why is None:
        from lamina.native.runtime import Runtime

        return Runtime.open(path, cache_len=cache_len)
    if engine == "runtime":
        raise LaminaError(f"--engine runtime: {why}")
    if is_gguf_file(path):
        print(f"lamina {verb}: note: the torch path runs the model: {why}", file=sys.stderr)
    return None
