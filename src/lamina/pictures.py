"""Pictures people would rather look at than read: attention grids and training curves.

    attention_grid(maps, labels, captions, *, layers=None, heads=None, title="", fmt="png")
        maps (L, H, T, T): rows are queries, columns keys; one heatmap per (layer, head), laid
        out as a grid of layers (rows) x heads (columns), the tokens as tick labels, each
        heatmap titled with its caption. -> PNG or SVG bytes.
    loss_curves(runs, *, fmt="png") -> bytes
        runs: [(name, metrics records)]; records with "loss" form a run's training curve,
        those with "val_loss" its validation curve; plotted against "step" (left) and against
        wall time, "elapsed" seconds (right), one colour per run; by_time=False: the left panel
        alone (a run's loss.png, redrawn at every evaluation: half the drawing time).

matplotlib's Agg backend through `Figure` objects, never pyplot: no global state, safe in any
process (a server, a test). Deliberately unaware of models, files and how the maps or captions
were found: it gets numbers and strings and returns bytes; the caller writes them.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from lamina.errors import LaminaError

FORMATS = ("png", "svg")


def _figure(width: float, height: float, dpi: int = 110) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _bytes(fig: Any, fmt: str) -> bytes:
    if fmt not in FORMATS:
        raise LaminaError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue()


def shown(label: str) -> str:
    """A token as a tick label: whitespace and control characters made visible."""
    out = label.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in out) or "\u2205"


def attention_grid(
    maps: Any,
    labels: Sequence[str],
    captions: Sequence[Sequence[str]],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str = "",
    fmt: str = "png",
) -> bytes:
    """Heatmaps of `maps` (L, H, T, T) for the chosen layers x heads -> image bytes.

    labels: T token labels; captions[l][h]: the line under each head's name (L x H, indexed by
    the true layer and head numbers); layers / heads: the indices to draw (default: all).
    """
    if getattr(maps, "ndim", 0) != 4 or maps.shape[-1] != maps.shape[-2]:
        raise LaminaError(f"maps must be (L, H, T, T), got {tuple(getattr(maps, 'shape', ()))}")
    L, H, T, _ = maps.shape
    if len(labels) != T:
        raise LaminaError(f"{len(labels)} labels for {T} tokens")
    layers = list(range(L)) if layers is None else list(layers)
    heads = list(range(H)) if heads is None else list(heads)
    for name, idx, n in (("layer", layers, L), ("head", heads, H)):
        bad = [i for i in idx if not 0 <= i < n]
        if bad or not idx:
            raise LaminaError(f"{name} index {bad[0] if bad else idx} is out of range 0..{n - 1}")
    cell = max(2.4, 0.075 * T)  # inches per heatmap: ~5 pt per token label
    font = max(3.5, min(8.0, 330.0 / max(T, 1)))
    height = cell * len(layers) + 0.9 + (0.4 if title else 0)
    fig = _figure(cell * len(heads) + 0.9, height, dpi=140 if T > 24 else 110)
    ticks = [shown(s) for s in labels]
    values = maps.float().cpu().numpy() if hasattr(maps, "float") else maps
    image = None
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = fig.add_subplot(len(layers), len(heads), r * len(heads) + c + 1)
            image = ax.imshow(
                values[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
            )
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(ticks, fontsize=font, rotation=90)
            ax.set_yticklabels(ticks, fontsize=font)
            ax.tick_params(length=0, pad=1)
            ax.set_title(
                f"layer {layer} head {head}\n{captions[layer][head]}", fontsize=max(font, 7)
            )
            if c == 0:
                ax.set_ylabel("query", fontsize=7)
            if r == len(layers) - 1:
                ax.set_xlabel("key", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if image is not None:
        bar = fig.colorbar(image, ax=fig.axes, shrink=0.5, pad=0.01, fraction=0.02)
        bar.ax.tick_params(labelsize=7)
        bar.set_label("attention weight", fontsize=7)
    return _bytes(fig, fmt)


def loss_curves(
    runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], *, fmt: str = "png", by_time: bool = True
) -> bytes:
    """Training (lines) and validation (markers) loss of each run, by step and by wall time
    (by_time=False: by step only, the one panel a run's own loss.png shows)."""
    if not runs:
        raise LaminaError("no runs to plot")
    fig = _figure(11.0, 4.4) if by_time else _figure(7.0, 4.2, dpi=100)
    by_step = fig.add_subplot(1, 2, 1) if by_time else fig.add_subplot(1, 1, 1)
    axes = [(by_step, "step")]
    if by_time:
        axes.append((fig.add_subplot(1, 2, 2), "wall time (s)"))
    colours = [f"C{i % 10}" for i in range(len(runs))]
    timed = False
    for (name, records), colour in zip(runs, colours, strict=True):
        for key, style, what in (("loss", "-", "train"), ("val_loss", "o--", "val")):
            pts = [r for r in records if key in r and "step" in r]
            if not pts:
                continue
            kw = dict(color=colour, linewidth=1.0, markersize=3, label=f"{name} {what}")
            if key == "loss":
                kw["alpha"] = 0.75
            by_step.plot([r["step"] for r in pts], [r[key] for r in pts], style, **kw)
            tpts = [r for r in pts if isinstance(r.get("elapsed"), (int, float))]
            if tpts and by_time:
                timed = True
                axes[1][0].plot([r["elapsed"] for r in tpts], [r[key] for r in tpts], style, **kw)
    for ax, xlabel in axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel("loss (nats per token)")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    by_step.set_title("loss by step", fontsize=10)
    if by_time:
        axes[1][0].set_title("loss by wall time" if timed else "no wall time recorded", fontsize=10)
    fig.tight_layout()
    return _bytes(fig, fmt)
