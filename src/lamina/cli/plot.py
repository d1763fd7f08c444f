"""`lamina plot RUN [RUN2 ...] --out curves.png`: training curves of several runs, overlaid.

Reads each RUN/metrics.jsonl (one JSON object per line, as training writes it: records with
"loss" or "val_loss", "step" and "elapsed" seconds) and draws train (lines) and validation
(markers) loss against steps and against wall time, one colour per run, so that two recipes
can be compared at a glance. A line that is not JSON (a run still writing) is skipped.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lamina.errors import LaminaError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="overlay the training and validation loss of runs, by step and by wall time",
        description="Draw the loss curves of one or more run directories (their "
        "metrics.jsonl) into one PNG or SVG: loss by step on the left, by wall time on the "
        "right, one colour per run.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories written by lamina train")
    p.add_argument(
        "--out", default="curves.png", metavar="PATH", help="image to write (default: curves.png)"
    )
    p.add_argument(
        "--format",
        choices=("png", "svg"),
        default=None,
        help="image format (default: from --out's suffix, else png)",
    )
    p.set_defaults(func=run)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl that carry a loss (read through the run's schema,
    `run_dir.METRIC`: a string loss is an error naming the line; a null one, a step that
    diverged, is left out); a run without any is an error."""
    from lamina.training.run_dir import RunDir

    path = Path(run_dir) / "metrics.jsonl"
    if not Path(run_dir).is_dir():
        raise LaminaError(f"no such run directory: {run_dir}")
    if not path.is_file():
        raise LaminaError(f"{run_dir} has no metrics.jsonl: is it a run written by lamina train?")
    records = []
    for rec in RunDir(run_dir).read_metrics():
        rec = {k: v for k, v in rec.items() if v is not None}
        if "loss" in rec or "val_loss" in rec:
            records.append(rec)
    if not records:
        raise LaminaError(f"{path} holds no loss records")
    return records


def summary_line(name: str, records: list[dict[str, Any]]) -> str:
    """`name: N steps, last train L val V` for one run's checked records."""
    train = [r["loss"] for r in records if "loss" in r]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    last = [f"train {train[-1]:.4f}" if train else "", f"val {val[-1]:.4f}" if val else ""]
    return f"{name}: {max(r['step'] for r in records)} steps, last {' '.join(filter(None, last))}"


def run_names(runs: list[str]) -> list[str]:
    """Short names for the legend: the folder names, with parents where two are the same."""
    names = [Path(r).resolve().name for r in runs]
    if len(set(names)) < len(names):
        names = [str(Path(r)) for r in runs]
    return names


def run(args: argparse.Namespace) -> int:
    from lamina.files import atomic_write, check_output_file

    out = Path(args.out)
    check_output_file(out, [("RUN", Path(r) / "metrics.jsonl") for r in args.runs], "--out")
    fmt = args.format or (out.suffix.lower().lstrip(".") if out.suffix.lower() == ".svg" else "png")
    runs = [
        (name, read_metrics(r)) for name, r in zip(run_names(args.runs), args.runs, strict=True)
    ]
    from lamina.pictures import loss_curves

    picture = loss_curves(runs, fmt=fmt)
    atomic_write(out, lambda f: f.write(picture))
    for name, records in runs:
        print(summary_line(name, records))
    print(f"wrote {out}")
    return 0
