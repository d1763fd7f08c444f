"""The `lamina` command: one module per verb, each with `register(subparsers)`.

Model specs of models already on disk (`hf:ORG/NAME`, `ollama:NAME[:TAG]`, `wheel:NAME`) in
any verb's model argument are resolved to paths before the verb runs (`resolve_model_specs`).
Errors from bad input (`LaminaError`, files that cannot be read or written) become one line on
stderr and exit status 2, without a traceback; Ctrl-C exits with 130. A `LaminaWarning` is one
line, `lamina VERB: warning: ...`. Output that cannot be written is handled once, here, for
every verb: a closed pipe (`lamina sample ... | head -c 10`) ends the command quietly with
status 141 (as a tool killed by SIGPIPE); any other failure to write stdout (`> /dev/full`) is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lamina.errors import LaminaError, LaminaWarning
from lamina.files import mute_stream

if TYPE_CHECKING:
    from lamina.interop.bundle import Bundle

# verb modules in the order `lamina --help` lists them (tests/test_cli_foundation.py holds each
# one to a module of this package)
VERBS = [
    "train",
    "prepare",
    "sample",
    "chat",
    "eval",
    "predict",
    "check",
    "count",
    "task",
    "convert",
    "quantize",
    "merge",
    "models",
]
VERBS += ["lessons", "attention", "plot", "serve"]  # the last three: looking inside a model
BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool killed by a closed pipe


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb; with `verb`, of that verb alone (the others' modules, and what
    they import, are then never loaded: `lamina chat` on the native runtime imports no torch)."""
    from lamina.version import __version__

    parser = argparse.ArgumentParser(
        prog="lamina",
        description="Transformers built layer by layer: train, sample, check and count models.",
    )
    parser.add_argument("--version", action="version", version=f"lamina {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name in VERBS if verb is None else [verb]:
        importlib.import_module(f"lamina.cli.{name}").register(sub)
    return parser


def verb_named(argv: list[str]) -> str | None:
    """The verb a command line names (its first word that is not an option), if lamina has it;
    None for `lamina --help`, `lamina --version` or an unknown verb (argparse lists them all)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in VERBS else None
    return None


# the arguments that name a model to open, in every verb (MODEL, RUN, SOURCE, --init-from)
MODEL_ARGS = ("model", "run", "source", "init_from")


def resolve_model_specs(args: argparse.Namespace) -> None:
    """Replace a model spec (hf:ORG/NAME, ollama:NAME[:TAG], wheel:NAME) in any model argument
    by the path it names on disk, so that every verb, and its checks of inputs against outputs,
    sees a path; plain paths are left as they are. Nothing is downloaded."""
    from lamina.interop.discover import SCHEMES, resolve

    for name in MODEL_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.partition(":")[0] in SCHEMES:
            setattr(args, name, str(resolve(value)))


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before any work, a place that cannot be written (`lamina.files.check_writable`)."""
    from lamina.files import check_writable as probe

    probe(path, flag)


def open_for(
    source: str | os.PathLike[str],
    verb: str,
    needs: Literal["decoder", "classifier", "model"] = "decoder",
    *,
    tokenizer: bool = True,
    device: str = "cpu",
    quantized: bool | str | None = False,
) -> Bundle:
    """The one way a verb opens its model: `lamina.open(source)` (`quantized` passed through),
    then what the verb needs (`Bundle.require`: a decoder, a classifier or either, and a
    tokenizer unless `tokenizer=False`), then finite weights (`lamina.modes.check_finite`).
    Each refusal is one LaminaError naming `source` and, for a missing kind, `verb`.
    `quantized=None` (a verb that only runs the model: lamina.open's own choice, a GGUF's
    blocks kept where a kernel runs them), True or "int8"/"int4" also print one note where
    PyTorch will run the decode step (`flags.note_kernel`); False (the default) opens float
    weights, for a verb that changes them."""
    from lamina.interop.bundle import open_model
    from lamina.modes import check_finite

    bundle = open_model(source, device=device, quantized=quantized)
    bundle.require(needs, tokenizer=tokenizer, verb=verb)
    trained_here = bundle.origin.kind == "run"
    advice = (
        "it was saved after training diverged: retrain with a lower --lr"
        if trained_here
        else "the file is damaged or was written from a model that had diverged: use another "
        "copy of the model"
    )
    check_finite(bundle.model, str(source), advice=advice)
    if quantized is not False:
        from lamina.cli.flags import note_kernel

        note_kernel(verb, bundle.model)
    return bundle


class OutputFailed(OSError):
    """Writing to stdout failed: `error` is the OSError (BrokenPipeError for a closed pipe).

    An OSError itself, so code below the CLI that already survives a broken stream (training's
    progress lines switch themselves off and training goes on) treats it as one."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.error = error


class GuardedStdout:
    """sys.stdout as the verbs see it: a failed write or flush raises `OutputFailed`, so it is
    told apart from a failure to write a file (which names the file)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except OSError as e:
            raise OutputFailed(e) from e
        except UnicodeEncodeError as e:  # e.g. PYTHONIOENCODING=ascii and a non-ASCII sample
            bad = e.object[e.start : e.end]
            why = f"its encoding {e.encoding} has no {bad!r} (set PYTHONIOENCODING=utf-8)"
            raise OutputFailed(OSError(errno.EILSEQ, why)) from e

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as e:
            raise OutputFailed(e) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ClosedStdout:
    """Stands in for a missing sys.stdout (started with `>&-`): every write fails."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self) -> None:
        pass


def _say(line: str) -> None:
    """One line on stderr (if stderr itself is gone there is no one to tell)."""
    with contextlib.suppress(Exception):
        print(line, file=sys.stderr)


def _describe(exc: OSError) -> str:
    what = exc.strerror or str(exc) or type(exc).__name__
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    return f"{what}: {' -> '.join(map(str, names))}" if names else what


def main(argv: list[str] | None = None) -> int:
    real_stdout = sys.stdout
    sys.stdout = GuardedStdout(ClosedStdout() if real_stdout is None else real_stdout)
    name = "lamina"  # "lamina VERB" once the verb is known
    try:
        words = sys.argv[1:] if argv is None else argv
        args = build_parser(verb_named(words)).parse_args(argv)  # --help, --version: stdout
        args.own_process = argv is None  # the command line of this process (not a caller's)
        name = f"lamina {args.verb}"
        resolve_model_specs(args)
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(name, warnings.showwarning)
            warnings.simplefilter("always", LaminaWarning)
            code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except LaminaError as exc:
        _say(f"{name}: error: {exc}")
        return 2
    except OutputFailed as exc:
        mute_stream(real_stdout)
        if isinstance(exc.error, BrokenPipeError):  # the reader went away (| head): say nothing
            return BROKEN_PIPE
        _say(f"{name}: error: cannot write the output: {exc.error.strerror or exc.error}")
        return 2
    except OSError as exc:
        _say(f"{name}: error: {_describe(exc)}")
        return 2
    except KeyboardInterrupt:
        _say(f"{name}: interrupted")
        return 130
    finally:
        if isinstance(sys.stdout, GuardedStdout):
            sys.stdout = real_stdout


def _warning_printer(name: str, default: Callable[..., None]) -> Callable[..., None]:
    """warnings.showwarning that prints a LaminaWarning as `lamina VERB: warning: ...`."""

    def show(message: Any, category: type, *rest: Any) -> None:
        if issubclass(category, LaminaWarning):
            _say(f"{name}: warning: {message}")
        else:
            default(message, category, *rest)

    return show
