"""Text classification for the shared loop: `lamina train --task classify`.

    load_splits(cfg) -> (train LabelledTexts, val LabelledTexts)
        --data FILE (or the built-in genre task), then --val-data FILE or a stratified, seeded
        --val-fraction of it
    classify_tokenizer(spec, texts, run_path=None) -> Tokenizer
        "char" (with U+FFFD for characters never seen in training), "bpe:N" fit on the
        training texts, or a run/model folder or tokenizer.json to reuse
    encoder_config(cfg, vocab_size) -> EncoderConfig    --d-model etc. mapped onto the encoder
    ClassifyOptions   this task's own fields (--val-data, --text-column, --max-len, ...)
    build(cfg, run_path, model_cfg) -> Built     the objective, a seeded classifier, tokenizer
    ClassifyObjective the loop's objective (see `objectives.Objective`) over encoded texts
    finished(out, result, objective) -> str      what `lamina train` prints after a run
    predict_proba(model, tokenizer, texts, batch_size) -> (probabilities (N, K), number cut)
        batched in length order (little padding), answers in the input order

A batch is (ids (B, T), padding_mask (B, T), labels (B,)), padded to its longest text (ids and
the padding convention of `lamina.data.labelled`); the loss trims columns that are padding in
every row of its slice. Drawing is uniform with replacement from the training texts with the
task's own torch.Generator (saved for an exact resume); with `bucket`, a draw takes its n texts
from a random window of 8n neighbours in length order, so batches hold texts of similar length
and carry little padding. Evaluation covers the whole validation set in length-sorted batches:
loss (unweighted), accuracy, macro-F1 and per-class precision/recall, and keeps the confusion
matrix for `eval_files()` (confusion.png, written by the loop). `--class-weights balanced`
weighs each training text by n / (K * n_label), as a per-item factor in the batch mean, so the
loss still splits exactly over micro-batches and processes.

Deliberately unaware of optimizers, run directories and the command line.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.data.genre import genre_task
from lamina.data.labelled import (
    OFFSET,
    LabelledTexts,
    encode_texts,
    label_names,
    pad_batch,
    read_labelled,
    stratified_split,
)
from lamina.data.spec import build_tokenizer
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier
from lamina.modes import eval_mode
from lamina.tokenizers.kinds import CharTokenizer, Tokenizer, load_tokenizer
from lamina.training.classify_metrics import confusion, confusion_png, majority_baseline, scores
from lamina.training.config import TrainConfig
from lamina.training.defaults import option
from lamina.training.objectives import Batch, Built, rng_state, rng_text
from lamina.validate import boolean, choice

UNK = "\ufffd"
EVAL_BATCH = 64
BUCKET_WINDOW = 8
# EncoderConfig fields a --flag may set (max_len comes from --max-len, the vocabulary from the
# tokenizer, the padding id from lamina.data.labelled)
PoolingName = Literal["mean", "first", "last"]
ClassWeights = Literal["none", "balanced"]
ENCODER_FLAGS = ("d_model", "n_heads", "d_ff", "n_layers", "dropout", "norm_first",
                 "activation", "positions")  # fmt: skip


@dataclass(frozen=True)
class ClassifyOptions:
    """--task classify's own fields (each flag's help beside it)."""

    val_data: str | None = option(
        None,
        "classify: validation texts in a file of their own; sft: held-out chats or "
        "instructions in a file of their own (the formats of --data), scored on the assistant "
        "/ completion tokens; --val-fraction is then not taken from --data",
        metavar="PATH",
    )
    text_column: str = option(
        "text", "classify: CSV/TSV column or JSONL field of the text", metavar="NAME"
    )
    label_column: str = option("label", "classify: column or field of the label", metavar="NAME")
    max_len: int = option(
        256,
        "classify: tokens per text (with the classification token); longer texts are cut and "
        "counted",
        metavar="N",
    )
    pooling: PoolingName = option(
        "mean", "classify: mean of real tokens, the first ([CLS]) or the last real one"
    )
    class_weights: ClassWeights = option(
        "none", "classify: balanced weighs texts by n / (K * n_label)"
    )
    bucket: bool = option(False, "classify: batches of texts of similar length (less padding)")

    def __post_init__(self) -> None:
        choice("pooling", self.pooling, ("mean", "first", "last"))
        choice("class_weights", self.class_weights, ("none", "balanced"))
        boolean("bucket", self.bucket)
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, int) or self.max_len < 2:
            raise LaminaError(f"max_len must be an integer >= 2, got {self.max_len!r}")
        for name in ("text_column", "label_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise LaminaError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")


def _subset(data: LabelledTexts, idx: np.ndarray, source: str) -> LabelledTexts:
    return LabelledTexts([data.texts[i] for i in idx], [data.labels[i] for i in idx], source)


def load_splits(cfg: TrainConfig) -> tuple[LabelledTexts, LabelledTexts]:
    """The training and validation texts a config names."""
    o: ClassifyOptions = cfg.options
    cols = (o.text_column, o.label_column)
    data = genre_task() if cfg.data is None else read_labelled(cfg.data, *cols)
    label_names(data.labels, data.source)
    if o.val_data is not None:
        val = read_labelled(o.val_data, *cols)
        known = set(data.labels)
        for i, lab in enumerate(val.labels):
            if lab not in known:
                raise LaminaError(
                    f"{val.source}: label {lab!r} (text {i + 1}) appears only in the validation "
                    f"data; the training data's labels are {', '.join(sorted(known))}"
                )
        return data, val
    train_idx, val_idx = stratified_split(data.labels, cfg.val_fraction, cfg.seed)
    return (
        _subset(data, train_idx, data.source),
        _subset(data, val_idx, f"{data.source} (validation)"),
    )


def classify_tokenizer(spec: str, texts: list[str], run_path: Path | None = None) -> Tokenizer:
    """The tokenizer a spec names, fit on the training texts (see the module docstring)."""
    if run_path is not None and (run_path / "tokenizer.json").is_file():
        return load_tokenizer(run_path / "tokenizer.json")
    if spec == "char":  # the one kind a classifier builds its own way: unseen characters map to UNK
        return CharTokenizer.from_text("".join(texts), unk=UNK)
    return build_tokenizer(spec, "\n".join(texts))


def encoder_config(cfg: TrainConfig, vocab_size: int) -> EncoderConfig:
    """The encoder's shape: the seed's defaults (no dropout), --max-len and the given flags."""
    extra = sorted(set(cfg.model_overrides) - set(ENCODER_FLAGS))
    if extra:
        raise LaminaError(
            f"{', '.join('--' + k.replace('_', '-') for k in extra)} does not apply to the "
            f"classifier; its encoder takes {', '.join('--' + k.replace('_', '-') for k in ENCODER_FLAGS)}"
        )
    fields = {"dropout": 0.0, **cfg.model_overrides}
    if fields.get("d_ff") is None:
        fields.pop("d_ff", None)
    return EncoderConfig(vocab_size=vocab_size + OFFSET, max_len=cfg.options.max_len, **fields)


def fingerprint(train: LabelledTexts, val: LabelledTexts) -> str:
    """Counts and a CRC32 of every text and label, so a resume sees changed data."""
    crc = 0
    for part in (train, val):
        for text, label in zip(part.texts, part.labels, strict=True):
            crc = zlib.crc32(f"{label}\x1f{text}\x1e".encode("utf-8", "surrogatepass"), crc)
    return f"classify:{len(train)}+{len(val)}:{crc:08x}"


class ClassifyObjective:
    """Encoded training and validation texts with integer labels; see the module docstring."""

    def __init__(
        self,
        train: list[np.ndarray],
        train_y: np.ndarray,
        val: list[np.ndarray],
        val_y: np.ndarray,
        names: list[str],
        seed: int,
        *,
        class_weights: str = "none",
        bucket: bool = False,
    ) -> None:
        self.train, self.val, self.names = train, val, list(names)
        self.train_y = torch.as_tensor(train_y, dtype=torch.int64)
        self.val_y = torch.as_tensor(val_y, dtype=torch.int64)
        self.lengths = np.fromiter((len(s) for s in train), dtype=np.int64, count=len(train))
        self.tokens_per_item = max(1, int(round(float(self.lengths.mean()))))
        self.by_length = np.argsort(self.lengths, kind="stable")
        self.bucket = bucket
        self.gen = torch.Generator().manual_seed(seed)
        k = len(names)
        counts = np.bincount(np.asarray(train_y), minlength=k).astype(np.float64)
        self.weights: Tensor | None = None
        if class_weights == "balanced":
            w = np.divide(len(train_y), k * counts, out=np.zeros(k), where=counts > 0)
            self.weights = torch.tensor(w, dtype=torch.float32)
        self.baseline = majority_baseline(train_y, val_y)
        self.last_confusion: np.ndarray | None = None
        self._eval: list[Batch] | None = None
        self.truncated, self.max_len = 0, 0  # set by build

    def _batch(self, seqs: list[np.ndarray], labels: Tensor) -> Batch:
        ids, mask = pad_batch(seqs)
        return ids, mask, labels

    def draw(self, n: int) -> Batch:
        if self.bucket:
            window = min(len(self.train), BUCKET_WINDOW * n)
            start = int(torch.randint(len(self.train) - window + 1, (1,), generator=self.gen))
            pick = torch.randint(window, (n,), generator=self.gen).numpy()
            idx = self.by_length[start + pick]
        else:
            idx = torch.randint(len(self.train), (n,), generator=self.gen).numpy()
        return self._batch([self.train[i] for i in idx], self.train_y[idx])

    @staticmethod
    def trim(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Drop the columns that are padding in every row."""
        longest = int((~mask).sum(1).max())
        return ids[:, :longest], mask[:, :longest]

    def logits(self, model: nn.Module, batch: Batch) -> Tensor:
        ids, mask = self.trim(batch[0], batch[1])
        return model(ids, mask).float()

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        labels = batch[2]
        ce = F.cross_entropy(self.logits(model, batch), labels, reduction="none")
        if self.weights is not None:
            ce = ce * self.weights.to(ce.device)[labels]
        return ce.mean()

    def eval_batches(self) -> list[Batch]:
        if self._eval is None:
            order = sorted(range(len(self.val)), key=lambda i: len(self.val[i]))
            self._eval = [
                self._batch([self.val[i] for i in chunk], self.val_y[chunk])
                for chunk in (order[s : s + EVAL_BATCH] for s in range(0, len(order), EVAL_BATCH))
            ]
        return self._eval

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        total, n, preds, truth = 0.0, 0, [], []
        for b in batches:
            logits = self.logits(model, b)
            total += float(F.cross_entropy(logits, b[2], reduction="sum"))
            n += b[2].numel()
            preds.append(logits.argmax(-1).cpu())
            truth.append(b[2].cpu())
        self.last_confusion = confusion(torch.cat(truth), torch.cat(preds), len(self.names))
        return {"loss": total / max(n, 1), **scores(self.last_confusion, self.names)}

    def eval_files(self) -> dict[str, bytes]:
        """confusion.png for the last evaluation (the loop writes it into the run)."""
        if self.last_confusion is None:
            return {}
        acc = np.trace(self.last_confusion) / max(1, self.last_confusion.sum())
        title = f"validation: accuracy {acc:.1%} (majority baseline {self.baseline:.1%})"
        return {"confusion.png": confusion_png(self.last_confusion, self.names, title)}

    def state_dict(self) -> dict[str, Any]:
        return {"generator": rng_text(self.gen.get_state())}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.gen.set_state(rng_state(d["generator"]))

    def describe(self) -> str:
        cut = f"; {self.truncated:,} cut to --max-len {self.max_len}" if self.truncated else ""
        return (
            f"classify: {len(self.train):,} training / {len(self.val):,} validation texts, "
            f"{len(self.names)} labels ({', '.join(self.names[:8])}"
            f"{', ...' if len(self.names) > 8 else ''}){cut}; majority baseline "
            f"{self.baseline:.1%}"
        )


def build(cfg: TrainConfig, run_path: Path | None, model_cfg: dict[str, Any] | None) -> Built:
    """Read, split and encode the texts; build the objective and a seeded classifier."""
    o: ClassifyOptions = cfg.options
    if cfg.preset is not None:
        raise LaminaError(
            f"--preset {cfg.preset} names a GPT shape; the classifier's encoder is shaped with "
            "--d-model, --n-layers, --n-heads, --d-ff"
        )
    train, val = load_splits(cfg)
    names = label_names(train.labels, train.source)
    tok = classify_tokenizer(cfg.tokenizer, train.texts, run_path)
    ec = EncoderConfig.from_dict(model_cfg) if model_cfg else encoder_config(cfg, tok.vocab_size)
    if ec.vocab_size != tok.vocab_size + OFFSET:
        raise LaminaError(
            f"the encoder's vocabulary ({ec.vocab_size}) does not fit the tokenizer's "
            f"{tok.vocab_size} ids + {OFFSET}"
        )
    index = {name: i for i, name in enumerate(names)}
    train_seqs, cut = encode_texts(tok, train.texts, ec.max_len)
    val_seqs, cut_val = encode_texts(tok, val.texts, ec.max_len)
    objective = ClassifyObjective(
        train_seqs,
        np.array([index[lab] for lab in train.labels]),
        val_seqs,
        np.array([index[lab] for lab in val.labels]),
        names,
        cfg.seed,
        class_weights=o.class_weights,
        bucket=o.bucket,
    )
    objective.truncated, objective.max_len = cut + cut_val, ec.max_len
    torch.manual_seed(cfg.seed)
    model = SequenceClassifier(ec, n_classes=len(names), pooling=o.pooling)
    model.labels = list(names)
    return Built(objective, model, tok, fingerprint(train, val), ec.d_model)


def finished(out: str, result: dict[str, float], objective: ClassifyObjective) -> str:
    """What `lamina train` prints after a classifier's run, beside the validation line."""
    return (
        f"  accuracy {result['accuracy']:.1%} (majority baseline {objective.baseline:.1%}), "
        f"macro-F1 {result['macro_f1']:.3f}; confusion matrix: {out}/confusion.png\n"
        f'  predict: lamina predict {out} "some text"    evaluate: lamina eval {out} --data FILE'
    )


@torch.inference_mode()
def predict_proba(
    model: SequenceClassifier, tokenizer: Tokenizer, texts: list[str], batch_size: int = 64
) -> tuple[np.ndarray, int]:
    """Class probabilities (N, K) float64 for each text, and how many texts were cut to fit."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise LaminaError(f"--batch-size must be an integer >= 1, got {batch_size!r}")
    seqs, cut = encode_texts(tokenizer, texts, model.config.max_len)
    device = next(model.parameters()).device
    out = np.zeros((len(texts), model.classifier.out_features))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    with eval_mode(model):
        for s in range(0, len(order), batch_size):
            chunk = order[s : s + batch_size]
            ids, mask = pad_batch([seqs[i] for i in chunk])
            logits = model(ids.to(device), mask.to(device)).float()
            out[chunk] = torch.softmax(logits, -1).cpu().double().numpy()
    return out, cut
