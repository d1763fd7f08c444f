"""`lamina predict RUN "a text" | --input FILE [--output FILE]`: a classifier's labels, as JSONL.

One JSON object per text, in the input's order: {"text", "label", "probs": {label: p}}. Texts
come from the command line or from --input: a .jsonl (the --text-column field), a .csv/.tsv
(the --text-column column) or any other UTF-8 file, one text per non-empty line. A text longer
than the model's max_len is cut to fit, with one warning on stderr, never an error. --output is
written atomically: a failed run leaves no half-written file.

`evaluate_classifier` is `lamina eval RUN` for a classifier (lamina.cli.eval calls it): accuracy,
macro-F1 and per-class precision/recall on a labelled file, or on the run's validation split.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lamina.cli import open_for
from lamina.files import to_json

if TYPE_CHECKING:
    from lamina.interop.bundle import Bundle


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="label texts with a trained classifier (JSONL out)",
        description="Label texts with the classifier in RUN (`lamina train --task classify`): "
        "for each text, one JSON line with the text, its label and the probability of each "
        "label.",
    )
    p.add_argument("run", metavar="RUN", help="a run or model directory holding a classifier")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to label")
    p.add_argument(
        "--input",
        metavar="FILE",
        help=".jsonl, .csv/.tsv (the --text-column), or one text per line; - reads stdin",
    )
    p.add_argument("--output", metavar="FILE", help="write the JSONL here (default: stdout)")
    p.add_argument(
        "--text-column", default="text", help="CSV/TSV column or JSONL field (default: text)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward (default: 64)")
    p.set_defaults(func=run)


def load_classifier(run: str, bundle: Bundle | None = None) -> tuple[Any, Any, list[str]]:
    """(model, tokenizer, label names) of a classifier `lamina.open` reads (or of `bundle`,
    already opened); else an error."""
    bundle = (bundle or open_for(run, "predict", "classifier")).require("classifier")
    model, tokenizer = bundle.model, bundle.tokenizer
    labels = model.labels or [str(i) for i in range(model.classifier.out_features)]
    return model, tokenizer, labels


def read_texts(path: str, column: str) -> list[str]:
    """The texts of an --input file (see the module docstring)."""
    from lamina.data.labelled import _decode
    from lamina.errors import LaminaError

    p = Path(path)
    if path == "-":
        text = _decode(sys.stdin.buffer.read(), "stdin")
    elif not p.exists():
        raise LaminaError(f"--input {p}: no such file")
    elif p.is_dir():
        raise LaminaError(f"--input {p} is a folder: give a file (or - for stdin)")
    else:
        text = _decode(p.read_bytes(), str(p))
    suffix = p.suffix.lower()
    if suffix in (".csv", ".tsv", ".tab"):
        reader = csv.DictReader(
            io.StringIO(text, newline=""), delimiter="," if suffix == ".csv" else "\t"
        )
        if column not in (reader.fieldnames or []):
            cols = ", ".join(map(repr, reader.fieldnames or []))
            raise LaminaError(
                f"{p} has no column {column!r} (its columns: {cols}); use --text-column"
            )
        return [row[column] or "" for row in reader]
    if suffix in (".jsonl", ".ndjson"):
        from lamina.files import json_lines

        out = []
        for where, obj in json_lines(text, str(p)):
            if not isinstance(obj, dict) or not isinstance(obj.get(column), str):
                raise LaminaError(f"{where}: no string field {column!r}")
            out.append(obj[column])
        return out
    return [line for line in text.splitlines() if line.strip()]


def run(args: argparse.Namespace) -> int:
    from lamina.errors import LaminaError
    from lamina.files import atomic_write, check_output_file
    from lamina.training.classify import predict_proba

    if args.batch_size < 1:
        raise LaminaError(f"--batch-size must be >= 1, got {args.batch_size}")
    if bool(args.texts) == bool(args.input):
        raise LaminaError("give texts to label on the command line or --input FILE (one of them)")
    if args.output:
        from lamina.interop.origin import model_inputs

        inputs = [("--input", None if args.input == "-" else args.input)]
        check_output_file(args.output, inputs + model_inputs(args.run, "RUN"))
    texts = list(args.texts) if args.texts else read_texts(args.input, args.text_column)
    model, tokenizer, labels = load_classifier(args.run)
    probs, cut = predict_proba(model, tokenizer, texts, args.batch_size)
    if cut:
        print(
            f"lamina predict: warning: {cut} of {len(texts)} texts are longer than the model's "
            f"max_len ({model.config.max_len} tokens) and were cut to fit",
            file=sys.stderr,
        )
    lines = []
    for text, row in zip(texts, probs, strict=True):
        probs_by_label = {lab: round(float(p), 6) for lab, p in zip(labels, row, strict=True)}
        record = {"text": text, "label": labels[int(row.argmax())], "probs": probs_by_label}
        lines.append(to_json(record, ensure_ascii=False) + "\n")
    blob = "".join(lines)
    if args.output:
        data = blob.encode("utf-8")
        atomic_write(args.output, lambda f: f.write(data))
        print(f"lamina predict: {len(texts)} texts labelled -> {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(blob)
    return 0


def evaluate_classifier(args: argparse.Namespace, bundle: Bundle | None = None) -> int:
    """`lamina eval RUN [--data FILE]` for a classifier."""
    from lamina.data.labelled import read_labelled
    from lamina.errors import LaminaError
    from lamina.evals.classifier_scores import confusion, scores
    from lamina.training.classify import ClassifyOptions, load_splits, predict_proba
    from lamina.training.registry import load_config
    from lamina.training.run_dir import RunDir

    model, tokenizer, labels = load_classifier(args.run, bundle)
    saved = Path(args.run) / "train_config.json"
    whole = RunDir(args.run).read_train_config() if saved.is_file() else None
    cfg = load_config(whole["train"]) if whole is not None else None
    ours = cfg is not None and isinstance(cfg.options, ClassifyOptions)
    text_col = args.text_column or (cfg.options.text_column if ours else "text")
    label_col = args.label_column or (cfg.options.label_column if ours else "label")
    if args.data is not None:
        data = read_labelled(args.data, text_col, label_col)
    elif ours:
        data = load_splits(cfg)[1]
    else:
        raise LaminaError(f"{args.run} is a model folder without its run: pass --data FILE")
    index = {name: i for i, name in enumerate(labels)}
    for i, lab in enumerate(data.labels):
        if lab not in index:
            raise LaminaError(
                f"{data.source}: label {lab!r} (text {i + 1}) is not one the model knows "
                f"({', '.join(labels)})"
            )
    probs, cut = predict_proba(model, tokenizer, data.texts, args.batch_size)
    truth = [index[lab] for lab in data.labels]
    result: dict[str, Any] = {
        "run": str(args.run),
        "data": data.source,
        "texts": len(truth),
        "cut": cut,
        **scores(confusion(truth, probs.argmax(1), len(labels)), labels),
    }
    if args.json:
        print(to_json(result))
        return 0
    print(f"{data.source}: {len(truth):,} texts" + (f" ({cut:,} cut to fit)" if cut else ""))
    print(f"  accuracy  {result['accuracy']:.4f}")
    print(f"  macro-F1  {result['macro_f1']:.4f}")
    width = max(len(lab) for lab in labels)
    print(f"  {'label':<{width}}  precision  recall   texts")
    for i, lab in enumerate(labels):
        n = truth.count(i)
        p, r = result[f"precision/{lab}"], result[f"recall/{lab}"]
        print(f"  {lab:<{width}}  {p:9.4f}  {r:6.4f}  {n:6,}")
    return 0
