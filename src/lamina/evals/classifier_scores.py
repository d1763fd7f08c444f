"""Classifier metrics from a confusion matrix (what `lamina eval` reports for a classifier).

    confusion(y_true, y_pred, n_classes) -> (K, K) int64    rows: true label, columns: predicted
    per_class(conf) -> (precision, recall, f1), each (K,)
    scores(conf, names) -> {"accuracy", "macro_f1", "precision/<name>", "recall/<name>"}
    majority_baseline(train_labels, val_labels) -> float    accuracy of always answering the
                                                            most common training label

Precision of a class no text was predicted as, and recall of a class absent from the data, are
0 (scikit-learn's `zero_division=0`); macro-F1 is the unweighted mean of the per-class F1 over
all K classes. (The matrix as a PNG stays with training, beside the run's other pictures.)

Deliberately unaware of models, tensors and files.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def confusion(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int) -> np.ndarray:
    """Counts of (true, predicted) pairs as a (n_classes, n_classes) int64 matrix."""
    t = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(y_pred, dtype=np.int64)
    return np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(
        n_classes, n_classes
    )


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(len(num)), where=den > 0)


def per_class(conf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, f1), each (K,)."""
    tp = np.diag(conf).astype(np.float64)
    precision = _ratio(tp, conf.sum(0).astype(np.float64))
    recall = _ratio(tp, conf.sum(1).astype(np.float64))
    f1 = _ratio(2 * precision * recall, precision + recall)
    return precision, recall, f1


def scores(conf: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """Accuracy, macro-F1 and per-class precision / recall (keys "precision/<name>", ...)."""
    total = int(conf.sum())
    precision, recall, f1 = per_class(conf)
    out = {
        "accuracy": float(np.trace(conf)) / total if total else 0.0,
        "macro_f1": float(f1.mean()),
    }
    for i, name in enumerate(names):
        out[f"precision/{name}"] = float(precision[i])
        out[f"recall/{name}"] = float(recall[i])
    return out


def majority_baseline(train_labels: Sequence[int], val_labels: Sequence[int]) -> float:
    """The validation accuracy of always answering the most common training label."""
    train = np.asarray(train_labels, dtype=np.int64)
    val = np.asarray(val_labels, dtype=np.int64)
    if not len(val):
        return 0.0
    return float((val == np.bincount(train).argmax()).mean())
