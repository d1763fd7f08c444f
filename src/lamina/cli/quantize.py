"""`lamina quantize RUN --to int8 --out DIR`: a model folder with int8 or int4 weights.

The folder holds config.json (the model config and the scheme), model.safetensors (int8 or
packed int4 weights with their scales; norms, biases and untied embeddings in fp32) and the
tokenizer, and is read back by `lamina.load`, `lamina sample` and `lamina eval` without the
float weights. Nothing is written unless the whole folder is (`lamina.files.build_folder`:
built beside --out and swapped in; --force replaces only a folder lamina wrote).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lamina.cli import open_for
from lamina.errors import LaminaError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quantize",
        help="write a model folder with int8 or int4 weights (for faster, smaller sampling)",
        description="Quantize a trained run's or model folder's linear layers (attention, "
        "feed-forward and the head) to int8 (a scale per output row) or int4 (a scale and "
        "zero per group of inputs), weight-only, and write a model folder that lamina sample "
        "and lamina eval read without the float weights. Prints the size on disk.",
    )
    p.add_argument(
        "run",
        metavar="MODEL",
        help="a lamina run or model folder, a Hugging Face folder or a .gguf file (float weights)",
    )
    p.add_argument(
        "--to",
        dest="scheme",
        required=True,
        choices=["int8", "int4"],
        help="int8: ~1/4 of fp32 on disk, loss within ~1%%; int4: ~1/7, a larger loss",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (must be new)")
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        choices=[32, 64, 128, 256],
        help="int4 only: inputs per scale and zero (default: the largest that divides every "
        "layer's width)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out if lamina wrote it, once the new folder is complete (default: refuse)",
    )
    p.set_defaults(func=run)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def run(args: argparse.Namespace) -> int:
    from lamina.checkpoint import save_model
    from lamina.files import build_folder, check_output_folder
    from lamina.interop.origin import model_inputs
    from lamina.quant import quantize, scheme_of

    source, out = Path(args.run), Path(args.out)
    inputs = model_inputs(source, "RUN")
    check_output_folder(out, force=args.force, inputs=inputs)
    bundle = open_for(source, "quantize", tokenizer=False)
    model, tokenizer = bundle.model, bundle.tokenizer
    if scheme_of(model) is not None:
        raise LaminaError(f"{source} is already quantized ({scheme_of(model)['scheme']})")
    quantize(model, args.scheme, group_size=args.group_size)
    build = lambda d: save_model(d, model, tokenizer)  # noqa: E731
    build_folder(out, build, kind="model", force=args.force, inputs=inputs)
    before = sum(f.stat().st_size for f in bundle.origin.files if f.suffix != ".json")
    after = (out / "model.safetensors").stat().st_size
    print(
        f"wrote {out} ({args.scheme}; weights {after / 2**20:.1f} MiB, "
        f"{after / before:.0%} of {before / 2**20:.1f} MiB; folder {_size(out) / 2**20:.1f} MiB)"
    )
    return 0
