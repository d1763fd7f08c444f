"""`lamina eval RUN`: loss per character and per token, perplexity, on the validation split.

The validation split is the last val_fraction of the text's characters (`data.text_splits`), so
nats per character (the split's total next-token loss / the characters its scored tokens cover)
compares models with different tokenizers. `--json` keys: run, data, loss (nats/token),
perplexity, bits_per_char or bits_per_token, tokens, and with text data loss_per_char,
bits_per_char, chars.

For a classifier (`--task classify`): accuracy, macro-F1 and per-class precision/recall on
--data (a labelled file) or the run's validation split (`lamina.cli.predict`).

A model whose weights hold NaN or infinity is refused in one line (`lamina.modes.check_finite`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a trained model on the validation split of a corpus",
        description="Score every token of the validation split (the last 10%% of the corpus's "
        "characters, cut before tokenizing, so every tokenizer is scored on the same text) "
        "with the model in RUN, in consecutive block_size windows, and print the loss in nats "
        "per character (total loss / characters: comparable across tokenizers), bits per "
        "character, nats per token and perplexity. A `lamina prepare` folder has its own "
        "split: per token only.",
    )
    p.add_argument("run", metavar="RUN", help="a run or model directory")
    p.add_argument(
        "--data",
        metavar="PATH",
        help="text file or folder, or a `lamina prepare` folder (default: the data the run "
        "trained on)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward (default: 32)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--text-column", help="classifier: the text column (default: the run's)")
    p.add_argument("--label-column", help="classifier: the label column (default: the run's)")
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
    from lamina.data.builtin import corpus_text
    from lamina.data.corpus import encode_corpus
    from lamina.data.shards import is_prepared, open_prepared
    from lamina.data.text_splits import scored_chars, split_text
    from lamina.errors import LaminaError
    from lamina.interop.bundle import open_model
    from lamina.models.encoder import SequenceClassifier
    from lamina.models.gpt import GPT
    from lamina.modes import check_finite
    from lamina.training.lm import text_fingerprint
    from lamina.training.registry import load_config
    from lamina.training.run_dir import RunDir
    from lamina.training.split_loss import split_loss, summary, val_line

    if args.batch_size < 1:
        raise LaminaError(f"--batch-size must be >= 1, got {args.batch_size}")
    bundle = open_model(args.run)  # any model, a LoRA run's adapters applied on the fly
    model, tokenizer = bundle.model, bundle.tokenizer
    if isinstance(model, SequenceClassifier):
        from lamina.cli.predict import evaluate_classifier

        return evaluate_classifier(args)
    if not isinstance(model, GPT):
        raise LaminaError(f"{args.run} does not hold a language model (GPT)")
    check_finite(model, str(args.run))
    if tokenizer is None:
        raise LaminaError(f"{args.run} has no tokenizer.json; cannot encode text for it")
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
    loss, n = split_loss(model, val, model.config.block_size, args.batch_size)
    unit = "char" if getattr(tokenizer, "kind", "") == "char" else "token"
    result = {"run": str(args.run), "data": name, **summary(loss, n, unit, chars)}
    if args.json:
        print(json.dumps(result))
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
