"""Classification metrics from a confusion matrix, and the matrix as a PNG.

    confusion(y_true, y_pred, n_classes) -> (K, K) int64    rows: true label, columns: predicted
    scores(conf, names) -> {"accuracy", "macro_f1", "precision/<name>", "recall/<name>"}
    majority_baseline(train_labels, val_labels) -> float    accuracy of always answering the
                                                            most common training label
    confusion_png(conf, names, title) -> PNG bytes

Precision of a class no text was predicted as, and recall of a class absent from the data, are
0 (scikit-learn's `zero_division=0`); macro-F1 is the unweighted mean of the per-class F1 over
all K classes. The PNG uses matplotlib's Agg backend without pyplot's global state, as
`lamina.pictures` does.

Deliberately unaware of models, tensors and files.
"""

from __future__ import annotations

import io
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


def confusion_png(conf: np.ndarray, names: Sequence[str], title: str = "confusion") -> bytes:
    """The matrix as a heat map with counts, rows normalised for colour (recall per class)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    k = len(names)
    side = min(12.0, 2.5 + 0.5 * k)
    fig = Figure(figsize=(side + 1.0, side), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    rows = conf.sum(1, keepdims=True)
    shade = np.divide(conf, rows, out=np.zeros(conf.shape), where=rows > 0)
    image = ax.imshow(shade, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true label")
    ax.set_xticks(range(k), labels=list(names), rotation=45, ha="right")
    ax.set_yticks(range(k), labels=list(names))
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                colour = "white" if shade[i, j] > 0.5 else "black"
                ax.text(j, i, str(int(conf[i, j])), ha="center", va="center", color=colour)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
