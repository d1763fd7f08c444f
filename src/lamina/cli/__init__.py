"""The `lamina` command: one module per verb, each with `register(subparsers)`.

Errors from bad input (`LaminaError`, missing files) become one line on stderr and exit
status 2, without a traceback; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lamina.errors import LaminaError

# verb modules in the order `lamina --help` lists them (tests/test_cli_foundation.py holds each
# one to a module of this package)
VERBS = ["train", "sample", "eval", "predict", "check", "count", "task", "convert", "quantize",
         "lessons"]  # fmt: skip
VERBS += ["attention", "plot", "serve"]  # looking inside a model


def build_parser() -> argparse.ArgumentParser:
    from lamina.version import __version__

    parser = argparse.ArgumentParser(
        prog="lamina",
        description="Transformers built layer by layer: train, sample, check and count models.",
    )
    parser.add_argument("--version", action="version", version=f"lamina {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb in VERBS:
        importlib.import_module(f"lamina.cli.{verb}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (LaminaError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        msg = str(exc) if isinstance(exc, LaminaError) else f"{exc.strerror or exc}: {exc.filename}"
        print(f"lamina {args.verb}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lamina {args.verb}: interrupted", file=sys.stderr)
        return 130
