"""The confusion matrix as a PNG, beside the metrics (from `lamina.evals.classifier_scores`, their one home).

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

from lamina.evals.classifier_scores import confusion, majority_baseline, per_class, scores

__all__ = ["confusion", "confusion_png", "majority_baseline", "per_class", "scores"]


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
