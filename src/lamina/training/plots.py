"""loss.png: training and validation loss against step, rendered to PNG bytes.

    loss_plot(records) -> bytes
        records: metrics.jsonl entries; those with "loss" form the training curve, those with
        "val_loss" the validation curve (markers).

Uses matplotlib's Agg backend without touching pyplot's global state, so it is safe in any
process. Deliberately unaware of files: the caller writes the bytes atomically.
"""

from __future__ import annotations

import io
from typing import Any


def loss_plot(records: list[dict[str, Any]], title: str = "lamina training") -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if train:
        ax.plot(*zip(*train, strict=True), label="train", linewidth=1.0, alpha=0.8)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
