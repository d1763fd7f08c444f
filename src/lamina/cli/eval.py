"""`lamina eval MODEL`: a run's validation loss, or any model on a task (lamina.evals).

Without --task (today's behaviour): loss per character and per token, perplexity, on the
validation split. The split is the last val_fraction of the text's characters
(`data.text_splits`), so nats per character (the split's total next-token loss / the
characters its scored tokens cover) compares models with different tokenizers. Windows are
block_size tokens (at most DEFAULT_WINDOW, 1024, for long-context models), and one forward
makes at most LOGITS_BUDGET logits (fewer windows per forward for a large vocabulary). `--json`
keys: run, data, loss (nats/token), perplexity, bits_per_char or bits_per_token, tokens, and
with text data loss_per_char, bits_per_char, chars. For a classifier: accuracy, macro-F1 and
per-class precision/recall on --data (a labelled file) or the run's validation split
(`lamina.cli.predict`).

With --task FILE|NAME: a multiple-choice task (a JSONL file, `lamina.evals.tasks`, or a built-in
one, `lamina.evals.builtin_tasks`) scored as lm-evaluation-harness scores it: acc and acc_norm with
standard errors, the chance baseline, items per second; `--json` keys: model, task, source,
items, chance, acc, acc_stderr, acc_norm, acc_norm_stderr, method, seconds, items_per_second.
A perplexity task (a JSONL of {"text"} lines, or `--task perplexity --data FILE` for a whole text
file or folder) reports nats per token, perplexity, nats per character, bits per byte.
`--output FILE` writes one JSON line per item (atomically): a choice item's context, choices,
gold, pred, pred_norm, logliks, tokens, acc, acc_norm and any other fields its line had.

The model is opened by `lamina.cli.open_for`, as every verb opens one: a model whose weights hold
NaN or infinity is refused in one line.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from lamina.cli import open_for
from lamina.cli.flags import add_keep_quantized
from lamina.files import to_json

DEFAULT_WINDOW = 1024  # window cap (tokens): a long-context model's full block is slow
LOGITS_BUDGET = 1 << 28  # floats of logits one forward may make (1 GiB in fp32)


def rows_per_forward(batch_size: int, window: int, vocab: int) -> int:
    """--batch-size, fewer where rows x window x vocab logits would pass LOGITS_BUDGET."""
    return max(1, min(batch_size, LOGITS_BUDGET // (window * vocab)))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a model: validation loss, multiple-choice tasks, perplexity",
        description="Without --task: score every token of the validation split (the last 10%% "
        "of the corpus's characters, cut before tokenizing, so every tokenizer is scored on "
        "the same text) with the model in MODEL, in consecutive block_size windows, and print "
        "the loss in nats per character, bits per character, nats per token and perplexity. "
        "With --task: a multiple-choice task (acc, acc_norm, scored as lm-evaluation-harness "
        "scores them) or a perplexity task (per token, per character, bits per byte).",
    )
    p.add_argument(
        "run",
        metavar="MODEL",
        help="a lamina run or model folder, a Hugging Face folder or a .gguf file",
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        help="text file or folder, or a `lamina prepare` folder (default: the data the run "
        "trained on); with --task perplexity: the text to score, whole",
    )
    p.add_argument(
        "--task",
        metavar="FILE|NAME",
        help="a task JSONL file (context/query, choices, gold per line; or text), a built-in "
        "task (next-line, which-play), or `perplexity` (with --data)",
    )
    p.add_argument("--limit", type=int, help="score only the first N items (built-in: draw N)")
    p.add_argument("--seed", type=int, default=0, help="built-in tasks: the draw (default: 0)")
    p.add_argument(
        "--delimiter",
        help="between context and choice (default: \" \", the built-in tasks' own; lm-eval's "
        "target_delimiter)",
    )
    p.add_argument(
        "--method",
        choices=["cache", "batch"],
        default="cache",
        help="cache: the context once per item, then its choices as one batch from the KV "
        "cache; batch: context + choice rows, several items per forward (default: cache)",
    )
    p.add_argument(
        "--window",
        type=int,
        help=f"perplexity: tokens per window (default: block_size, at most {DEFAULT_WINDOW})",
    )
    p.add_argument(
        "--stride",
        type=int,
        help="perplexity: tokens the window moves (default: window / 2; each scored token "
        "then has at least window / 2 tokens of context)",
    )
    p.add_argument("--output", metavar="FILE", help="write per-item predictions (JSONL) here")
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward (default: 32)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--text-column", help="classifier: the text column (default: the run's)")
    p.add_argument("--label-column", help="classifier: the label column (default: the run's)")
    add_keep_quantized(p, scoring=True)
    p.set_defaults(func=run)


def _unchanged(run: str, data: str | None, recorded: str | None, now: str) -> None:
    """Refuse to score a run on its training data when that data changed after training (its
    validation split would hold other text, maybe text it trained on)."""
    from lamina.errors import LaminaError

    if recorded is not None and recorded != now:
        where = data or "the built-in corpus"
        raise LaminaError(
            f"{where} has changed since {run} trained on it (fingerprint {recorded}, now {now}); "
            f"pass --data {data or 'PATH'} to score it as it is now"
        )


def run(args: argparse.Namespace) -> int:
    from lamina.errors import LaminaError

    if args.batch_size < 1:
        raise LaminaError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.limit is not None and args.limit < 1:
        raise LaminaError(f"--limit must be >= 1, got {args.limit}")
    if args.task is not None:
        return run_task(args)
    return run_validation(args)


# -- a task ------------------------------------------------------------------------------------
def _task(args: argparse.Namespace) -> Any:
    from lamina.errors import LaminaError
    from lamina.evals.builtin_tasks import BUILTIN_TASKS, builtin_task
    from lamina.evals.tasks import Task, read_task

    if args.task == "perplexity":
        from lamina.data.corpus import load_corpus

        if args.data is None:
            raise LaminaError("--task perplexity needs --data FILE (the text to score)")
        return Task(Path(args.data).name, "perplexity", texts=(load_corpus(args.data),),
                    source=str(args.data))  # fmt: skip
    if args.task in BUILTIN_TASKS and not Path(args.task).exists():
        task = builtin_task(args.task, args.limit, args.seed)
    else:
        task = read_task(args.task).limited(args.limit)
    if args.delimiter is not None:
        task = Task(task.name, task.kind, task.items, task.texts, task.source, task.about,
                    args.delimiter, task.meta)  # fmt: skip
    return task


def _bar(total: int, unit: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, disable=None, leave=False, ascii=True)


def run_task(args: argparse.Namespace) -> int:
    from lamina.errors import LaminaError

    for flag in ("window", "stride"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise LaminaError(f"--{flag} must be >= 1, got {value}")
    if args.output:  # the one output rule: never an input, checked before any work
        from lamina.files import check_output_file
        from lamina.interop.origin import model_inputs

        inputs = [("--task", args.task), ("--data", args.data)]
        check_output_file(args.output, inputs + model_inputs(args.run))  # every file it reads
    task = _task(args)  # the task first: a bad file fails before the model is read
    bundle = open_for(args.run, "eval", quantized=args.keep_quantized)
    model, tokenizer = bundle.model, bundle.tokenizer
    if task.kind == "perplexity":
        return _perplexity(args, task, model, tokenizer)
    return _choices(args, task, model, tokenizer)


def _choices(args: argparse.Namespace, task: Any, model: Any, tokenizer: Any) -> int:
    from lamina.evals.choice import accuracy, score_items

    started = time.perf_counter()
    with _bar(len(task), "item") as bar:
        scores = score_items(model, tokenizer, task.items, delimiter=task.delimiter,
                             method=args.method, progress=bar.update)  # fmt: skip
    seconds = time.perf_counter() - started
    result = {
        "model": str(args.run), "task": task.name, "source": task.source,
        "chance": task.chance, **accuracy(scores), "method": args.method,
        "seconds": round(seconds, 3), "items_per_second": len(scores) / seconds,
    }  # fmt: skip
    if args.output:
        rows = []
        for i, (item, s) in enumerate(zip(task.items, scores, strict=True)):
            extra = task.meta[i] if i < len(task.meta) else {}
            row = {
                "index": i, "context": item.context, "choices": list(item.choices),
                "gold": s.gold, "pred": s.pred, "pred_norm": s.pred_norm,
                "logliks": list(s.logliks), "tokens": list(s.tokens), "acc": s.acc,
                "acc_norm": s.acc_norm,
            }  # fmt: skip
            clash = {k: v for k, v in extra.items() if k in row}  # never over what was computed
            row |= {k: v for k, v in extra.items() if k not in row}
            rows.append(row | ({"task_fields": clash} if clash else {}))
        _write_jsonl(args.output, rows)
    if args.json:
        print(to_json(result))
        return 0
    about = f" ({task.about})" if task.about else ""
    print(f"{task.name}{about}: {result['items']:,} items from {task.source}")
    print(f"  chance    {task.chance:.4f}")
    print(f"  acc       {result['acc']:.4f} ± {result['acc_stderr']:.4f}")
    print(f"  acc_norm  {result['acc_norm']:.4f} ± {result['acc_norm_stderr']:.4f}")
    print(f"  {result['items_per_second']:.2f} items/s ({seconds:.1f} s, --method {args.method})")
    return 0


def _perplexity(args: argparse.Namespace, task: Any, model: Any, tokenizer: Any) -> int:
    from lamina.evals.perplexity import text_perplexity

    window = args.window or min(model.config.block_size, DEFAULT_WINDOW)
    started = time.perf_counter()
    with _bar(len(task.texts), "text") as bar:
        rows = rows_per_forward(args.batch_size, window, model.config.vocab_size)
        res = text_perplexity(model, tokenizer, task.texts, window=window, stride=args.stride,
                              batch_size=rows, progress=bar.update)  # fmt: skip
    stride = args.stride or max(1, window // 2)
    result = {
        "model": str(args.run), "task": task.name, "source": task.source, **res.as_dict(),
        "window": window, "stride": stride, "seconds": round(time.perf_counter() - started, 3),
    }  # fmt: skip
    if args.output:
        _write_jsonl(args.output, [{"index": i, **t.as_dict()} for i, t in enumerate(res.parts)])
    if args.json:
        print(to_json(result))
        return 0
    print(f"{task.name}: {res.texts:,} texts, {res.tokens:,} tokens scored, {res.chars:,} "
          f"characters, {res.bytes:,} bytes (window {window}, stride {stride})")  # fmt: skip
    print(
        f"  loss          {result['loss']:.4f} nats/token (perplexity {result['perplexity']:.3f})"
    )
    print(
        f"  per char      {result['loss_per_char']:.4f} nats ({result['bits_per_char']:.4f} bits)"
    )
    print(f"  bits/byte     {result['bits_per_byte']:.4f}")
    return 0


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    from lamina.files import atomic_write

    blob = "".join(to_json(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    atomic_write(path, lambda f: f.write(blob))
    print(f"lamina eval: {len(rows)} items -> {path}", file=sys.stderr)


# -- the validation split (no --task) ----------------------------------------------------------
def run_validation(args: argparse.Namespace) -> int:
    from lamina.data.builtin import corpus_text
    from lamina.data.corpus import encode_corpus
    from lamina.data.shards import is_prepared, open_prepared
    from lamina.data.text_splits import scored_chars, split_text
    from lamina.errors import LaminaError
    from lamina.evals.perplexity import split_loss, summary
    from lamina.models.encoder import SequenceClassifier
    from lamina.training.lm import text_fingerprint
    from lamina.training.registry import load_config
    from lamina.training.run_dir import RunDir
    from lamina.training.split_loss import val_line

    bundle = open_for(args.run, "eval", "model", quantized=args.keep_quantized)
    if isinstance(bundle.model, SequenceClassifier):
        from lamina.cli.predict import evaluate_classifier

        return evaluate_classifier(args, bundle)
    model, tokenizer = bundle.require("decoder", verb="eval").model, bundle.tokenizer
    val_fraction, data, recorded = 0.1, args.data, None
    train_cfg = Path(args.run) / "train_config.json"
    if train_cfg.is_file():
        whole = RunDir(args.run).read_train_config()
        saved = load_config(whole["train"])
        val_fraction = saved.val_fraction
        if data is None:
            data, recorded = saved.data, whole.get("data_fingerprint")
    if is_prepared(data):  # a `lamina prepare` folder: its own validation split, memory-mapped
        prep = open_prepared(data)
        if prep.tokenizer.to_dict() != tokenizer.to_dict():
            raise LaminaError(
                f"--data {data} was prepared with another tokenizer than {args.run}'s"
            )
        val, name, chars = prep.val[:], str(data), None  # the index has no val characters
        _unchanged(args.run, data, recorded, prep.fingerprint)
    else:
        text, name = corpus_text(data)
        _unchanged(args.run, data, recorded, text_fingerprint(text))
        _, val_text = split_text(text, val_fraction)  # the same characters for any tokenizer
        val = encode_corpus(tokenizer, val_text)
        chars = scored_chars(tokenizer, val_text, val)
    window = min(model.config.block_size, DEFAULT_WINDOW)
    rows = rows_per_forward(args.batch_size, window, model.config.vocab_size)
    loss, n = split_loss(model, val, window, rows)
    unit = "char" if getattr(tokenizer, "kind", "") == "char" else "token"
    result = {"run": str(args.run), "data": name, **summary(loss, n, unit, chars)}
    if args.json:
        print(to_json(result))
        return 0
    where = f"{n:,} tokens" + (f", {chars:,} characters" if chars else "")
    print(f"{result['data']}: validation split, {where}")
    if chars:
        print(f"  loss        {val_line({'loss': loss, 'loss_per_char': result['loss_per_char']})}")
    else:
        print(f"  loss        {loss:.4f} nats/token (per token only: a prepared folder's index "
              "does not record its validation characters)")  # fmt: skip
    print(f"  perplexity  {result['perplexity']:.3f} (per token)")
    print(f"  bits/token  {loss / math.log(2):.4f}")
    return 0
