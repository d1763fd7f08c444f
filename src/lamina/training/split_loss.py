"""An evaluation in words, and the whole-split scoring a run's validation and `lamina eval` share.

    split_loss, summary       from `lamina.evals.perplexity`, the one home of scoring (re-exported
                              here for the training code that reports them)
    val_line(result) -> "1.6540 nats/char (2.3862 bits/char; 2.9500 nats/token)", with
                         "± se" after a figure whose standard error the result carries

Deliberately unaware of optimizers, training runs and files.
"""

from __future__ import annotations

import math

from lamina.evals.perplexity import split_loss, summary

__all__ = ["split_loss", "summary", "val_line"]


def val_line(result: dict[str, float]) -> str:
    """An evaluation in words: "1.6540 nats/char (2.3862 bits/char; 2.9500 nats/token)" where
    the per-character figure is known, else "loss 2.9500" (and any other metric after it,
    except per-class keys holding "/")."""
    loss = result["loss"]
    own = ("loss", "loss_per_char", "loss_se", "loss_per_char_se")
    shown = (k for k in result if k not in own and "/" not in k)
    rest = [f"{k} {result[k]:.4f}" for k in shown]  # "x/y" keys: per-class detail, not shown
    if "loss_per_char" not in result:
        se = f" ± {result['loss_se']:.4f}" if "loss_se" in result else ""
        return "  ".join([f"loss {loss:.4f}{se}", *rest])
    per_char = result["loss_per_char"]
    se = f" ± {result['loss_per_char_se']:.4f}" if "loss_per_char_se" in result else ""
    return "  ".join(
        [
            f"{per_char:.4f}{se} nats/char ({per_char / math.log(2):.4f} bits/char; "
            f"{loss:.4f} nats/token)",
            *rest,
        ]
    )
