"""Command-line flags from dataclass fields: types and choices read from the annotations.

    field_flag(tp) -> argparse keywords      int, float, str, `X | None`, bool, Literal[...]
    add_config_overrides(parser)             --n-layers, --activation {gelu,relu}, --no-bias,
                                             ... for every GPTConfig field (a helper, not a verb)
    config_overrides(args) -> dict           the GPTConfig fields typed on this command line
    add_keep_quantized(parser)               --keep-quantized, one text for sample, chat, serve
    add_sampling(parser, temperature, seed)  --temperature --top-k --top-p --seed (sample, chat)

Flags default to None, so a command can tell which were typed. A `Literal` field offers exactly
its choices (argparse refuses anything else), a bool gets `--x` / `--no-x`, and `int | None`
takes an int (leaving it out keeps the config's value); a small dataclass (rope_scaling) takes
a JSON object of its fields, e.g. '{"kind": "linear", "factor": 2}', and a tuple of strings
(layer_types) a comma-separated list, e.g. sliding,full. A field of any other type is a
TypeError when the parser is built, so a new config field cannot go without a flag unnoticed.

Deliberately unaware of what the fields mean: the config validates the values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Any, Literal


def field_flag(tp: Any) -> dict[str, Any]:
    """argparse keywords for a field annotated `tp` (resolved, e.g. by typing.get_type_hints)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"no command-line flag for a field of type {tp}")
        tp = rest[0]
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(tp) is Literal:
        options = typing.get_args(tp)
        return {"type": type(options[0]), "choices": list(options)}
    if tp in (int, float, str):
        return {"type": tp}
    if dataclasses.is_dataclass(tp):
        return {"type": _json_object}
    if typing.get_origin(tp) is tuple and typing.get_args(tp) == (str, ...):
        return {"type": _comma_list}
    raise TypeError(f"no command-line flag for a field of type {tp}")


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_config_overrides(p: argparse.ArgumentParser) -> None:
    """--n-layers, --d-model, ... and --no-qkv-bias style flags for every GPTConfig field."""
    from lamina.models.config import GPTConfig

    g = p.add_argument_group("config overrides (default: the preset's value)")
    hints = typing.get_type_hints(GPTConfig)
    for f in dataclasses.fields(GPTConfig):
        kw = field_flag(hints[f.name])
        if "action" not in kw and "choices" not in kw:
            kw["metavar"] = f.name.upper()
        g.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            help=f"override {f.name}",
            **kw,
        )


def add_sampling(p: argparse.ArgumentParser, temperature: float, seed_help: str) -> None:
    """The sampling flags, with this verb's default temperature and meaning of the seed."""
    p.add_argument(
        "--temperature",
        type=float,
        default=temperature,
        help=f"0 is greedy; higher is more random (default: {temperature:g})",
    )
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="keep the nucleus of mass p")
    p.add_argument("--seed", type=int, default=None, help=seed_help)


def add_keep_quantized(p: argparse.ArgumentParser, scoring: bool = False) -> None:
    """--keep-quantized (the default) and --dequantize, into args.keep_quantized: None (the
    default: lamina.open's choice), True or False. `scoring` (lamina eval, whose scores are held
    to references that run fp32): --dequantize is the default instead."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--keep-quantized",
        action="store_const",
        const=True,
        default=False if scoring else None,
        help="a GGUF file's quantized weights stay as the file holds them ("
        + ("less memory and faster, but the scores then differ from fp32 references such as "
           "lm-eval's; BENCHMARKS.md, Evaluation)" if scoring else
           "the default wherever a kernel runs them here: less memory, and with lamina.native "
           "faster than fp32, logits within 1e-4 of it; figures in BENCHMARKS.md)"),
    )  # fmt: skip
    g.add_argument(
        "--dequantize",
        dest="keep_quantized",
        action="store_const",
        const=False,
        help="dequantize a GGUF file's weights to fp32 on load (the exact float values; more "
        "memory, slower)" + ("; the default" if scoring else ""),
    )


def note_kernel(verb: str, model: object) -> None:
    """One `lamina VERB: note:` line where the decode step will not run natively by default
    (lamina.native cannot run here, or does not cover this model), naming why."""
    import sys

    import lamina.cpu as cpu
    from lamina.models.gpt import GPT
    from lamina.native import unsupported

    if cpu.choice() != "auto" or not isinstance(model, GPT):
        return  # the user chose the kernel; or no decode step
    why = cpu.native_missing()
    if why is None:
        uncovered = unsupported(model)
        why = uncovered and f"lamina.native does not cover this model ({uncovered})"
    if why:
        print(f"lamina {verb}: note: PyTorch runs the decode step: {why}", file=sys.stderr)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The GPTConfig fields given on the command line (flags left out are absent)."""
    from lamina.models.config import GPTConfig

    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(GPTConfig)
        if getattr(args, f.name, None) is not None
    }
