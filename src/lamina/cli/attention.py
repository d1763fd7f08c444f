"""`lamina attention RUN --text "ROMEO: ..."`: a picture of every head's attention on a text.

    lamina attention RUN --text "ROMEO: But soft" [--layer L] [--head H] [--out maps.png]
        [--format png|svg] [--max-tokens 64]

One image: a grid of layers x heads, each a T x T heatmap (query rows, key columns, the tokens
as tick labels) captioned with the head's most typical pattern (`lamina.inspect.head_patterns`
documents the score). The same patterns are printed, one line per head. Texts longer than
--max-tokens (or the model's block_size) are cut to their first tokens, with a note.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lamina.cli import open_for
from lamina.errors import LaminaError

MAX_TOKENS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="draw each head's attention on a text as a grid of heatmaps",
        description="Run a text through a trained model and draw the attention weights of "
        "every layer and head (query rows, key columns) as one PNG or SVG, each head captioned "
        "with its most typical pattern (previous token, first token, same token, ...).",
    )
    p.add_argument(
        "run",
        metavar="MODEL",
        help="a lamina run or model folder, a Hugging Face folder, or a .gguf file",
    )
    p.add_argument(
        "--text",
        required=True,
        help="the text to look at (its tokens are the axes; '\\n' and '\\t' escapes understood)",
    )
    p.add_argument("--layer", type=int, default=None, help="draw only this layer (default: all)")
    p.add_argument("--head", type=int, default=None, help="draw only this head (default: all)")
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="image to write (default: RUN/attention.png, or .svg with --format svg)",
    )
    p.add_argument(
        "--format",
        choices=("png", "svg"),
        default=None,
        help="image format (default: from --out's suffix, else png)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"cut longer texts to their first N tokens, with a note (default: {MAX_TOKENS}; "
        "labels stay readable up to about 64)",
    )
    p.set_defaults(func=run)


def out_path(args: argparse.Namespace) -> tuple[Path, str]:
    """Where to write and in which format; a missing folder is an error."""
    fmt = args.format
    if args.out is None:
        out = Path(args.run) / f"attention.{fmt or 'png'}"
    else:
        out = Path(args.out)
        if fmt is None:
            fmt = out.suffix.lower().lstrip(".") if out.suffix.lower() in (".png", ".svg") else None
    from lamina.files import check_output_file

    if out.is_dir():
        raise LaminaError(f"--out {out} is a folder: give a file name, e.g. {out / 'maps.png'}")
    from lamina.interop.origin import model_inputs

    check_output_file(out, model_inputs(args.run, "RUN"), "--out")
    return out, fmt or "png"


def pick(name: str, value: int | None, n: int) -> list[int] | None:
    if value is None:
        return None
    if not 0 <= value < n:
        raise LaminaError(f"--{name} {value} is out of range: this model has {name}s 0..{n - 1}")
    return [value]


def run(args: argparse.Namespace) -> int:
    if args.max_tokens <= 0:
        raise LaminaError(f"--max-tokens must be positive, got {args.max_tokens}")
    out, fmt = out_path(args)
    from lamina.generation.prompts import encode_prompt
    from lamina.inspect import attention_maps, head_patterns, token_labels
    from lamina.pictures import attention_grid

    bundle = open_for(args.run, "attention")
    model, tokenizer = bundle.model, bundle.tokenizer
    config = model.config
    layers = pick("layer", args.layer, config.n_layers)
    heads = pick("head", args.head, config.n_heads)
    text = args.text.replace("\\n", "\n").replace("\\t", "\t")
    ids = encode_prompt(tokenizer, text, empty="error", what="text")
    limit = min(args.max_tokens, config.block_size)
    note = ""
    if len(ids) > limit:
        note = f"text cut to its first {limit} of {len(ids)} tokens"
        print(f"lamina attention: note: {note}", file=sys.stderr)
        ids = ids[:limit]
    maps = attention_maps(model, ids)
    labels = token_labels(tokenizer, ids)
    patterns = head_patterns(maps, ids, labels)
    captions = [[p.caption() for p in row] for row in patterns]
    title = f"{Path(args.run).name}: attention on {len(ids)} tokens"
    picture = attention_grid(
        maps,
        labels,
        captions,
        layers=layers,
        heads=heads,
        title=f"{title} ({note})" if note else title,
        fmt=fmt,
    )
    from lamina.files import atomic_write

    atomic_write(out, lambda f: f.write(picture))
    for row in patterns:
        for p in row:
            if (layers is None or p.layer in layers) and (heads is None or p.head in heads):
                print(f"layer {p.layer} head {p.head}: {p.caption()}")
    print(f"wrote {out}")
    return 0
