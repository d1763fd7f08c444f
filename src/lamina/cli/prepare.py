"""`lamina prepare DATA --tokenizer SPEC --out DIR`: a corpus of any size -> token shards.

Streams DATA (a file, or a folder searched recursively for .txt / .jsonl, gzip or not) through
the tokenizer in batches, writing shards and an index that `lamina train --data DIR` and
`lamina eval --data DIR` read through memory maps. Progress bars show MB/s and the time left;
the last line sums it up. Bad input (a broken .jsonl line, a gzip file cut short, a full disk)
is one line and exit status 2, with nothing left behind.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="tokenize a corpus of any size into shards that train reads through memory maps",
        description="Tokenize DATA (a text file, or a folder searched recursively for .txt and "
        ".jsonl files with a 'text' field; .gz decompressed on the fly) into token shards with "
        "a JSON index, without holding the corpus in memory. Pass the folder to "
        "`lamina train --data` or `lamina eval --data`.",
    )
    p.add_argument("data", metavar="DATA", help="a file or folder of .txt / .jsonl (.gz)")
    p.add_argument(
        "--tokenizer",
        default="char",
        metavar="SPEC",
        help="char, byte, bpe:N, gpt2:DIR, or a tokenizer.json / model or run folder whose "
        "tokenizer to use (for fine-tuning; default: char)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="fraction held out for validation (default: 0.1)",
    )
    p.add_argument(
        "--val-by",
        choices=["tail", "documents"],
        default="tail",
        help="hold out the last F of the tokens (as `lamina train` splits raw text) or F of "
        "the documents (default: tail)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens per shard file (default: 2**28)",
    )
    p.add_argument(
        "--fit-mb",
        type=float,
        default=32.0,
        metavar="MB",
        help="bpe:N is trained on a sample of at most this much text (default: 32)",
    )
    p.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip .jsonl lines that are not JSON or have no 'text' string (counted)",
    )
    p.add_argument("--force", action="store_true", help="replace --out if it holds files")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _bars(quiet: bool) -> Any:
    bars: list[Any] = []

    def make(stage: str, total: int) -> Any:
        if quiet:
            return None
        from tqdm import tqdm

        for b in bars:
            b.close()
        bar = tqdm(
            total=total,
            desc=stage,
            unit="B",
            unit_scale=True,
            unit_divisor=1000,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        bars.append(bar)
        return bar.update

    make.close = lambda: [b.close() for b in bars]  # type: ignore[attr-defined]
    return make


def run(args: argparse.Namespace) -> int:
    from lamina.data.shard_build import SHARD_TOKENS, prepare_corpus
    from lamina.errors import LaminaError

    if not 0.0 <= args.val_fraction < 1.0:
        raise LaminaError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.fit_mb <= 0:
        raise LaminaError(f"--fit-mb must be positive, got {args.fit_mb}")
    bars = _bars(args.quiet)
    try:
        s = prepare_corpus(
            args.data,
            args.tokenizer,
            args.out,
            val_fraction=args.val_fraction,
            val_by=args.val_by,
            shard_tokens=args.shard_tokens or SHARD_TOKENS,
            skip_bad_lines=args.skip_bad_lines,
            fit_bytes=int(args.fit_mb * 1e6),
            force=args.force,
            progress=bars,
        )
    finally:
        bars.close()
    rate = s["input_bytes"] / 1e6 / max(s["encode_seconds"], 1e-9)
    skipped = f", {s['bad_lines_skipped']:,} bad lines skipped" if s["bad_lines_skipped"] else ""
    print(
        f"lamina prepare: {s['documents']:,} documents, {s['characters']:,} characters, "
        f"{s['tokens']:,} tokens in {len(s['shards'])} shards, {s['seconds']:.1f} s "
        f"(encoding {rate:.1f} MB/s){skipped}; wrote {args.out}"
    )
    return 0
